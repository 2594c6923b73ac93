"""offload-proxy as the front door: hostile bytes, a gateway that is down, a Will over the
broker's limit, and our own `client.Client` through it. Real mosquitto, gateway, SeaweedFS."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_proxy import MiB, PahoPeer, start_proxy

from _gateway import GatewayServer
from _hostile import LyingEndpoint
from _proxy import ProxyServer
from _servers import Mosquitto, free_port, wait_until

pytestmark = pytest.mark.servers


def _text(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return len(raw).to_bytes(2, "big") + raw


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + _varint(len(body)) + body


def _exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        piece = sock.recv(n - len(out))
        assert piece, "the peer closed the connection"
        out += piece
    return out


def _read(sock: socket.socket) -> tuple[int, bytes]:
    """One whole MQTT packet off `sock`: its first byte and its body."""
    first = _exactly(sock, 1)[0]
    length, shift = 0, 0
    while True:
        byte = _exactly(sock, 1)[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return first, _exactly(sock, length)


def connect_packet(level: int = 5, *, will: tuple[str, bytes] | None = None) -> bytes:
    flags = 0x02 | (0x0C if will else 0)  # clean, will with QoS 1
    body = _text("MQTT") + bytes([level, flags]) + (0).to_bytes(2, "big")
    body += (b"\x00" if level == 5 else b"") + _text(f"h-{uuid.uuid4().hex[:8]}")
    if will is not None:
        body += (b"\x00" if level == 5 else b"") + _text(will[0]) + _text(will[1])
    return _packet(0x10, body)


def dial(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=60)


def until_closed(sock: socket.socket) -> bytes:
    """Everything the proxy sends until it closes the connection."""
    out = b""
    try:
        while piece := sock.recv(65536):
            out += piece
    except ConnectionResetError:
        pass
    sock.close()
    return out


def connected(port: int, level: int = 5) -> socket.socket:
    sock = dial(port)
    sock.sendall(connect_packet(level))
    connack = sock.recv(2)
    assert connack[:1] == b"\x20"
    sock.recv(connack[1])
    return sock


@pytest.fixture
def hostile_proxy(gateway: GatewayServer, broker: Mosquitto) -> Iterator[ProxyServer]:
    server = start_proxy(broker, gateway, connect_timeout=1.0, idle_timeout=1.0)
    yield server
    server.stop()


def test_hostile_connections_get_the_mqtt_answer_and_leave_others_unaffected(
    hostile_proxy: ProxyServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    port = hostile_proxy.port
    topic = unique_topic("hostile")
    watcher = PahoPeer(broker.port)  # straight on the broker: nothing hostile gets published
    watcher.subscribe(broker, "hostile/#")
    idle = [connected(port) for _ in range(100)]  # many idle clients, each its own broker link

    garbage = dial(port)
    garbage.sendall(b"\x00\x00garbage")
    early_publish = dial(port)
    early_publish.sendall(_packet(0x30, _text(topic) + b"x"))
    slow_loris = dial(port)
    slow_loris.sendall(connect_packet()[:5])
    five_byte = connected(port)
    five_byte.sendall(b"\x30\xff\xff\xff\xff\x01")
    huge_then_silence = connected(port)
    huge_then_silence.sendall(b"\x32\xff\xff\xff\x7f" + _text(topic) + b"\x00\x01\x00")
    halfway = connected(port)
    header = _text(topic) + b"\x00\x02\x00"
    halfway.sendall(bytes([0x32]) + _varint(len(header) + 2 * MiB) + header + bytes(MiB))
    alias = connected(port)
    alias.sendall(_packet(0x30, _text("") + b"\x03\x23\x00\x05" + b"payload"))

    assert until_closed(garbage) == b""
    assert until_closed(early_publish) == b""
    assert until_closed(slow_loris) == b""  # closed at the CONNECT deadline, no CONNACK
    assert until_closed(five_byte) == b"\xe0\x01\x81"  # DISCONNECT, Malformed Packet
    assert until_closed(huge_then_silence) == b""  # idle timeout inside the packet
    assert until_closed(halfway) == b""  # stopped halfway: nothing published, nothing acked
    assert until_closed(alias) == b"\xe0\x01\x94"  # DISCONNECT, Topic Alias invalid

    good = PahoPeer(hostile_proxy.port)  # the proxy still serves everyone else
    sub = PahoPeer(hostile_proxy.port)
    sub.subscribe(broker, topic)
    payload = os.urandom(2 * MiB)
    good.client.publish(topic, payload, qos=1).wait_for_publish(60)
    good.client.publish(topic + "/end", b"end", qos=1).wait_for_publish(60)
    assert sub.wait(1)[0].payload == payload
    messages = watcher.wait(2)  # the good placeholder and the marker, nothing hostile
    assert [m.topic for m in messages] == [topic, topic + "/end"]
    assert hostile_proxy.metric("offload_proxy_offloaded_total") == 1
    for sock in idle:
        sock.close()
    for peer in (watcher, good, sub):
        peer.close()


def test_hostile_3_1_1_publishes_after_a_run_each_get_their_answer(
    hostile_proxy: ProxyServer,
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An MQTT 3.1.1 client's PUBLISHes go to the broker in translated runs (issue 44). Each
    connection here sends a good QoS 0 PUBLISH and, in the same write, a hostile one: the
    good one is published, the hostile one never is, and each connection gets the answer
    3.1.1 has for it (none: the connection is closed, by the proxy or, for what only the
    broker reads, by the broker's DISCONNECT, which 3.1.1 cannot carry). A 3.1.1 PUBLISH
    over the broker's limit is offloaded and acknowledged; the proxy serves others after.
    No input is an ERROR in the proxy's log (256 MiB announced was a traceback: one byte
    more, its MQTT 5 form, did not fit a Remaining Length)."""
    port = hostile_proxy.port
    base = unique_topic("hostile311")
    watcher = PahoPeer(broker.port)  # straight on the broker
    watcher.subscribe(broker, f"{base}/#")

    def publish311(topic: bytes, payload: bytes, qos: int = 0, pid: bytes = b"\x00\x01") -> bytes:
        return _packet(0x30 | qos << 1, _text(topic) + (pid if qos else b"") + payload)

    hostile = {
        "no topic": publish311(b"", b"x"),
        "a topic length past the packet": _packet(0x30, b"\x01\x00" + f"{base}/t".encode()),
        "QoS 3": _packet(0x36, _text(f"{base}/q3") + b"\x00\x01x"),
        "a packet id past the packet": _packet(0x32, _text(f"{base}/pid")),
        "a wildcard topic": publish311(f"{base}/#".encode(), b"x"),
        "a topic that is not UTF-8": publish311(base.encode() + b"/\xff\xfe", b"x"),
        "packet id 0": publish311(f"{base}/pid0".encode(), b"x", qos=1, pid=b"\x00\x00"),
        "256 MiB announced, then silence": b"\x30\xff\xff\xff\x7f" + _text(f"{base}/big"),
    }
    socks = {}
    for n, (case, data) in enumerate(hostile.items()):
        sock = connected(port, level=4)
        sock.sendall(publish311(f"{base}/good/{n}".encode(), b"good") + data)
        socks[case] = sock
    for case, sock in socks.items():
        assert until_closed(sock) == b"", case

    large = connected(port, level=4)
    payload = os.urandom(300_000)
    large.sendall(publish311(f"{base}/large".encode(), payload, qos=1, pid=b"\x00\x07"))
    assert _read(large) == (0x40, b"\x00\x07")  # PUBACK: stored, its placeholder published
    large.close()

    got = watcher.wait(len(hostile) + 1)
    assert sorted(m.topic for m in got) == sorted(
        [f"{base}/good/{n}" for n in range(len(hostile))] + [f"{base}/large"]
    )
    assert all(m.payload == b"good" for m in got if "/good/" in m.topic)
    assert hostile_proxy.metric("offload_proxy_offloaded_total") == 1
    errors = [r for r in caplog.records if r.name.startswith("proxy") and r.levelno >= 40]
    assert errors == [], [r.getMessage() for r in errors]
    watcher.close()


def test_a_connection_over_max_connections_gets_server_busy(
    gateway: GatewayServer, broker: Mosquitto
) -> None:
    server = start_proxy(broker, gateway, max_connections=2, max_connections_per_address=2)
    try:
        first, second = connected(server.port), connected(server.port)
        third = dial(server.port)
        third.sendall(connect_packet(5))
        assert until_closed(third) == b"\x20\x03\x00\x89\x00"  # CONNACK, Server busy
        fourth = dial(server.port)
        fourth.sendall(connect_packet(4))
        assert until_closed(fourth) == b"\x20\x02\x00\x03"  # 3.1.1: server unavailable
        first.close()
        second.close()
    finally:
        server.stop()


def test_a_placeholder_pointing_elsewhere_is_never_fetched(
    proxy: ProxyServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    """Pointed at a server that answers and records every request (not an unreachable
    address, whose silence proves nothing): it must get none."""
    topic = unique_topic("ssrf")
    elsewhere = LyingEndpoint(body_bytes=10).start()  # would serve the 10 bytes it states
    sub = PahoPeer(proxy.port)
    sub.subscribe(broker, topic)
    fake = json.dumps({
        "_format": "external", "_id": str(uuid.uuid4()), "size": 10, "sha256": "0" * 64,
        "url": f"{elsewhere.url}/msg/{uuid.uuid4()}",
    }).encode()  # fmt: skip
    direct = PahoPeer(broker.port)
    try:
        direct.client.publish(topic, fake, qos=1).wait_for_publish(30)
        assert sub.wait(1)[0].payload == fake  # handed on as it is
        # A fetch comes before the placeholder is handed on: it would be recorded by now.
        assert elsewhere.served == []
        passed = proxy.metric("offload_proxy_placeholders_passed_total", why="untrusted-origin")
        assert passed == 1
    finally:
        elsewhere.stop()
        sub.close()
        direct.close()


@pytest.fixture
def proxy(gateway: GatewayServer, broker: Mosquitto) -> Iterator[ProxyServer]:
    server = start_proxy(broker, gateway)
    yield server
    server.stop()


@pytest.mark.parametrize("v5", [True, False])
def test_gateway_down_the_client_is_not_acked_and_nothing_is_published(
    broker: Mosquitto, unique_topic: Callable[[str], str], v5: bool
) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    server = start_proxy(broker, None, endpoint=down)
    topic = unique_topic("down")
    watcher = PahoPeer(broker.port)
    watcher.subscribe(broker, f"{topic}/#")
    try:
        pub = PahoPeer(server.port, v5=v5)
        acks: list[Any] = []
        pub.client.on_publish = lambda _c, _u, mid, rc, _p: acks.append(rc)
        info = pub.client.publish(f"{topic}/big", os.urandom(MiB), qos=1)
        if v5:
            wait_until(lambda: bool(acks), "a PUBACK", 60)
            assert acks[0].is_failure and acks[0].value == 0x80  # Unspecified error
        else:
            wait_until(lambda: not pub.client.is_connected(), "3.1.1 client disconnected", 60)
            assert not info.is_published()
        marker = PahoPeer(broker.port)
        marker.client.publish(f"{topic}/marker", b"m", qos=1).wait_for_publish(30)
        assert [m.topic for m in watcher.wait(1)] == [f"{topic}/marker"]
        assert server.metric("offload_proxy_offloaded_total") == 0
        for peer in (pub, marker):
            peer.close()
    finally:
        watcher.close()
        server.stop()


def test_a_will_over_the_broker_limit_is_delivered_when_its_client_dies(
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
    unique_topic: Callable[[str], str],
) -> None:
    small = mosquitto_factory(max_packet_size=4096)
    gw = gateway_factory(small)
    server = start_proxy(small, gw, broker_max_packet_size=4096)
    topic = unique_topic("will")
    will = os.urandom(60_000)
    try:
        sub = PahoPeer(server.port)
        sub.subscribe(small, topic)
        direct = PahoPeer(small.port)
        direct.subscribe(small, topic)
        dying = dial(server.port)
        dying.sendall(connect_packet(4, will=(topic, will)))
        assert dying.recv(4) == b"\x20\x02\x00\x00"
        dying.close()  # no DISCONNECT: the broker publishes the Will
        assert sub.wait(1)[0].payload == will
        assert json.loads(direct.wait(1)[0].payload)["size"] == len(will)
        sub.close()
        direct.close()
    finally:
        server.stop()


def test_a_will_upload_takes_an_upload_slot_and_is_refused_when_none_is_free(
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
    unique_topic: Callable[[str], str],
) -> None:
    """Every upload runs on a worker thread of its own, as many as the admission limits:
    a Will stored at CONNECT counts as an upload, so a CONNECT flood cannot take the
    threads PUBLISHes and fetches need."""
    small = mosquitto_factory(max_packet_size=4096)
    gw = gateway_factory(small)
    server = start_proxy(small, gw, broker_max_packet_size=4096, max_uploads=1)
    try:
        holder = connected(server.port)
        payload = os.urandom(MiB)
        topic = _text(unique_topic("held"))
        body = topic + b"\x00" + payload  # QoS 0, no properties
        packet = bytes([0x30]) + _varint(len(body)) + body
        holder.sendall(packet[: 256 * 1024])  # the upload begins, then waits for the rest
        wait_until(lambda: server.metric("offload_proxy_uploads") == 1, "the upload", 30)
        will = (unique_topic("will"), os.urandom(8000))
        refused = dial(server.port)
        refused.sendall(connect_packet(5, will=will))
        connack = until_closed(refused)
        assert connack[:1] == b"\x20" and connack[3] == 0x97  # quota exceeded
        holder.sendall(packet[256 * 1024 :])
        wait_until(lambda: server.metric("offload_proxy_offloaded_total") == 1, "stored", 30)
        admitted = dial(server.port)
        admitted.sendall(connect_packet(5, will=will))
        connack = admitted.recv(4)
        assert connack[:1] == b"\x20" and connack[3] == 0x00  # the slot is free again
        admitted.close()
        holder.close()
    finally:
        server.stop()


def test_a_subscriber_that_stops_reading_is_cut_off_and_frees_its_fetch(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    """A payload is written to an unmodified subscriber that takes nothing: after
    `idle_timeout` seconds without progress the proxy closes it, and what it held (the
    payload fetched for it, a fetch slot, its thread, its gateway connection) is let go,
    not held for as long as the peer lives."""
    server = start_proxy(broker, gateway, idle_timeout=1)
    topic = unique_topic("no-reader")
    try:
        reader = connected(server.port)
        subscribe = (1).to_bytes(2, "big") + b"\x00" + _text(topic) + b"\x01"
        reader.sendall(_packet(0x82, subscribe))
        assert reader.recv(1) == b"\x90"  # SUBACK; from here on nothing is read
        pub = subprocess.run(
            ["mosquitto_pub", "-p", str(server.port), "-t", topic, "-s", "-q", "1"],
            input=os.urandom(32 * MiB), capture_output=True, timeout=120,
        )  # fmt: skip
        assert pub.returncode == 0, pub.stderr.decode()
        held = lambda: server.metric("offload_proxy_shared_bytes")  # noqa: E731
        wait_until(lambda: held() == 32 * MiB, "the payload fetched for it", 30)
        wait_until(lambda: held() == 0, "the payload let go", 30)
        assert server.metric("offload_proxy_fetches") == 0  # no slot, thread, connection
        assert server.call(lambda: server.proxy.services.shared.flights) == 0
        assert server.metric("offload_proxy_resolved_total") == 0
        reader.close()
    finally:
        server.stop()


def _after_suback_publishes(data: bytes, topic: str) -> tuple[list[bytes], bytes]:
    """The payloads of the whole MQTT 5 QoS 0 PUBLISHes on `topic` in `data` (the rest of a
    SUBACK whose first byte was read, then PUBLISHes), and the packet cut short at its end."""
    at = 1 + data[0]  # the SUBACK's remaining length, then its body
    payloads: list[bytes] = []
    while at < len(data):
        start, length, shift = at, 0, 0
        assert data[at] == 0x30, f"not a QoS 0 PUBLISH at {at}: {data[at]:#x}"
        at += 1
        while at < len(data):
            byte = data[at]
            at += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        else:
            return payloads, data[start:]
        if at + length > len(data):
            return payloads, data[start:]
        body = data[at : at + length]
        head = _text(topic) + b"\x00"  # topic, no properties
        assert body.startswith(head), body[:40]
        payloads.append(body[len(head) :])
        at += length
    return payloads, b""


def test_a_subscriber_that_stops_reading_small_messages_is_cut_off(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    """Messages under the broker's limit, relayed as they are, pile up for a subscriber
    that takes nothing: after `idle_timeout` seconds without progress the proxy closes it
    (and its broker link), as it does while a payload is written; others are served."""
    server = start_proxy(broker, gateway, idle_timeout=1)
    topic = unique_topic("no-reader-small")
    try:
        reader = connected(server.port)
        subscribe = (1).to_bytes(2, "big") + b"\x00" + _text(topic) + b"\x00"  # QoS 0
        reader.sendall(_packet(0x82, subscribe))
        assert reader.recv(1) == b"\x90"  # SUBACK; from here on nothing is read
        wait_until(lambda: server.metric("offload_proxy_connections") == 1, "subscribed", 10)
        publisher = PahoPeer(broker.port)  # straight to the broker
        # Small enough to be read whole before it is relayed (a larger one is streamed to
        # the client, with the same cut-off); 8 MiB in all, more than the buffers hold.
        piece = os.urandom(1024)
        for _ in range(8 * 1024):
            publisher.client.publish(topic, piece, qos=0)
        wait_until(lambda: server.metric("offload_proxy_connections") == 0, "cut off", 30)
        sent = until_closed(reader)  # the proxy closed it (what it had sent still arrives)
        # Every message that reached it arrived whole and as published, the last perhaps
        # cut short by the close; far from all of them: the rest went nowhere.
        payloads, tail = _after_suback_publishes(sent, topic)
        assert payloads and all(p == piece for p in payloads)
        assert len(payloads) < 8 * 1024, len(payloads)
        assert len(tail) < len(_packet(0x30, _text(topic) + b"\x00" + piece)), len(tail)
        # The proxy goes on serving others.
        other = PahoPeer(server.port)
        other.subscribe(broker, topic)
        publisher.client.publish(topic, b"after", qos=1).wait_for_publish(10)
        assert [m.payload for m in other.wait(1)] == [b"after"]
        other.close()
        publisher.close()
    finally:
        server.stop()


def test_client_library_through_the_proxy_gets_placeholders_and_resolves_them(
    proxy: ProxyServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    from client import Client

    topic = unique_topic("lib")
    payload = os.urandom(5 * MiB)
    plain = PahoPeer(proxy.port)
    plain.subscribe(broker, topic)
    with Client(f"mqtt://127.0.0.1:{proxy.port}", discovery_wait=10.0) as lib:
        lib.subscribe(topic)
        lib.publish(topic, payload, qos=1)
        got = lib.next_message(60)
        assert got is not None and got.payload == payload  # type: ignore[union-attr]
    assert plain.wait(1)[0].payload == payload
    # The library announced itself: it got the placeholder and fetched the payload itself.
    assert proxy.metric("offload_proxy_resolved_total") == 1  # the plain subscriber's only
    plain.close()


def _subscribe_raw(port: int, topic: str) -> socket.socket:
    sock = connected(port)
    sock.sendall(_packet(0x82, b"\x00\x01" + b"\x00" + _text(topic) + b"\x00"))  # v5, QoS 0
    suback = sock.recv(2)
    assert suback[:1] == b"\x90"
    sock.recv(suback[1])
    return sock


def test_a_payload_whose_stored_bytes_change_never_reaches_the_client_whole(
    proxy: ProxyServer,
    broker: Mosquitto,
    seaweed: Any,
    bucket_name: str,
    unique_topic: Callable[[str], str],
) -> None:
    """The store lies: the payload's object is replaced behind the gateway's back by other
    bytes of the same size. The gateway still says the true SHA-256 (its manifest's), so
    the proxy begins the PUBLISH; the bytes fail their check before the last one is
    written, and the client is cut off mid-packet. A redelivery gets the placeholder. (A
    placeholder that lies about its payload costs its subscriber nothing:
    test_proxy_broadcast.py::test_false_digests_cost_the_subscriber_nothing.)"""
    from minio import Minio

    topic = unique_topic("tamper")
    direct = PahoPeer(broker.port)
    direct.subscribe(broker, topic)
    payload = os.urandom(2 * MiB)
    pub = PahoPeer(proxy.port)
    pub.client.publish(topic, payload, qos=1).wait_for_publish(60)
    placeholder = direct.wait(1)[0].payload
    s3 = Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)
    stored = [
        o.object_name
        for o in s3.list_objects(bucket_name, recursive=True)
        if o.size == len(payload) and o.object_name
    ]
    assert len(stored) == 1, stored
    other = os.urandom(len(payload))
    s3.put_object(bucket_name, stored[0], io.BytesIO(other), len(other))
    cut = _subscribe_raw(proxy.port, topic)
    direct.client.publish(topic, placeholder, qos=1).wait_for_publish(30)
    got = until_closed(cut)
    whole = 5 + sum((b & 0x7F) << (7 * i) for i, b in enumerate(got[1:5]))
    assert got[:1] == b"\x30" and len(got) < whole  # a PUBLISH begun, never completed
    later = _subscribe_raw(proxy.port, topic)  # a redelivery: the placeholder as it is
    direct.client.publish(topic, placeholder, qos=1).wait_for_publish(30)
    head = later.recv(5)
    assert head[:1] == b"\x30"
    received = b""
    while not received.endswith(placeholder):
        received += later.recv(65536)
    assert proxy.metric("offload_proxy_placeholders_passed_total", why="failed-before") == 1
    later.close()
    pub.close()
    direct.close()


def test_a_long_upload_keeps_the_clients_broker_session_alive(
    proxy: ProxyServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    """The broker sees nothing from a client while its PUBLISH goes to the gateway: the proxy
    pings for it, or mosquitto drops the session after 1.5 keep-alives."""
    topic = unique_topic("keepalive")
    sock = dial(proxy.port)
    body = _text("MQTT") + bytes([5, 0x02]) + (3).to_bytes(2, "big") + b"\x00" + _text("ka-1")
    sock.sendall(_packet(0x10, body))  # keep-alive: 3 s (the proxy pings every 1.5 s)
    connack = sock.recv(2)
    sock.recv(connack[1])
    header = _text(topic) + b"\x00\x09\x00"
    size = 2 * MiB
    sock.sendall(bytes([0x32]) + _varint(len(header) + size) + header)
    # The body over ~20 s, past 4 keep-alive timeouts (4.5 s each): a margin of 3 s per
    # ping on a loaded machine, and still no chance without the proxy's pings.
    for _ in range(8):
        sock.sendall(bytes(size // 8))
        time.sleep(2.5)
    puback = sock.recv(4)
    assert puback[:1] == b"\x40" and puback[2:4] == b"\x00\x09"  # PUBACK for id 9 ...
    rest = sock.recv(puback[1] - 2) if puback[1] > 2 else b""
    assert rest[:1] in (b"", b"\x00", b"\x10")  # ... Success (or "no subscribers")
    sock.close()
    assert "ka-1 has exceeded timeout" not in broker.log()


class StalledBroker:
    """An MQTT 5 endpoint that answers each CONNECT with a CONNACK and then reads nothing
    more (a wedged broker), its receive buffer small so the proxy's writes back up fast."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                self.held.append(conn)
                first, _ = _read(conn)  # the CONNECT, whole
                assert first == 0x10
                conn.sendall(b"\x20\x03\x00\x00\x00")  # CONNACK: success, no properties

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


def test_a_broker_that_stops_reading_ends_the_session_at_the_idle_timeout() -> None:
    """The relay toward the broker waited on `drain()` without a deadline: a broker that
    stopped reading held the client's connection, and the PUBLISH being relayed, for ever.
    Now a broker that takes too little for the idle timeout ends the session as a client
    that does so does."""
    from proxy import ProxySettings

    broker = StalledBroker()
    server = ProxyServer(
        ProxySettings(broker=f"mqtt://127.0.0.1:{broker.port}", port=0, idle_timeout=1.0)
    ).start()
    try:
        sock = connected(server.port)
        publish = _packet(0x30, _text("wedged/topic") + b"\x00" + bytes(64 * 1024))

        def flood() -> None:
            with contextlib.suppress(OSError):
                for _ in range(2000):  # 128 MiB: far more than the buffers on the way hold
                    sock.sendall(publish)

        threading.Thread(target=flood, daemon=True).start()
        started = time.monotonic()
        sock.settimeout(20)
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(65536):
                pass
        assert time.monotonic() - started < 10  # closed, not a recv timeout (20 s)
        sock.close()
        connected(server.port).close()  # the proxy serves the next client
    finally:
        server.stop()
        broker.close()
