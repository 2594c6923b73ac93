"""A fleet behind one offload-proxy: what connections that never log in may cost, the
descriptor limit, and the log under attack (issue 42, with tests/test_proxy_fleet.py).

The memory and descriptor tests run `offload-proxy` as its own process (its resident size
and its open-file limit are the process's); the log test runs it in this process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from test_proxy import MiB, PahoPeer, start_proxy
from test_proxy_fleet import acknowledged, delivered, device, publish_head
from test_proxy_hostile import _packet, _read, _text, _varint, connect_packet, until_closed

from _gateway import GatewayServer
from _servers import Mosquitto, free_port, wait_for_port, wait_until

pytestmark = pytest.mark.servers

ROOT = Path(__file__).resolve().parent.parent


class ProxyProcess:
    """`offload-proxy` as its own process, its JSON log lines in a file."""

    def __init__(
        self,
        broker: Mosquitto,
        endpoint: str,
        log: Path,
        nofile: tuple[int, int] | None = None,
        **env: str,
    ) -> None:
        self.port = free_port()
        self.log = log
        variables = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
        variables.update({f"OFFLOAD_PROXY_{k.upper()}": v for k, v in env.items()})
        variables["PYTHONPATH"] = str(ROOT)

        def limit() -> None:
            if nofile is not None:  # (soft, hard)
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

        command = [sys.executable, "-m", "proxy.cli", "--broker", broker.url]
        command += ["--port", str(self.port), "--endpoint", endpoint]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                command, env=variables, stdout=subprocess.DEVNULL, stderr=out, preexec_fn=limit
            )
        wait_for_port(self.port, 30, self.proc)
        self.process = psutil.Process(self.proc.pid)

    @property
    def rss(self) -> int:
        return int(self.process.memory_info().rss)

    def lines(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture
def proxy_process(
    broker: Mosquitto, gateway: GatewayServer, tmp_path: Path
) -> Iterator[Callable[..., ProxyProcess]]:
    started: list[ProxyProcess] = []

    def start(nofile: tuple[int, int] | None = None, **env: str) -> ProxyProcess:
        log = tmp_path / f"proxy-{len(started)}.log"
        proxy = ProxyProcess(broker, gateway.url, log, nofile, **env)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


class Peak:
    """The largest resident size of a process, sampled every 20 ms until stopped."""

    def __init__(self, proxy: ProxyProcess) -> None:
        self.most = proxy.rss
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(proxy,), daemon=True)
        self._thread.start()

    def _run(self, proxy: ProxyProcess) -> None:
        while not self._done.wait(0.02):
            self.most = max(self.most, proxy.rss)

    def stop(self) -> int:
        self._done.set()
        self._thread.join(5)
        return self.most


def stalled_connects(
    port: int, sources: list[str], size: int, count: int, send: int | None = None
) -> list[socket.socket]:
    """`count` connections round the `sources`, each announcing a CONNECT of `size` bytes
    and sending `send` bytes of it (all but the last by default)."""
    socks = []
    for i in range(count):
        sock = socket.socket()
        sock.bind((sources[i % len(sources)], 0))
        sock.connect(("127.0.0.1", port))
        with contextlib.suppress(OSError):  # refused at once: reset while sending
            sock.sendall(b"\x10" + _varint(size) + bytes(size - 1 if send is None else send))
        socks.append(sock)
    return socks


def test_connects_that_never_log_in_hold_a_bounded_budget_freed_at_the_timeout(
    proxy_process: Callable[..., ProxyProcess],
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
) -> None:
    """400 CONNECTs of 1 MiB, no login: before, the proxy went from 95 to 510 MiB and
    stayed there after the CONNECT timeout. Now a CONNECT is at most `max_connect_bytes`
    (128 KiB); what all the connections waiting for their login hold is counted against
    `max_login_bytes` (64 MiB), one address at most an eighth; the heaps are trimmed once
    they are gone; the rest of the fleet logs in meanwhile."""
    budget = 64 * MiB  # the default
    proxy = proxy_process(connect_timeout="3")
    warm = PahoPeer(proxy.port)  # one whole session first: the baseline has its code paged in
    warm.close()
    base = proxy.rss
    sampler = Peak(proxy)
    big = stalled_connects(proxy.port, ["127.0.3.1"], MiB, 400)
    most = stalled_connects(proxy.port, [f"127.0.3.{i}" for i in range(10, 30)], 128 * 1024, 400)
    sub = PahoPeer(proxy.port, bind_address="127.0.3.200")  # logins from elsewhere go on
    pub = PahoPeer(proxy.port, bind_address="127.0.3.201")
    try:
        topic = unique_topic("during")
        sub.subscribe(broker, topic, qos=1)
        payload = os.urandom(2 * MiB)
        assert acknowledged(pub, topic, payload) == 0
        assert delivered(sub)[0].payload == payload
        peak = sampler.stop()
        # Bounded: the budget (counted twice over what the CONNECTs hold) and slack for the
        # sessions above and the allocator.
        assert peak - base < budget + 24 * MiB, (base, peak)
        refused = [
            line for line in proxy.lines() if "no room for a CONNECT" in str(line.get("why"))
        ]
        assert refused  # the budget said no, at once
        assert sum(until_closed(sock) == b"" for sock in big) == 400  # 1 MiB: refused at once
        # Freed at the CONNECT timeout: the stalled ones are closed, the heaps trimmed.
        wait_until(lambda: proxy.rss - base < 12 * MiB, "memory given back", 20)
    finally:
        for sock in big + most:
            sock.close()
        sub.close()
        pub.close()


def test_the_login_budget_counts_what_a_connect_sent_not_what_it_announced(
    gateway: GatewayServer, broker: Mosquitto
) -> None:
    """Announcing a large CONNECT and sending a few bytes of it costs the budget those bytes
    (and 4 KiB), not what was announced: 40 such connections from one address fit in its
    share, one that really sends its 64 KiB CONNECT does not."""
    proxy = start_proxy(
        broker, gateway, connect_timeout=3.0, max_connect_bytes=65536, max_login_bytes=1 << 20
    )  # the address's share: 2 x 64 KiB + 64 KiB
    share = proxy.proxy.settings.login_shares.per_address
    assert share == 196608
    try:
        announced = stalled_connects(proxy.port, ["127.0.10.1"], 65536, 40, send=10)
        wait_until(lambda: proxy.call(lambda: proxy.proxy.services.logins.used) >= 40 * 4096,
                   "40 logins counted", 10)  # fmt: skip
        assert proxy.metric("offload_proxy_refused_connections_total", why="login-budget") == 0
        (sent,) = stalled_connects(proxy.port, ["127.0.10.1"], 65536, 1)
        assert until_closed(sent) == b""  # closed at once: no room left in its share
        assert proxy.metric("offload_proxy_refused_connections_total", why="login-budget") == 1
        for sock in announced:
            sock.close()
    finally:
        proxy.stop()


SERVER_BUSY = b"\x20\x03\x00\x89\x00"  # CONNACK, Server busy


def refused_from(port: int, source: str) -> bytes:
    """All the proxy answers a CONNECT from `source` with before it closes (30 s at most)."""
    sock = socket.socket()
    sock.settimeout(30)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.sendall(connect_packet(5))
    return until_closed(sock)


def test_the_descriptor_limit_is_checked_at_start_so_the_0x89_holds(
    proxy_process: Callable[..., ProxyProcess],
) -> None:
    """A hard open-file limit below 2 x `max_connections`: before, connections beyond what
    fitted got 0x88 or a reset instead of the documented 0x89. Now `max_connections` is
    lowered to fit at start, with a warning (it was set), and the next connection gets
    0x89."""
    proxy = proxy_process(nofile=(400, 400), max_connections="1000")
    lowered = [line for line in proxy.lines() if "max_connections lowered" in str(line["message"])]
    assert len(lowered) == 1 and lowered[0]["level"] == "WARNING"
    fitted = int(str(lowered[0]["max_connections"]))
    assert 0 < fitted < 200
    socks = [device(proxy.port, f"127.0.7.{i + 1}") for i in range(fitted)]
    try:
        assert refused_from(proxy.port, "127.0.8.1") == SERVER_BUSY
    finally:
        for sock in socks:
            sock.close()


def test_a_default_start_says_what_the_descriptors_allow_without_a_warning(
    proxy_process: Callable[..., ProxyProcess],
) -> None:
    """A default start where soft and hard limit are both 20,000 (issue 51): before, the
    proxy logged "open-file limit raised 20000 -> 20000" and warned that max_connections
    was lowered (the default 10,000 needs 20,320 descriptors), each worker. Now the limit
    is raised only when it can be, and the default fitted to it is one INFO line."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = min(hard, 20000)
    proxy = proxy_process(nofile=(limit, limit))
    lines = proxy.lines()
    assert not [line for line in lines if line["level"] in ("WARNING", "ERROR")]
    assert not [line for line in lines if line["message"] == "open-file limit raised"]
    fitted = [line for line in lines if "what the open-file limit allows" in line["message"]]
    if limit < 20320:
        assert len(fitted) == 1 and fitted[0]["max_connections"] == (limit - 320) // 2


def test_the_soft_descriptor_limit_is_raised_toward_the_hard_one(
    proxy_process: Callable[..., ProxyProcess],
) -> None:
    """A soft limit below what `max_connections` needs and a hard one above: raised."""
    proxy = proxy_process(nofile=(256, 4096), max_connections="1000")
    assert not [line for line in proxy.lines() if line["level"] in ("WARNING", "ERROR")]
    raised = [line for line in proxy.lines() if line["message"] == "open-file limit raised"]
    assert len(raised) == 1 and raised[0]["from"] == 256
    soft, hard = proxy.process.rlimit(psutil.RLIMIT_NOFILE)
    assert 2 * 1000 < soft <= hard == 4096


def test_one_address_holds_at_most_its_share_of_the_connections(
    gateway: GatewayServer, broker: Mosquitto
) -> None:
    """One address opening connections without end: beyond its share (an eighth of
    `max_connections` by default) it gets CONNACK 0x89; other addresses connect."""
    proxy = start_proxy(broker, gateway, max_connections=16)  # 2 per address
    held = [device(proxy.port, "127.0.9.1") for _ in range(2)]
    try:
        assert refused_from(proxy.port, "127.0.9.1") == SERVER_BUSY
        device(proxy.port, "127.0.9.2").close()  # another address: served
        why = "max-connections-per-address"
        assert proxy.metric("offload_proxy_refused_connections_total", why=why) == 1
    finally:
        for sock in held:
            sock.close()
        proxy.stop()


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_expected_disconnects_are_one_info_line_never_a_traceback(
    gateway: GatewayServer,
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Connections that stall or reset at every stage: before, each stalled CONNECT body
    was an ERROR traceback in the log (862 in one run). Now each is an INFO line."""
    proxy = start_proxy(broker, gateway, connect_timeout=1.0, idle_timeout=1.0)
    caplog.set_level(logging.INFO, logger="proxy")
    topic = unique_topic("logs")
    try:
        head_only = socket.create_connection(("127.0.0.1", proxy.port))
        head_only.sendall(b"\x10")  # a CONNECT's first byte, then nothing
        body_stalls = socket.create_connection(("127.0.0.1", proxy.port))
        body_stalls.sendall(connect_packet(5)[:8])  # its length and part of its body
        reset_in_connect = socket.create_connection(("127.0.0.1", proxy.port))
        reset_in_connect.sendall(connect_packet(5)[:8])
        publish_stalls = device(proxy.port, "127.0.0.1")
        publish_stalls.sendall(publish_head(topic, 2 * MiB) + bytes(MiB))  # then nothing
        reset_in_publish = device(proxy.port, "127.0.0.1")
        reset_in_publish.sendall(publish_head(topic, 2 * MiB) + bytes(MiB))
        reader = device(proxy.port, "127.0.0.1", rcvbuf=4096)  # resets while it is written to
        reader.sendall(_packet(0x82, b"\x00\x01\x00" + _text(topic) + b"\x00"))
        assert _read(reader)[0] == 0x90
        pub = PahoPeer(proxy.port)
        pub.client.publish(topic, os.urandom(4 * MiB), qos=1).wait_for_publish(30)
        written = lambda: proxy.metric("offload_proxy_shared_bytes") == 4 * MiB  # noqa: E731
        wait_until(written, "the payload written", 20)
        _reset(reader)
        _reset(reset_in_connect)
        _reset(reset_in_publish)
        pub.close()
        for sock in (head_only, body_stalls, publish_stalls):
            until_closed(sock)  # each closed by the proxy at its deadline
        wait_until(lambda: proxy.metric("offload_proxy_connections") == 0, "all ended", 20)
        records = [r for r in caplog.records if r.name == "proxy"]
        assert [r for r in records if r.levelno >= logging.ERROR or r.exc_info] == []
        ended = [r for r in records if r.getMessage().startswith(("connection", "protocol"))]
        # One line for each of the six (the publisher said DISCONNECT: none for it).
        assert len(ended) == 6, [r.getMessage() for r in records]
    finally:
        proxy.stop()


class LoginBroker:
    """An MQTT 5 endpoint for one connection that records the type of every packet it
    gets, in order. To a CONNECT with an Authentication Method it answers AUTH (Continue),
    and to the client's AUTH CONNACK 0; to one without, CONNACK 0 after `delay` seconds,
    noting whether anything came meanwhile."""

    def __init__(self, delay: float = 0.0) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.got: list[int] = []
        self.before_connack: bytes | None = None
        self._delay = delay
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError, AssertionError):
            conn, _ = self.listener.accept()
            first, body = _read(conn)
            self.got.append(first >> 4)
            if b"\x15\x00\x06X-TEST" in body:
                method = b"\x15" + _text("X-TEST")
                conn.sendall(_packet(0xF0, b"\x18" + _varint(len(method)) + method))
            else:
                time.sleep(self._delay)
                conn.setblocking(False)
                try:
                    self.before_connack = conn.recv(65536)
                except BlockingIOError:
                    self.before_connack = b""
                conn.setblocking(True)
                conn.sendall(b"\x20\x03\x00\x00\x00")
            while True:
                first, _ = _read(conn)
                self.got.append(first >> 4)
                if first >> 4 == 15:  # the client's AUTH: accepted
                    conn.sendall(b"\x20\x03\x00\x00\x00")

    def close(self) -> None:
        self.listener.close()


@contextlib.contextmanager
def proxy_for(broker: LoginBroker) -> Iterator[int]:
    from proxy import ProxySettings

    from _proxy import ProxyServer

    settings = ProxySettings(  # an endpoint: no discovery link takes the broker's connection
        broker=f"mqtt://127.0.0.1:{broker.port}", port=0, endpoint="http://127.0.0.1:9"
    )
    server = ProxyServer(settings).start()
    try:
        yield server.port
    finally:
        server.stop()
        broker.close()


EARLY = _packet(0x30, _text("login/early") + b"\x00" + b"sent before the CONNACK")


def test_what_a_client_sends_after_its_connect_waits_for_the_login() -> None:
    """A client may send packets right after its CONNECT: they wait until the broker has
    accepted the login (nothing is relayed, and nothing uploaded, on credentials the broker
    has not accepted), then go through in order."""
    broker = LoginBroker(delay=0.5)
    with proxy_for(broker) as port:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(connect_packet(5) + EARLY)
        first, connack = _read(sock)
        assert first == 0x20 and connack[1] == 0
        wait_until(lambda: len(broker.got) == 2, "the early PUBLISH, after the login", 10)
        assert broker.before_connack == b"" and broker.got == [1, 3]
        sock.close()


def test_enhanced_authentication_passes_both_ways_before_the_connack() -> None:
    """MQTT 5 AUTH packets pass both ways before the CONNACK; any other packet from a client
    that asked for enhanced authentication is a protocol error there (MQTT-3.1.2-30)."""
    method = b"\x15" + _text("X-TEST")
    body = _text("MQTT") + bytes([5, 0x02]) + (0).to_bytes(2, "big")
    connect = _packet(0x10, body + _varint(len(method)) + method + _text("auth-client"))
    auth = _packet(0xF0, b"\x18" + _varint(len(method)) + method)
    broker = LoginBroker()
    with proxy_for(broker) as port:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(connect)
        assert _read(sock)[0] == 0xF0  # the broker's AUTH, relayed
        sock.sendall(auth)
        first, connack = _read(sock)
        assert first == 0x20 and connack[1] == 0
        sock.sendall(EARLY)
        wait_until(lambda: len(broker.got) == 3, "the PUBLISH", 10)
        assert broker.got == [1, 15, 3]  # CONNECT, AUTH, then the PUBLISH
        sock.close()
    broker = LoginBroker()
    with proxy_for(broker) as port:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(connect + EARLY)
        # (the broker's AUTH perhaps first, as the two directions raced)
        assert until_closed(sock).endswith(b"\xe0\x01\x82")  # DISCONNECT, Protocol Error
        # The broker's thread may read the CONNECT after the client has its DISCONNECT.
        wait_until(lambda: len(broker.got) > 0, "the CONNECT at the broker", 10)
        time.sleep(0.2)  # and nothing after it
        assert broker.got == [1]


def test_a_session_keeps_little_of_a_large_connect() -> None:
    """A CONNECT of up to `max_connect_bytes` (a 60 KB user property, a password, a Will)
    is not held for the connection's life: 500 such logins held 152 MiB more, 38 after."""
    from proxy.protocol import parse_connect, slim

    props = b"\x27" + (1 << 20).to_bytes(4, "big")  # Maximum Packet Size
    props += b"\x26" + _text("_offload") + _text("placeholders")
    props += b"\x26" + _text("big") + _text("v" * 60000)
    body = _text("MQTT") + bytes([5, 0xC6]) + (60).to_bytes(2, "big")  # user, password, Will
    body += _varint(len(props)) + props + _text("client")
    body += b"\x00" + _text("will/topic") + _text(b"w" * 30000) + _text("user") + _text("pw")
    connect = parse_connect(body)
    kept = slim(connect)
    assert (kept.client_id, kept.username, kept.v5, kept.keepalive) == ("client", "user", True, 60)
    assert kept.max_packet_size == 1 << 20 and kept.handles_placeholders
    assert kept.will is None and kept.password is None and kept.body == b""
    assert sum(len(p.raw) for p in kept.properties) < 100
