"""QoS 0 publishes return once queued, within a bounded window, and close() writes the rest.

Real mosquitto and a plain paho subscriber for delivery; for the bound, a bare socket that
answers CONNECT and then never reads (a broker that stalls), so paho cannot write and the
window must stop the publisher instead of growing memory.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from client import Client, ConnectionFailed, MqttConnection
from client.publish._window import QOS0_WINDOW_BYTES

from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers


@dataclass
class _Watch:
    """A broker, a topic on it and what a plain paho subscriber to it has received."""

    broker: Mosquitto
    topic: str
    sub: mqtt.Client
    got: list[bytes] = field(default_factory=list)


@pytest.fixture
def watch(
    mosquitto_factory: Callable[..., Mosquitto], unique_topic: Callable[[str], str]
) -> Iterator[_Watch]:
    broker = mosquitto_factory()
    w = _Watch(
        broker, unique_topic("qos0"), mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    )
    subscribed = threading.Event()
    w.sub.on_subscribe = lambda *a: subscribed.set()
    w.sub.on_message = lambda c, u, m: w.got.append(m.payload)
    w.sub.connect("127.0.0.1", broker.port)
    w.sub.loop_start()
    try:
        w.sub.subscribe(w.topic, 0)
        assert subscribed.wait(10)
        yield w
    finally:
        w.sub.loop_stop()
        w.sub.disconnect()


def test_a_qos0_burst_then_close_delivers_every_message_in_order(watch: _Watch) -> None:
    pub = Client(watch.broker.url)
    pub.connect()
    sent = [b"%06d" % i for i in range(3000)]
    for body in sent:
        pub.publish(watch.topic, body, qos=0)
    pub.close()  # writes what is still queued before it disconnects
    wait_until(lambda: len(watch.got) >= len(sent), "every message at the subscriber", 30)
    assert watch.got == sent


def test_a_qos0_publish_then_close_is_delivered_every_time(watch: _Watch) -> None:
    """What `offload publish --qos 0` does: one message, then close at once (paho's own
    disconnect could stop its loop before the queued PUBLISH was written)."""
    # A retained discovery record (the gateway's, here a stale one) reaches every new
    # client: bytes it has not read when it closes, so its close resets the connection
    # and the broker may drop what it had not yet read from it.
    watch.sub.publish("sys/metadata", b"{}", qos=1, retain=True).wait_for_publish(10)
    sent = [b"%02d" % i for i in range(40)]
    for body in sent:
        with Client(watch.broker.url) as pub:
            pub.publish(watch.topic, body, qos=0)
    wait_until(lambda: len(watch.got) >= len(sent), "every message at the subscriber", 10)
    assert watch.got == sent


class _StalledBroker:
    """Answers CONNECT with CONNACK, then reads nothing more: writes to it soon block."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.server.accept()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            self.conns.append(conn)
            conn.recv(65536)  # CONNECT (small: one read)
            conn.sendall(bytes([0x20, 3, 0, 0, 0]))  # MQTT 5 CONNACK: success

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.server.close()


@pytest.fixture
def stalled() -> Iterator[_StalledBroker]:
    broker = _StalledBroker()
    yield broker
    broker.close()


def test_qos0_publishes_to_a_stalled_broker_stop_at_the_window(stalled: _StalledBroker) -> None:
    """Queued QoS 0 payloads stay bounded: the publisher is refused, memory does not grow."""
    size = 200 * 1024
    # No endpoint discovery: nothing but the PUBLISHes goes to the broker.
    pub = Client(f"mqtt://127.0.0.1:{stalled.port}", endpoint="http://127.0.0.1:1")
    pub.connect()
    published = 0
    try:
        with pytest.raises(ConnectionFailed, match="not written within"):
            for _ in range(2000):  # 400 MB if nothing held it back
                pub.publish("t/qos0", b"x" * size, qos=0, timeout=1)
                published += 1
    finally:
        stalled.close()
        pub.close()
    # What paho holds is the window plus what the two socket buffers took before they filled.
    assert QOS0_WINDOW_BYTES // size <= published < (QOS0_WINDOW_BYTES + 16 * 2**20) // size


def test_qos0_publishes_queued_when_the_connection_drops_fail(stalled: _StalledBroker) -> None:
    """paho discards unwritten QoS 0 messages at the reconnect without a word: their futures
    fail instead of staying pending for ever (the client's window would never drain)."""
    conn = MqttConnection(f"mqtt://127.0.0.1:{stalled.port}")
    conn.connect()
    try:
        futures = [conn.publish("t/qos0", b"x" * 200 * 1024, qos=0) for _ in range(100)]
        wait_until(lambda: not all(f.done() for f in futures), "a publish left unwritten", 5)
        stalled.close()  # the broker goes away
        wait_until(lambda: all(f.done() for f in futures), "every future settled", 10)
    finally:
        conn.close()
    unwritten = [f for f in futures if f.exception() is not None]
    assert unwritten, "the stalled socket took all 20 MB"
    assert all(isinstance(f.exception(), ConnectionFailed) for f in unwritten)
