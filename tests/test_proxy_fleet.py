"""A fleet behind one offload-proxy: no device, address or account can stop the others.

Each test is one attack of issue 42 against a real mosquitto, gateway and SeaweedFS, and
asserts what the rest of the fleet keeps: another device's 2 MiB QoS 1 PUBLISH is
acknowledged with reason 0 and reaches its subscriber byte-exact within 20 s, another
user's payload arrives within 20 s, a poisoned id still resolves for others. Devices come
from distinct loopback addresses (127.0.0.x) where their address matters; the gateway
believes the proxy's `X-Forwarded-For` (`OFFLOAD_TRUSTED_PROXIES`), as the chart sets it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_proxy import MiB, PahoPeer, start_proxy
from test_proxy_hostile import _packet, _read, _text, _varint, until_closed

from _auth import credential_files, secured_pair
from _gateway import GatewayServer
from _proxy import ProxyServer
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers

USERS = {
    "writer": "w-secret-1",
    "writer2": "w-secret-2",
    "reader": "r-secret-1",
    "reader2": "r-secret-2",
    "gateway": "g-secret-1",
}
ACL = """\
pattern read sys/metadata
user writer
topic readwrite data/#
user writer2
topic readwrite data/#
user reader
topic read data/#
user reader2
topic read data/#
user gateway
topic readwrite sys/metadata
topic readwrite data/#
"""
#: What the fleet keeps: another device's payload arrives within this many seconds.
WITHIN = 20.0


@pytest.fixture
def files() -> Iterator[Path]:
    with credential_files("offload-fleet-", USERS, ACL) as path:
        yield path


def secured(
    files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
    *,
    max_packet_size: int = 262144,
) -> tuple[Mosquitto, GatewayServer]:
    """A broker and a gateway reading one password and ACL file; the gateway trusts the
    proxy's address (127.0.0.1) to forward the device's."""
    return secured_pair(
        files,
        mosquitto_factory,
        gateway_factory,
        gateway_password=USERS["gateway"],
        max_packet_size=max_packet_size,
        trusted_proxies="127.0.0.1",
    )


def connect_packet(
    client_id: str,
    *,
    level: int = 5,
    user: str | None = None,
    password: str | None = None,
    will: tuple[str, bytes] | None = None,
) -> bytes:
    flags = 0x02 | (0x0C if will else 0) | (0x80 if user else 0) | (0x40 if password else 0)
    v5 = level == 5
    body = _text("MQTT") + bytes([level, flags]) + (0).to_bytes(2, "big")
    body += (b"\x00" if v5 else b"") + _text(client_id)
    if will is not None:
        body += (b"\x00" if v5 else b"") + _text(will[0]) + _text(will[1])
    if user is not None:
        body += _text(user)
    if password is not None:
        body += _text(password)
    return _packet(0x10, body)


def device(
    port: int, source: str, *, user: str | None = None, rcvbuf: int = 0, level: int = 5
) -> socket.socket:
    """A raw MQTT client connected from `source` (127.0.0.x), its CONNACK read (success)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(60)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    password = USERS[user] if user else None
    sock.sendall(
        connect_packet(f"d-{uuid.uuid4().hex[:10]}", level=level, user=user, password=password)
    )
    first, body = _read(sock)
    assert first == 0x20 and body[1] == 0, f"CONNACK {body.hex()}"
    return sock


def publish_head(topic: str, size: int, packet_id: int = 1) -> bytes:
    """An MQTT 5 QoS 1 PUBLISH's fixed and variable header for a payload of `size` bytes."""
    header = _text(topic) + packet_id.to_bytes(2, "big") + b"\x00"
    return bytes([0x32]) + _varint(len(header) + size) + header


def delivered(peer: PahoPeer, count: int = 1, within: float = WITHIN) -> list[Any]:
    wait_until(lambda: len(peer.messages) >= count, f"{count} message(s)", within)
    return peer.messages


def acknowledged(publisher: PahoPeer, topic: str, payload: bytes) -> int:
    """Publish at QoS 1; the PUBACK's reason code, within :data:`WITHIN` seconds."""
    codes: list[int] = []
    publisher.client.on_publish = lambda _c, _u, _mid, rc, _p: codes.append(rc.value)
    publisher.client.publish(topic, payload, qos=1)
    wait_until(lambda: bool(codes), "the PUBACK", WITHIN)
    return codes[0]


def the_fleet_keeps_publishing(
    proxy: ProxyServer, broker: Mosquitto, topic: str, source: str, **login: Any
) -> None:
    """Another device's 2 MiB QoS 1 PUBLISH: PUBACK 0, byte-exact at its subscriber."""
    sub = PahoPeer(proxy.port, **login.get("reader", {}))
    pub = PahoPeer(proxy.port, bind_address=source, **login.get("writer", {}))
    try:
        sub.subscribe(broker, topic, qos=1)
        payload = os.urandom(2 * MiB)
        assert acknowledged(pub, topic, payload) == 0
        assert delivered(sub)[0].payload == payload
    finally:
        sub.close()
        pub.close()


class Dripper:
    """Sends `rate` bytes a second on each socket until stopped (a slow writer just above
    the gateway's minimum rate)."""

    def __init__(self, socks: list[socket.socket], rate: int) -> None:
        self.stop = threading.Event()
        self.socks = socks
        self.thread = threading.Thread(target=self._run, args=(rate,), daemon=True)
        self.thread.start()

    def _run(self, rate: int) -> None:
        while not self.stop.wait(1.0):
            for sock in self.socks:
                with contextlib.suppress(OSError):
                    sock.sendall(bytes(rate))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for sock in self.socks:
            sock.close()


class SlowReader:
    """Reads `rate` bytes a second from each socket until stopped."""

    def __init__(self, socks: list[socket.socket], rate: int) -> None:
        self.stop = threading.Event()
        self.socks = socks
        self.received = [0] * len(socks)
        for sock in socks:
            sock.setblocking(False)
        self.thread = threading.Thread(target=self._run, args=(rate,), daemon=True)
        self.thread.start()

    def _run(self, rate: int) -> None:
        step = rate // 8
        while not self.stop.wait(0.125):
            for i, sock in enumerate(self.socks):
                with contextlib.suppress(BlockingIOError, OSError):
                    self.received[i] += len(sock.recv(step))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for sock in self.socks:
            sock.close()


def test_wills_over_the_limit_with_wrong_passwords_cost_the_gateway_nothing(
    files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    """55 CONNECTs with a Will over the broker's limit and a wrong password, no login
    needed: before, the proxy uploaded each Will with the CONNECT's password before the
    broker checked it, and the failed logins locked the proxy's address (every user) and
    `writer` out of the gateway. Now a Will is stored only after the broker's CONNACK 0."""
    broker, gw = secured(files, mosquitto_factory, gateway_factory, max_packet_size=4096)
    proxy = start_proxy(broker, gw, broker_max_packet_size=4096)
    try:
        for i in range(55):
            sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
            will = ("data/will", os.urandom(8000))
            level = 5 if i % 2 else 4
            sock.sendall(
                connect_packet(f"w-{i}", level=level, user="writer", password="wrong", will=will)
            )
            answer = until_closed(sock)
            assert answer[:1] == b"\x20", answer  # a CONNACK that refuses
            assert answer[3] in ((0x86, 0x87) if level == 5 else (4, 5)), answer.hex()
        assert proxy.metric("offload_proxy_offloaded_total") == 0  # nothing stored
        the_fleet_keeps_publishing(
            proxy,
            broker,
            "data/after-the-flood",
            "127.0.0.1",
            writer={"credentials": ("writer", USERS["writer"])},
            reader={"credentials": ("reader", USERS["reader"])},
        )
    finally:
        proxy.stop()


def test_a_will_the_gateway_cannot_store_is_never_published(
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
    unique_topic: Callable[[str], str],
) -> None:
    """The broker accepted the login, then the Will's upload failed (a gateway that refuses
    it: 413): the broker link ends with DISCONNECT 0x00, so the broker never publishes a
    placeholder that points at nothing, and the client is refused."""
    small = mosquitto_factory(max_packet_size=4096)
    gw = gateway_factory(small, max_body_bytes=4000)  # the 8000-byte Will: 413
    proxy = start_proxy(small, gw, broker_max_packet_size=4096)
    topic = unique_topic("lost-will")
    watcher = PahoPeer(small.port)
    try:
        watcher.subscribe(small, topic)
        # 0x83: the gateway refused the request itself (413), which no resend changes.
        for level, refusal in ((5, b"\x20\x03\x00\x83\x00"), (4, b"\x20\x02\x00\x03")):
            sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
            sock.sendall(connect_packet(f"lw-{level}", level=level, will=(topic, os.urandom(8000))))
            assert until_closed(sock) == refusal
        marker = PahoPeer(small.port)
        marker.client.publish(topic, b"marker", qos=1).wait_for_publish(10)
        marker.close()
        assert [m.payload for m in delivered(watcher)] == [b"marker"]  # no Will before it
    finally:
        watcher.close()
        proxy.stop()


def test_forty_stalled_devices_leave_the_rest_of_the_fleet_its_uploads(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
) -> None:
    """20 devices from their own addresses and 20 from one address announce 255 MiB
    PUBLISHes, send 1 MiB and stall. Before, the gateway's 16 uploads per address were the
    whole fleet's (every one came from the proxy's address): every other device's large
    PUBLISH was refused until the idle timeout. Now each upload carries its device's
    address, and one address takes at most its share of the proxy's slots."""
    gw = gateway_factory(broker, trusted_proxies="127.0.0.1")
    proxy = start_proxy(broker, gw)
    per_address = proxy.proxy.settings.upload_shares.per_address
    own = [f"127.0.0.{i}" for i in range(2, 22)]
    shared = ["127.0.0.22"] * 20
    devices: list[socket.socket] = []
    try:
        for source in own + shared:
            sock = device(proxy.port, source)
            sock.sendall(publish_head(unique_topic("stalled"), 255 * MiB) + bytes(MiB))
            devices.append(sock)
        taken = 20 + per_address

        def settled() -> bool:
            refused = proxy.metric(
                "offload_proxy_shares_full_total", pool="uploads", share="address"
            )
            return proxy.metric("offload_proxy_uploads") == taken and refused == 20 - per_address

        wait_until(settled, f"{taken} uploads under way, the rest refused", 60)
        the_fleet_keeps_publishing(proxy, broker, unique_topic("fleet"), "127.0.0.23")
        assert proxy.metric("offload_proxy_uploads") == taken  # the stalled ones still hold theirs
    finally:
        for sock in devices:
            sock.close()
        proxy.stop()


def test_one_account_dripping_uploads_holds_only_its_share(
    files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    """One account drips 17 uploads at 2 KiB/s each (above the gateway's minimum rate),
    from 17 addresses. Before, on a proxy with 4 upload slots, it held 4 of 4. Now an
    account holds its share of the slots, and another account's publish goes through."""
    broker, gw = secured(files, mosquitto_factory, gateway_factory)
    proxy = start_proxy(broker, gw, max_uploads=4)
    per_user = proxy.proxy.settings.upload_shares.per_user
    socks = []
    for i in range(17):
        sock = device(proxy.port, f"127.0.1.{i + 1}", user="writer")
        sock.sendall(publish_head(f"data/drip/{i}", 4 * MiB))
        socks.append(sock)
    drip = Dripper(socks, 2048)
    try:
        wait_until(lambda: proxy.metric("offload_proxy_uploads") == per_user, "the share", 30)
        the_fleet_keeps_publishing(
            proxy,
            broker,
            "data/other-account",
            "127.0.1.100",
            writer={"credentials": ("writer2", USERS["writer2"])},
            reader={"credentials": ("reader", USERS["reader"])},
        )
        assert proxy.metric("offload_proxy_uploads") == per_user  # the drips hold theirs
    finally:
        drip.close()
        proxy.stop()


def test_one_accounts_slow_subscribers_hold_only_its_shares_of_the_fetches_and_spools(
    files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    """16 subscribers of one account read at 32 KB/s, each its own 4 MiB message (more than
    the socket buffers hold). Before, they held every fetch slot of a proxy with 16 and
    another user's payload waited for them (a 1 MB message arrived after 77.9 s). Now the
    payloads held for them while they read (proxy/_flights.py) are at most the account's
    share of `max_shared_bytes`, those beyond it are fetched for each device alone, holding
    at most the account's share of the fetch slots; the other account's payload arrives."""
    broker, gw = secured(files, mosquitto_factory, gateway_factory)
    proxy = start_proxy(broker, gw, max_fetches=16, max_shared_bytes=64 * MiB)
    settings = proxy.proxy.settings
    per_user = settings.fetch_shares.per_user
    spool_share = settings.shared_limits.shares.per_user
    shared = proxy.proxy.services.shared
    slow = []
    for i in range(16):
        sock = device(proxy.port, f"127.0.2.{i + 1}", user="reader", rcvbuf=4096)
        sock.sendall(_packet(0x82, b"\x00\x01\x00" + _text(f"data/slow/{i}") + b"\x00"))
        first, _ = _read(sock)
        assert first == 0x90  # SUBACK
        slow.append(sock)
    readers = SlowReader(slow, 32_000)
    writer = PahoPeer(proxy.port, credentials=("writer", USERS["writer"]))
    try:
        for i in range(16):
            writer.client.publish(f"data/slow/{i}", os.urandom(4 * MiB), qos=1).wait_for_publish(60)

        def settled() -> bool:
            spooled = proxy.call(lambda: shared.budget.held_by(user="reader"))
            return spooled == spool_share and proxy.metric("offload_proxy_fetches") == per_user

        wait_until(settled, "the account's shares taken", 30)
        fast = PahoPeer(proxy.port, credentials=("reader2", USERS["reader2"]))
        fast.subscribe(broker, "data/fast", qos=1)
        payload = os.urandom(MiB)
        writer.client.publish("data/fast", payload, qos=1).wait_for_publish(30)
        assert delivered(fast)[0].payload == payload
        fast.close()
        wait_until(settled, "the account's shares still held, no more", 10)
        # What the shares hold is read, slowly; the account's other subscribers wait.
        wait_until(lambda: sum(1 for got in readers.received if got) == 4, "read", 10)
        assert spool_share == 8 * MiB  # 2 payloads shared, 2 fetched alone, 12 waiting
        assert sum(1 for got in readers.received if got) == 4, readers.received
    finally:
        writer.close()
        readers.close()
        proxy.stop()


class StallingStore:
    """A store (the gateway's direct-transfer redirect leads here) that answers each GET
    with a head and a first piece of `size` bytes, then nothing: each fetch stays under way."""

    def __init__(self, size: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode()
        threading.Thread(target=self._serve, args=(head,), daemon=True).start()

    def _serve(self, head: bytes) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                conn.recv(65536)
                conn.sendall(head + bytes(1000))
                self.held.append(conn)

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


def test_one_accounts_sealed_payloads_wait_for_its_own_fetch_share(
    files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    """Issue 51 §5: the decoded path (proxy/_unseal.py: a compressed or encrypted payload,
    fetched and decoded whole before it is written) takes the device's share of the
    fetches as a plain payload does. Each fetch is held by a store that stalls; with one
    fetch per account, reader's second compressed payload waits for reader's own slot
    while reader2's goes ahead."""
    from client.protocol._zstd import compress

    stored = compress(os.urandom(MiB).hex().encode())  # ~1 MiB of zstd frames: offloaded
    store = StallingStore(len(stored))
    broker, gw = secured_pair(
        files, mosquitto_factory, gateway_factory, gateway_password=USERS["gateway"],
        trusted_proxies="127.0.0.1", s3_public_url=f"http://127.0.0.1:{store.port}",
    )  # fmt: skip
    proxy = start_proxy(broker, gw, max_fetches=8, max_fetches_per_user=1)
    spy = PahoPeer(broker.port, credentials=("writer", USERS["writer"]))
    spy.subscribe(broker, "data/seed", qos=1)
    subscribers = []
    for i, user in enumerate(("reader", "reader", "reader2")):
        sock = device(proxy.port, f"127.0.4.{i + 1}", user=user)
        sock.sendall(_packet(0x82, b"\x00\x01\x00" + _text(f"data/sealed/{i}") + b"\x00"))
        assert _read(sock)[0] == 0x90  # SUBACK; nothing more is read
        subscribers.append(sock)
    writer = PahoPeer(proxy.port, credentials=("writer", USERS["writer"]))
    try:
        writer.client.publish("data/seed", stored, qos=1).wait_for_publish(30)
        sealed = json.dumps({**json.loads(delivered(spy)[0].payload), "cmp": "zstd"})
        for i in range(3):
            spy.client.publish(f"data/sealed/{i}", sealed, qos=1).wait_for_publish(30)
        waiting = lambda: proxy.metric("offload_proxy_shares_full_total", pool="fetches",  # noqa: E731
                                       share="user")  # fmt: skip
        wait_until(lambda: proxy.metric("offload_proxy_fetches") == 2 and waiting() >= 1,
                   "reader's first and reader2's fetch under way, reader's second waiting",
                   20)  # fmt: skip
        wait_until(lambda: len(store.held) == 2, "both at the store", 20)
        assert proxy.metric("offload_proxy_fetches") == 2  # reader's second still waits
    finally:
        for sock in subscribers:
            sock.close()
        for peer in (spy, writer):
            peer.close()
        proxy.stop()
        store.close()


def test_a_false_digest_for_another_users_message_poisons_nothing(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    """A placeholder on the attacker's own topic names another user's message id with a
    false SHA-256. Before, that id joined the proxy's list of failed messages and the
    other user's subscribers got the placeholder instead of the payload. Now only the
    same URL, size and digest match, and the lie is found out before anything is written
    (the gateway's HEAD): the attacker's own subscriber gets it as it is, never cut off."""
    proxy = start_proxy(broker, gw := gateway)
    assert gw.url
    victim_topic, attacker_topic = unique_topic("victim"), unique_topic("attacker")
    direct = PahoPeer(broker.port)
    direct.subscribe(broker, victim_topic)
    victim = PahoPeer(proxy.port)
    payload = os.urandom(2 * MiB)
    victim.client.publish(victim_topic, payload, qos=1, retain=True).wait_for_publish(60)
    ref = json.loads(direct.wait(1)[0].payload)
    lie = json.dumps({**ref, "sha256": "0" * 64}).encode()
    try:
        fooled = PahoPeer(proxy.port)  # the attacker's own subscriber: handed the lie
        fooled.subscribe(broker, attacker_topic)
        direct.client.publish(attacker_topic, lie, qos=1).wait_for_publish(30)
        assert delivered(fooled)[0].payload == lie
        assert fooled.client.is_connected()
        fooled.close()
        assert proxy.metric("offload_proxy_placeholders_passed_total", why="mismatch") == 1
        assert proxy.metric("offload_proxy_placeholders_passed_total", why="failed-before") == 0
        later = PahoPeer(proxy.port)  # the retained placeholder, for a new subscriber
        later.subscribe(broker, victim_topic)
        assert delivered(later)[0].payload == payload
        later.close()
    finally:
        for peer in (direct, victim):
            peer.close()
        proxy.stop()


def test_a_refused_publish_that_set_a_topic_alias_leaves_no_stale_alias(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
) -> None:
    """Alias 1 is set for topic X by a small PUBLISH; a large PUBLISH to Y sets it anew and
    is refused (0x83). Before, the proxy then held 1 = Y and the broker 1 = X: the next
    alias-only PUBLISH, meant for Y, landed on X. Now the proxy tells the broker the topic
    with it, so it lands where the client sent it."""
    gw = gateway_factory(broker, max_body_bytes=MiB)
    proxy = start_proxy(broker, gw)
    x, y = unique_topic("alias-x"), unique_topic("alias-y")
    watcher = PahoPeer(broker.port)
    watcher.subscribe(broker, x)
    watcher.subscribe(broker, y)
    sock = device(proxy.port, "127.0.0.1")
    alias = b"\x03\x23\x00\x01"  # properties: Topic Alias 1

    def publish(topic: str, payload: bytes, packet_id: int) -> bytes:
        body = _text(topic) + packet_id.to_bytes(2, "big") + alias + payload
        sock.sendall(_packet(0x32, body))
        first, answer = _read(sock)
        assert first == 0x40 and answer[:2] == packet_id.to_bytes(2, "big")
        return answer[2:3] or b"\x00"

    try:
        assert publish(x, b"to-x", 1) in (b"\x00", b"\x10")
        assert publish(y, os.urandom(2 * MiB), 2) == b"\x83"  # refused: the gateway's 413
        assert publish("", b"meant-for-y", 3) in (b"\x00", b"\x10")
        got = delivered(watcher, 2)
        assert [(m.topic, m.payload) for m in got] == [(x, b"to-x"), (y, b"meant-for-y")]
    finally:
        sock.close()
        watcher.close()
        proxy.stop()
