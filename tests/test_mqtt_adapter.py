"""The one MQTT adapter in both of its modes, through a real broker restart.

The client keeps MQTT's session semantics (an unacknowledged QoS 1 publish goes out after the
reconnect); the gateway's link fails it at once and never sends it later, because its HTTP
caller has already withdrawn the message and answered 503.
"""

from __future__ import annotations

import contextlib
import socket
import threading
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


@pytest.mark.parametrize("protocol", [5, 4])
def test_with_receive_maximum_the_broker_waits_for_each_ack(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    protocol: int,
) -> None:
    """Flow control: unacknowledged QoS 1 messages stop the broker at the window (MQTT 5:
    our Receive Maximum, under the broker's default of 20; 3.1.1 has none: the broker's
    own inflight limit, set to 5 for it here)."""
    server = mosquitto_factory(extra_config="" if protocol == 5 else "max_inflight_messages 5")
    topic = unique_topic("window")
    received: list[Incoming] = []
    sub = MqttConnection(
        server.url, on_message=received.append, protocol=protocol, receive_maximum=5
    )
    pub = MqttConnection(server.url)
    try:
        sub.connect()
        pub.connect()
        sub.subscribe(topic, 1).result(10)
        for i in range(50):
            pub.publish(topic, b"%d" % i, qos=1).result(10)  # all at the broker
        assert _wait_for(lambda: len(received) >= 5)
        time.sleep(0.5)
        assert len(received) == 5  # the window, and no more until acknowledged
        acked = 0
        while acked < 50 and _wait_for(lambda n=acked: len(received) > n, 10):
            sub.ack(received[acked])
            acked += 1
        assert [m.payload for m in received] == [b"%d" % i for i in range(50)]
    finally:
        sub.close()
        pub.close()


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


def _mqtt_publish(topic: bytes, payload: bytes) -> bytes:
    """An MQTT 5 QoS 0 PUBLISH packet (no properties)."""
    body = len(topic).to_bytes(2, "big") + topic + b"\x00" + payload
    length, remaining = b"", len(body)
    while True:
        byte, remaining = remaining % 128, remaining // 128
        length += bytes([byte | (0x80 if remaining else 0)])
        if not remaining:
            return b"\x30" + length + body


class _BusyBroker:
    """CONNACK, then messages to the client without pause while this end reads nothing for
    a while: a busy broker, as a client sees it when it closes with bytes still unread."""

    def __init__(self, busy_for: float) -> None:
        self.server = socket.socket()
        # A small window: what the client writes waits in its own kernel buffer meanwhile.
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen()
        self.port = self.server.getsockname()[1]
        self.connected = threading.Event()
        self.go = threading.Event()
        self.done = threading.Event()
        self.received = b""
        self.outcome = ""
        self._busy_for = busy_for
        self._quiet = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _send(self, conn: socket.socket) -> None:
        burst = _mqtt_publish(b"busy/t", b"x" * 1000) * 64
        with contextlib.suppress(OSError):
            while not self._quiet.is_set():
                conn.sendall(burst)

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            conn.recv(65536)  # CONNECT (small: one read)
            conn.sendall(bytes([0x20, 3, 0, 0, 0]))  # MQTT 5 CONNACK: success
            self.connected.set()
            self.go.wait(10)
            sender = threading.Thread(target=self._send, args=(conn,), daemon=True)
            sender.start()
            try:
                time.sleep(self._busy_for)  # what the client sends waits here, unread
                while data := conn.recv(65536):
                    self.received += data
                    if data.endswith(b"\xe0\x00"):  # DISCONNECT: close, as mosquitto does
                        break
                self.outcome = "closed"
            except ConnectionResetError:
                self.outcome = "reset"  # the kernel dropped what had not been read
            finally:
                self._quiet.set()
                sender.join(5)
                self.done.set()
                self.server.close()


def test_close_reads_to_the_end_so_the_broker_gets_every_byte() -> None:
    """Closing with unread bytes from the broker (a retained message, a flow of messages)
    must not reset the connection: a reset discards what the client's kernel has not sent
    yet, such as the last QoS 0 PUBLISHes and the DISCONNECT (without which a broker also
    sends the Will)."""
    broker = _BusyBroker(busy_for=0.3)
    conn = MqttConnection(f"mqtt://127.0.0.1:{broker.port}")
    conn.connect()
    assert broker.connected.wait(5)
    broker.go.set()
    sent = [conn.publish("t/q0", b"%04d" % i + b"x" * 9996, qos=0) for i in range(50)]
    for future in sent:
        future.result(10)  # in the client's kernel, not yet read by the broker
    conn.close()
    assert broker.done.wait(10)
    assert broker.outcome == "closed"
    assert broker.received.count(b"t/q0") == len(sent)
    assert broker.received.endswith(b"\xe0\x00")  # and the DISCONNECT
