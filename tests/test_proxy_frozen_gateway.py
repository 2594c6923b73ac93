"""offload-proxy with a gateway that accepts and never answers (issue 51 §1): the real
`offload-gateway` frozen with SIGSTOP, real mosquitto with a password file, unmodified
devices (mosquitto_pub).

A device's large PUBLISH gets its answer within the proxy's `http_timeout` (MQTT 5: PUBACK
0x80, the gateway may answer a resend; 3.1.1: the connection closed); a device that leaves
while its upload waits has it abandoned: when the gateway resumes, nothing is stored or
published for it (before: mosquitto_pub waited 119 s, and the proxy published the
placeholder once the gateway resumed).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_proxy import MiB, PahoPeer, start_proxy

from proxy import _departure

from _auth import AUTH_SECRET, credential_files
from _frozen import (
    ESTABLISHED,
    LISTEN,
    TIME_WAIT,
    TcpSocket,
    Trickler,
    ends_within,
    frozen,
    tcp_sockets,
    written,
)
from _gateway import GatewayProcess
from _proxy import ProxyServer
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers

USER, PASSWORD = "alice", "alice-secret"
#: Anonymous devices may write `frozen/#` too (their upload sends its body at once).
ACL = "topic readwrite frozen/#\nuser alice\ntopic readwrite frozen/#\n"
TIMEOUT = 2.0


@dataclass
class Stack:
    broker: Mosquitto
    gateway: GatewayProcess
    store: Path

    @property
    def pid(self) -> int:
        assert self.gateway.proc is not None
        return self.gateway.proc.pid

    def stored(self) -> list[Path]:
        """The files of the gateway's store (payloads, manifests, index)."""
        return sorted(p for p in self.store.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with credential_files("offload-proxy-frozen-", {USER: PASSWORD}, ACL) as files:
        broker = Mosquitto(
            max_packet_size=262144,
            extra_config=f"allow_anonymous true\npassword_file {files / 'passwd'}\n"
            f"acl_file {files / 'acl'}\n",
        ).start()
        store = tmp_path_factory.mktemp("frozen-store")
        gw = GatewayProcess(
            {
                "OFFLOAD_STORAGE_URL": f"file://{store}",
                "OFFLOAD_PASSWORD_FILE": str(files / "passwd"),
                "OFFLOAD_ACL_FILE": str(files / "acl"),
                "OFFLOAD_AUTH_SECRET": AUTH_SECRET,
                "OFFLOAD_ALLOW_ANONYMOUS": "true",
                "OFFLOAD_SWEEP_INTERVAL": "0",
                "OFFLOAD_LOG_LEVEL": "WARNING",
            }
        ).start()
        try:
            yield Stack(broker, gw, store)
        finally:
            gw.kill()
            broker.close()


@pytest.fixture
def proxy_for(stack: Stack) -> Iterator[Callable[..., ProxyServer]]:
    started: list[ProxyServer] = []

    def start(http_timeout: float, **settings: Any) -> ProxyServer:
        server = start_proxy(stack.broker, stack.gateway, http_timeout=http_timeout, **settings)  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _pub(port: int, topic: str, file: Path, version: str, login: bool) -> list[str]:
    creds = ["-u", USER, "-P", PASSWORD] if login else []
    return ["mosquitto_pub", "-p", str(port), "-t", topic, "-f", str(file), "-q", "1",
            "-V", version, "-i", f"dev-{os.getpid()}-{time.monotonic_ns()}", *creds]  # fmt: skip


def _links() -> int:
    """The proxy's transfer threads alive (it runs in this process)."""
    return sum(1 for t in threading.enumerate() if t.name == "gateway-link")


@pytest.fixture
def big(tmp_path: Path) -> Path:
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(2 * MiB))
    return path


@pytest.mark.parametrize("version", ["5", "311"])
def test_a_device_gets_its_answer_within_the_proxys_timeout(
    stack: Stack,
    proxy_for: Callable[..., ProxyServer],
    big: Path,
    unique_topic: Callable[[str], str],
    version: str,
) -> None:
    """mosquitto_pub of 2 MiB, SCRAM login: MQTT 5 gets PUBACK 0x80 (the gateway did not
    answer: a resend may succeed), 3.1.1 its connection closed; nothing published."""
    server = proxy_for(TIMEOUT)
    topic = unique_topic("frozen/answer")
    watcher = PahoPeer(stack.broker.port)
    watcher.subscribe(stack.broker, topic)
    with frozen(stack.pid):
        ended = ends_within(
            lambda: subprocess.run(
                _pub(server.port, topic, big, version, login=True),
                capture_output=True, text=True, timeout=60,
            ),
            TIMEOUT,
            slack=2.0,  # mosquitto_pub's start and its 2 MiB
        )  # fmt: skip
    done = ended.result
    if version == "5":  # mosquitto_pub warns, and exits 0
        assert "Publish 1 failed: Unspecified error" in done.stderr, done.stderr
    else:
        assert done.returncode != 0, done.stderr
    assert server.metric("offload_proxy_offload_failures_total", why="128") == 1  # 0x80
    assert server.metric("offload_proxy_offloaded_total") == 0
    time.sleep(0.5)
    assert watcher.messages == []
    watcher.close()


def _ends(server: ProxyServer) -> tuple[TcpSocket, TcpSocket]:
    """The device's socket to the proxy and the proxy's to it (one device at a time here)."""
    sockets = [s for s in tcp_sockets(server.port) if s.state not in (LISTEN, TIME_WAIT)]
    (device,) = (s for s in sockets if s.remote == server.port)
    (proxy,) = (s for s in sockets if s.local == server.port)
    return device, proxy


@pytest.mark.parametrize("path", ["stream", "link"])
@pytest.mark.parametrize("login", [True, False], ids=["scram", "anonymous"])
def test_a_device_that_left_has_its_upload_abandoned(
    stack: Stack,
    proxy_for: Callable[..., ProxyServer],
    tmp_path: Path,
    unique_topic: Callable[[str], str],
    login: bool,
    path: str,
) -> None:
    """The device leaves (killed) while its offload waits on the frozen gateway, long before
    the proxy's timeout; the gateway then resumes. The offload was abandoned when the device
    left: nothing stored, nothing published, no `offloaded`, and its thread ended then,
    not at the timeout. `stream`: the upload streams (dedup off): with SCRAM its body never
    went (the login's probe waited); anonymously it went at once, and its connection is
    reset, so the gateway keeps nothing. `link`: a payload under the dedup bound is read
    whole and the gateway asked to link it first: that call's connection is reset too.

    The device's whole PUBLISH is in the proxy's socket before it is killed (its send queue
    empty: 512 KiB fit the proxy's buffers), so its FIN follows at once.
    """
    server = proxy_for(60.0, dedup_bytes=0 if path == "stream" else MiB)
    topic = unique_topic("frozen/left")
    payload = tmp_path / "payload.bin"
    payload.write_bytes(os.urandom(MiB // 2))
    watcher = PahoPeer(stack.broker.port)
    watcher.subscribe(stack.broker, topic)
    before, threads = stack.stored(), _links()
    with frozen(stack.pid):
        device = subprocess.Popen(
            _pub(server.port, topic, payload, "5", login),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(lambda: _links() > threads, "the gateway call under way", 20)
        wait_until(lambda: _ends(server)[0].unsent == 0, "the whole PUBLISH in the proxy", 20)
        device.send_signal(signal.SIGKILL)
        device.wait(10)
        wait_until(
            lambda: server.metric("offload_proxy_offload_failures_total", why="client-left") == 1,
            "the offload abandoned",
            5,
        )
        # Its connection was cut: its thread does not wait for the gateway or the timeout.
        wait_until(lambda: _links() <= threads, "the gateway call's thread ended", 5)
    time.sleep(2.0)  # the gateway resumed: whatever it was sent, it has now
    assert server.metric("offload_proxy_offloaded_total") == 0
    streamed = server.metric("offload_proxy_uploaded_bytes_total")
    assert streamed > 0 if path == "stream" else streamed == 0
    assert watcher.messages == []
    assert stack.stored() == before
    assert server.metric("offload_proxy_uploads") == 0
    watcher.close()


def test_a_device_gone_with_its_publish_half_sent_gets_nothing_published(
    stack: Stack,
    proxy_for: Callable[..., ProxyServer],
    tmp_path: Path,
    unique_topic: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The device is killed while the gateway is frozen with part of its 4 MiB PUBLISH in
    its kernel's send queue (the proxy stopped reading: its upload's channel is full): that
    socket sends its FIN only after the rest, so the proxy's side stays ESTABLISHED and the
    departure cannot be seen. When the gateway resumes, the rest and then the FIN arrive and
    the upload ends (201): the proxy looks once more before it publishes, and publishes
    nothing (before: the placeholder went out for the device gone, unless the departure
    watch happened to look in between; here it looks only when the upload starts). The
    payload stays in the store until its TTL (the PUBLISH's Message Expiry Interval): the
    gateway has no deletion for its uploader."""
    caplog.set_level(logging.INFO, logger="proxy")
    monkeypatch.setattr(_departure, "POLL", 3600.0)
    server = proxy_for(60.0)
    topic, size, expiry = unique_topic("frozen/half"), 4 * MiB, 600
    payload = tmp_path / "payload.bin"
    payload.write_bytes(os.urandom(size))
    watcher = PahoPeer(stack.broker.port)
    watcher.subscribe(stack.broker, topic)
    before = set(stack.stored())
    with frozen(stack.pid):
        device = subprocess.Popen(
            [*_pub(server.port, topic, payload, "5", login=True),
             "-D", "publish", "message-expiry-interval", str(expiry)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        # Its CONNECT and the PUBLISH's header are more than the topic: it is all written.
        wait_until(lambda: written(device.pid) >= size + len(topic), "the PUBLISH written", 20)
        time.sleep(0.5)  # the proxy takes what its buffers hold, then nothing more
        assert _ends(server)[0].unsent > 0, "the proxy took it all: make the payload larger"
        device.send_signal(signal.SIGKILL)
        device.wait(10)
        time.sleep(0.5)
        assert _ends(server)[1].state == ESTABLISHED  # the FIN waits behind the rest
    wait_until(
        lambda: server.metric("offload_proxy_offload_failures_total", why="client-left") == 1,
        "the offload abandoned once stored",
        20,
    )
    time.sleep(0.5)
    assert watcher.messages == []
    assert server.metric("offload_proxy_offloaded_total") == 0
    assert server.metric("offload_proxy_uploaded_bytes_total") == size
    (index,) = (p for p in set(stack.stored()) - before if p.parent.name == "ids")
    expires = json.loads(index.read_text())["expires"] / 1000
    assert time.time() < expires <= time.time() + expiry
    (line,) = (r for r in caplog.records if r.getMessage().startswith("offload abandoned"))
    assert getattr(line, "id", None) == index.stem
    watcher.close()


def test_a_placeholder_whose_fetch_gets_no_answer_is_handed_on_within_the_timeout(
    stack: Stack,
    proxy_for: Callable[..., ProxyServer],
    unique_topic: Callable[[str], str],
) -> None:
    """A subscriber through the proxy gets a retained placeholder while the gateway is
    frozen: the fetch (SCRAM, the subscriber's login) ends at the timeout and the
    placeholder is handed on as it came, as for an unreachable gateway."""
    from client import Client

    server = proxy_for(TIMEOUT)
    topic = unique_topic("frozen/fetch")
    with Client(
        stack.broker.url, username=USER, password=PASSWORD, endpoint=stack.gateway.url
    ) as publisher:
        sent = publisher.publish(topic, os.urandom(MiB), qos=1, retain=True)
    assert sent.url is not None
    with frozen(stack.pid):
        subscriber = PahoPeer(server.port, credentials=(USER, PASSWORD))
        start = time.monotonic()
        subscriber.subscribe(stack.broker, topic, qos=1)
        got = subscriber.wait(1)
        took = time.monotonic() - start
    assert took <= TIMEOUT + 2.0, took
    assert b'"_format"' in got[0].payload and len(got[0].payload) < 4096  # the placeholder
    assert server.metric("offload_proxy_resolved_total") == 0
    subscriber.close()


def test_a_gateway_that_answers_a_byte_at_a_time_gets_the_device_its_answer(
    stack: Stack, unique_topic: Callable[[str], str], big: Path
) -> None:
    """The proxy's gateway takes the body but answers a byte every half second: no read
    waits the timeout, yet the device gets PUBACK 0x80 a timeout after its body (before:
    it waited as long as the answer trickled)."""
    peer = Trickler("answers")
    server = start_proxy(stack.broker, peer, http_timeout=TIMEOUT)  # type: ignore[arg-type]
    try:
        ended = ends_within(
            lambda: subprocess.run(
                _pub(server.port, unique_topic("frozen/trickle"), big, "5", login=False),
                capture_output=True, text=True, timeout=60,
            ),
            TIMEOUT * 1.5,  # the whole answer is due 1.5 timeouts after the body
            slack=3.0,  # mosquitto_pub's start and its 2 MiB
        )  # fmt: skip
        assert "Publish 1 failed: Unspecified error" in ended.result.stderr, ended.result
        assert server.metric("offload_proxy_offloaded_total") == 0
    finally:
        server.stop()
        peer.close()
