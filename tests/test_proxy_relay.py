"""Small messages through offload-proxy as they came, in runs (issue 44): no packet framed
one by one that the proxy need not read, order and bytes kept for a long mix of small,
medium and large messages, and what an idle connection and a connect cost. Real peers only:
`mosquitto_pub -l` and `mosquitto_sub` (MQTT 5, neither resolves placeholders) across a
256 KiB mosquitto, the gateway and SeaweedFS."""

from __future__ import annotations

import hashlib
import random
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from test_proxy import start_proxy
from test_proxy_fleet import device
from test_proxy_fleet_limits import ProxyProcess
from test_proxy_hostile import _packet as packet
from test_proxy_hostile import _read as read
from test_proxy_hostile import until_closed

from _gateway import GatewayServer
from _proxy import ProxyServer
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers

LIMIT = 262144
_LETTERS = bytes(range(0x21, 0x7F))  # printable: `mosquitto_pub -l` reads lines


def text(rng: random.Random, size: int) -> bytes:
    return bytes(_LETTERS[b % len(_LETTERS)] for b in rng.randbytes(size))


class Subscriber:
    """`mosquitto_sub` through `port` for `count` messages, one line each, read as they come
    (a pipe left full would stop it, and the broker drop what it queues beyond its bound)."""

    def __init__(
        self, broker: Mosquitto, port: int, topic: str, qos: int, count: int, version: str = "5"
    ) -> None:
        self.client_id = f"rsub-{uuid.uuid4().hex[:8]}"
        self.proc = subprocess.Popen(
            ["mosquitto_sub", "-p", str(port), "-t", topic, "-q", str(qos), "-V", version,
             "-i", self.client_id, "-C", str(count), "-W", "300"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self._out: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        wait_until(lambda: f"Sending SUBACK to {self.client_id}" in broker.log(), "subscribed", 20)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while data := self.proc.stdout.read1(1 << 20):
            self._out.append(data)

    def lines(self) -> list[bytes]:
        self.proc.wait(120)
        self._reader.join(30)
        assert self.proc.returncode == 0, self.proc.stderr.read() if self.proc.stderr else ""
        return b"".join(self._out).split(b"\n")[:-1]


#: `mosquitto_pub -l` (2.0) ends its session once the PUBACK of the message id its last
#: line got arrives: past 65,535 lines an earlier message had that id, and it leaves early.
LINES_PER_PUBLISHER = 50_000


def publish_lines(
    port: int, topic: str, qos: int, lines: list[bytes], work: Path, version: str = "5"
) -> None:
    """`mosquitto_pub -l` with these lines, one publisher after the other for each
    :data:`LINES_PER_PUBLISHER` (each ends when the broker has acknowledged all of its)."""
    for start in range(0, len(lines), LINES_PER_PUBLISHER):
        path = work / f"lines-{start}.txt"
        path.write_bytes(
            b"".join(line + b"\n" for line in lines[start : start + LINES_PER_PUBLISHER])
        )
        with path.open("rb") as stdin:
            done = subprocess.run(
                ["mosquitto_pub", "-p", str(port), "-t", topic, "-q", str(qos), "-V", version,
                 "-l"],
                stdin=stdin, capture_output=True, timeout=300,
            )  # fmt: skip
        assert done.returncode == 0, done.stderr


def counted(proxy: ProxyServer, name: str) -> float:
    return sum(
        proxy.metric(f"offload_proxy_packets_{name}_total", direction=d) for d in ("up", "down")
    )


@pytest.fixture
def roomy_broker(mosquitto_factory: Callable[..., Mosquitto]) -> Mosquitto:
    """A 256 KiB broker that queues without bound for a subscriber that lags (beyond its
    default 1,000 it drops QoS 1 messages: while a large one is fetched for the subscriber,
    or while the test's reader gets no turn)."""
    return mosquitto_factory(max_packet_size=LIMIT, extra_config="max_queued_messages 0")


@pytest.mark.parametrize("version", ["5", "311"])
def test_small_messages_go_through_in_runs_without_a_packet_framed_one_by_one(
    roomy_broker: Mosquitto, unique_topic: Callable[[str], str], tmp_path: Path, version: str
) -> None:
    """5,000 QoS 1 and 5,000 QoS 0 messages of 1,000 bytes, the issue's workload, from MQTT 5
    clients and from MQTT 3.1.1 ones (`mosquitto_pub`'s default; their packets translated
    in the runs): each arrives, in order, and only the packets the proxy must read are
    framed one by one (the CONNECTs, CONNACKs, SUBSCRIBEs, SUBACKs and DISCONNECTs of the
    four clients), not one per message."""
    rng = random.Random(44)
    sent = [text(rng, 1000) for _ in range(5000)]
    proxy = start_proxy(roomy_broker, None)
    try:
        for qos in (1, 0):
            topic = unique_topic("runs")
            sub = Subscriber(roomy_broker, proxy.port, topic, qos, len(sent), version)
            publish_lines(proxy.port, topic, qos, sent, tmp_path, version)
            assert sub.lines() == sent
        assert counted(proxy, "decoded") <= 20, counted(proxy, "decoded")
        # Per message: a PUBLISH each way, and at QoS 1 a PUBACK each way (the subscriber's
        # last ones may still be on their way to the broker).
        wait_until(lambda: counted(proxy, "relayed") >= 30_000, "every packet relayed", 10)
    finally:
        proxy.stop()


@pytest.mark.parametrize("version", ["5", "311"])
def test_a_hundred_thousand_mixed_messages_keep_their_order_and_bytes(
    roomy_broker: Mosquitto,
    gateway_factory: Callable[..., GatewayServer],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
    version: str,
) -> None:
    """100,000 messages at QoS 1 (two publishers, one after the other): small ones (1 to
    400 bytes) in runs, 100 medium ones (60 to 200 KiB: streamed one by one, the run's wait
    ends at 64 KiB) and 20 just over the broker's 256 KiB limit (stored at the gateway,
    their placeholders resolved for the subscriber) among them. The subscriber gets every
    one, in order, each with its SHA-256; from MQTT 5 clients and from MQTT 3.1.1 ones."""
    gateway = gateway_factory(roomy_broker)
    rng = random.Random(4444)
    kinds = ["small"] * 99_880 + ["medium"] * 100 + ["large"] * 20
    rng.shuffle(kinds)
    size = {
        "small": lambda: rng.randint(1, 400),
        "medium": lambda: rng.randint(60 * 1024, 200 * 1024),
        "large": lambda: LIMIT + rng.randint(1, 2000),
    }
    blob = text(rng, LIMIT + 4000)  # payloads are slices of it: quick to make
    sent = []
    for kind in kinds:
        n = size[kind]()
        start = rng.randrange(len(blob) - n + 1)
        sent.append(blob[start : start + n])
    proxy = start_proxy(roomy_broker, gateway)
    try:
        topic = unique_topic("mixed")
        sub = Subscriber(roomy_broker, proxy.port, topic, 1, len(sent), version)
        publish_lines(proxy.port, topic, 1, sent, tmp_path, version)
        got = sub.lines()
        assert len(got) == len(sent)
        digests = [hashlib.sha256(m).digest() for m in got]
        assert digests == [hashlib.sha256(m).digest() for m in sent]
        assert proxy.metric("offload_proxy_offloaded_total") == 20
        assert proxy.metric("offload_proxy_resolved_total") == 20
        assert counted(proxy, "relayed") >= 2 * 99_880  # the small ones both ways, in runs
    finally:
        proxy.stop()


#: What an idle connection (its socket to the client and its own to the broker) may cost
#: the proxy: what it cost before runs (issue 44).
IDLE_CONNECTION_BYTES = 48 * 1024


def idle_connection(port: int, topic: bytes) -> socket.socket:
    """A connection that subscribes to `topic` and gets one small message back through both
    relays, then says nothing more."""
    sock = device(port, "127.0.0.1")
    name = len(topic).to_bytes(2, "big") + topic
    sock.sendall(packet(0x82, b"\x00\x01\x00" + name + b"\x00"))
    assert read(sock)[0] == 0x90  # SUBACK
    sock.sendall(packet(0x30, name + b"\x00" + bytes(100)))
    assert read(sock)[0] == 0x30
    return sock


def test_an_idle_connection_costs_the_proxy_at_most_48_kib(
    broker: Mosquitto, unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    """300 connections that each subscribe, get one small message back and go idle: the
    proxy (its own process) grows by at most 48 KiB of resident memory for each (16 KiB
    measured, before runs and after)."""
    proxy = ProxyProcess(broker, "http://127.0.0.1:9", tmp_path / "proxy.log")
    socks: list[socket.socket] = []
    try:
        for _ in range(50):  # first pages the code in and settles the heaps
            idle_connection(proxy.port, unique_topic("warm").encode()).close()
        time.sleep(0.5)
        base = proxy.rss
        socks = [idle_connection(proxy.port, unique_topic("idle").encode()) for _ in range(300)]
        time.sleep(0.5)
        each = (proxy.rss - base) / len(socks)
        assert each <= IDLE_CONNECTION_BYTES, f"{each / 1024:.1f} KiB per idle connection"
    finally:
        for sock in socks:
            sock.close()
        proxy.stop()


#: What a connection may cost the proxy's CPU, from its CONNECT to its DISCONNECT (issue 44:
#: 0.36-0.42 ms measured by `bench/proxy_relay.py --connects 500 --qos ""`).
CONNECT_CPU_SECONDS = 0.001


def test_a_connect_costs_the_proxy_at_most_a_millisecond_of_cpu(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """300 connections one after the other (CONNECT, CONNACK, DISCONNECT, closed): the
    proxy's own process spends at most 1 ms of CPU (user and system) on each."""
    proxy = ProxyProcess(broker, "http://127.0.0.1:9", tmp_path / "proxy.log")

    def once() -> None:
        sock = device(proxy.port, "127.0.0.1")
        sock.sendall(b"\xe0\x00")  # DISCONNECT
        assert until_closed(sock) == b""

    def cpu() -> float:
        times = proxy.process.cpu_times()
        return float(times.user + times.system)

    try:
        for _ in range(30):  # pages the code in
            once()
        before = cpu()
        for _ in range(300):
            once()
        each = (cpu() - before) / 300
        assert each <= CONNECT_CPU_SECONDS, f"{each * 1000:.2f} ms of CPU per connect"
    finally:
        proxy.stop()


@pytest.mark.parametrize(
    ("case", "body", "reason"),
    [
        ("a wildcard in the topic", b"\x00\x03a/#\x00\x01\x00x", 0x82),
        ("packet id 0", b"\x00\x01a\x00\x00\x00x", 0x82),
        ("a topic that is not UTF-8", b"\x00\x01\xff\x00\x01\x00x", 0x81),
        ("an unknown property", b"\x00\x01a\x00\x01\x02\x00\x00x", 0x81),
    ],
)
def test_a_malformed_publish_passed_unread_is_refused_by_the_broker(
    broker: Mosquitto, case: str, body: bytes, reason: int
) -> None:
    """A PUBLISH whose fixed header and property block the run reads, but whose strings it
    does not, goes to the broker as it came; the broker refuses it, and the client gets the
    broker's DISCONNECT and its connection ends at once (before runs, the proxy's own
    0x81): nothing is left open, and nothing but the CONNECT was framed one by one."""
    proxy = start_proxy(broker, None)
    try:
        sock = device(proxy.port, "127.0.0.1")
        sock.sendall(packet(0x32, body))
        assert until_closed(sock) == bytes([0xE0, 1, reason]), case
        assert proxy.metric("offload_proxy_packets_decoded_total", direction="up") == 1
    finally:
        proxy.stop()
