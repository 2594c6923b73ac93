"""The Will Delay Interval (`will_delay`, MQTT 5) against real mosquitto: the Will is sent
only once the delay has passed after the connection was lost, and not at all when the
client reconnects within it (the session resumed). The outage is cut by a relay at the
byte seam; the client itself keeps running and retrying."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from client import Client, Message

from _relay import Relay
from _servers import Mosquitto

pytestmark = pytest.mark.servers


def _until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def _with_will(url: str, topic: str, delay: int) -> Client:
    # The Will is sent at the earlier of the delay and the end of the session: a session
    # that outlives the delay.
    return Client(
        url,
        client_id=f"w-{uuid.uuid4().hex[:8]}",
        session_expiry=600,
        will_topic=topic,
        will_payload=b"gone",
        will_qos=1,
        will_delay=delay,
        discovery_wait=0,
    )


def test_the_will_is_sent_only_after_the_delay(
    broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("will/delay")
    delay = 3
    relay = Relay(broker.port)
    try:
        with Client(broker.url, discovery_wait=0) as watcher:
            watcher.subscribe(topic, qos=1)
            with _with_will(relay.url, topic, delay) as client:
                relay.cut()  # the broker sees the connection end now; the client stays out
                lost = time.monotonic()
                will = watcher.next_message(timeout=delay + 30)
                came = time.monotonic()
                assert not client.connection.connected
    finally:
        relay.close()
    assert isinstance(will, Message) and will.payload == b"gone"
    # Not before the delay (mosquitto counts whole seconds, so up to one early).
    assert came - lost >= delay - 1, f"the Will came {came - lost:.1f} s after, delay {delay}"


def test_the_will_is_not_sent_when_the_client_reconnects_within_the_delay(
    broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("will/back")
    delay = 5
    relay = Relay(broker.port)
    try:
        with Client(broker.url, discovery_wait=0) as watcher:
            watcher.subscribe(topic, qos=1)
            with _with_will(relay.url, topic, delay) as client:
                conn = client.connection
                before = conn.connections
                relay.cut()
                lost = time.monotonic()
                _until(lambda: not conn.connected, "the client saw the outage")
                relay.resume()
                _until(lambda: conn.connected and conn.connections > before, "reconnected")
                assert time.monotonic() - lost < delay, "reconnected too late for this test"
                _until(lambda: time.monotonic() > lost + delay + 1.5, "the delay has passed")
                with Client(broker.url, discovery_wait=0) as marker:
                    marker.publish(topic, b"marker", qos=1)
                first = watcher.next_message(timeout=30)
    finally:
        relay.close()
    assert isinstance(first, Message) and first.payload == b"marker", first
