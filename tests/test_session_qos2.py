"""QoS 2 with a persistent session across a reconnect (issue 29, a case its tests missed):
exactly the messages published while the consumer was away arrive, each once, in order,
none lost; against real mosquitto, the outage cut at the byte seam by a relay."""

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


def _read_until(client: Client, last: bytes) -> list[Message]:
    got: list[Message] = []
    while not got or got[-1].payload != last:
        item = client.next_message(30)
        assert isinstance(item, Message), f"{item!r} after {[m.payload for m in got][-3:]}"
        got.append(item)
    return got


def test_qos2_messages_published_while_away_arrive_exactly_once(
    broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("qos2")
    relay = Relay(broker.port)
    client_id = f"c-{uuid.uuid4().hex[:8]}"
    try:
        with (
            Client(relay.url, client_id=client_id, session_expiry=600, discovery_wait=0) as sub,
            Client(broker.url, discovery_wait=0) as producer,
        ):
            sub.subscribe(topic, qos=2)
            before = [f"before-{i}".encode() for i in range(10)]
            for payload in before:
                producer.publish(topic, payload, qos=2)
            assert [m.payload for m in _read_until(sub, before[-1])] == before
            conn = sub.connection
            relay.cut()
            _until(lambda: not conn.connected, "the consumer saw the outage")
            away = [f"away-{i}".encode() for i in range(30)]
            for payload in away:
                producer.publish(topic, payload, qos=2)  # returns once the broker has it
            relay.resume()
            producer.publish(topic, b"end", qos=2)
            got = _read_until(sub, b"end")
            assert conn.session_present and conn.connections >= 2
    finally:
        relay.close()
    assert [m.payload for m in got] == [*away, b"end"]  # nothing lost, nothing twice
    assert {m.qos for m in got} == {2}
