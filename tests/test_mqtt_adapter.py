"""The one MQTT adapter in both of its modes, through a real broker restart.

The client keeps MQTT's session semantics (an unacknowledged QoS 1 publish goes out after the
reconnect); the gateway's link fails it at once and never sends it later, because its HTTP
caller has already withdrawn the message and answered 503.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest

from client import ConnectionFailed, Incoming, InvalidPublish, MqttConnection

from _servers import Mosquitto

pytestmark = pytest.mark.servers


def _wait_for(predicate: Callable[[], bool], timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def test_resend_mode_delivers_after_restart_and_fail_mode_never_does(
    mosquitto_factory: Callable[..., Mosquitto], unique_topic: Callable[[str], str]
) -> None:
    server = mosquitto_factory()
    topic = unique_topic("adapter")
    keep = MqttConnection(server.url)  # the client's default
    drop = MqttConnection(server.url, resend_unacknowledged=False)  # the gateway's
    keep.connect()
    drop.start()
    received: list[Incoming] = []
    sub = MqttConnection(server.url, on_message=received.append)
    try:
        assert drop.wait_connected(10)
        server.stop()
        assert _wait_for(lambda: not keep.connected and not drop.connected)
        # Retained, so a subscriber that comes after the restart still sees what arrived.
        kept = keep.publish(f"{topic}/kept", b"kept", qos=1, retain=True)
        failed = drop.publish(f"{topic}/dropped", b"dropped", qos=1, retain=True)
        with pytest.raises(ConnectionFailed):
            failed.result(0)  # at once, not after a timeout
        assert not kept.done()
        server.start()  # same port: paho reconnects both
        kept.result(30)
        assert drop.wait_connected(30)
        drop.publish(f"{topic}/after", b"after", qos=1, retain=True).result(30)
        sub.connect()
        sub.subscribe(f"{topic}/#", 1).result(10)
        assert _wait_for(lambda: {m.payload for m in received} >= {b"kept", b"after"})
        time.sleep(0.5)
        assert b"dropped" not in {m.payload for m in received}
    finally:
        for conn in (sub, keep, drop):
            conn.close()


def _nagle_off(conn: MqttConnection) -> bool:
    sock = conn._paho.socket()
    assert isinstance(sock, socket.socket)
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_nagle_is_off_on_the_broker_connection_after_every_connect(
    mosquitto_factory: Callable[..., Mosquitto],
) -> None:
    """paho leaves Nagle on: a small PUBLISH then waits for the broker's delayed ACK."""
    server = mosquitto_factory()
    conn = MqttConnection(server.url)
    conn.connect()
    try:
        assert _nagle_off(conn)
        server.stop()
        assert _wait_for(lambda: not conn.connected)
        server.start()  # same port: paho reconnects on a new socket
        assert conn.wait_connected(30)
        assert _nagle_off(conn)
    finally:
        conn.close()


def test_a_publish_a_broker_would_refuse_is_never_queued(broker: Mosquitto) -> None:
    from client import PublishProperties

    conn = MqttConnection(broker.url)
    conn.connect()
    try:
        bad = conn.publish("t/x", b"x", qos=1, properties=PublishProperties(content_type="a\nb"))
        with pytest.raises(InvalidPublish, match="content type"):
            bad.result(0)
        with pytest.raises(InvalidPublish):
            conn.publish("t/+", b"x").result(0)  # a wildcard in a topic name
        conn.publish("t/x", b"ok", qos=1).result(10)
        assert conn.connected and conn.connections == 1  # never disconnected
    finally:
        conn.close()
