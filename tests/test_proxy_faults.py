"""offload-proxy under faults: `offload-proxy` killed mid-upload and started again (its
clients reconnect and their QoS 1 resend arrives, nothing half-published), the broker
restarted (clients reconnect through the proxy); /metrics and /healthz of the process."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from test_proxy import MiB, PahoPeer, proxy, start_proxy  # noqa: F401 - the fixture

from _gateway import GatewayServer
from _proxy import ProxyServer
from _servers import Mosquitto, free_port, wait_for_port, wait_until

pytestmark = pytest.mark.servers

ROOT = Path(__file__).resolve().parent.parent


class ProxyProcess:
    """`offload-proxy` as its own process, configured through OFFLOAD_PROXY_* variables."""

    def __init__(self, broker: Mosquitto, gateway: GatewayServer) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "OFFLOAD_PROXY_BROKER": broker.url,
            "OFFLOAD_PROXY_ENDPOINT": gateway.url,
            "OFFLOAD_PROXY_PORT": str(self.port),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ProxyProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "--metrics-port", str(self.metrics_port)],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for_port(self.port, 30, self.proc)
        wait_for_port(self.metrics_port, 30, self.proc)
        return self

    def metric(self, name: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics").text
        found = re.search(rf"^{name} (\S+)$", text, re.M)
        return float(found[1]) if found else 0.0

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None:
            self.proc.send_signal(sig)
            self.proc.wait(30)
            self.proc = None


@pytest.fixture
def proxy_process(broker: Mosquitto, gateway: GatewayServer) -> Iterator[ProxyProcess]:
    process = ProxyProcess(broker, gateway).start()
    yield process
    process.stop()


def test_proxy_killed_mid_upload_clients_reconnect_and_the_resend_arrives(
    proxy_process: ProxyProcess, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    health = httpx.get(f"http://127.0.0.1:{proxy_process.metrics_port}/healthz")
    assert health.status_code == 200
    topic = unique_topic("killed")
    watcher = PahoPeer(broker.port)  # straight on the broker: every placeholder published
    watcher.subscribe(broker, topic)
    pub = PahoPeer(proxy_process.port)
    payload = os.urandom(64 * MiB)  # long enough to be killed in the middle
    info = pub.client.publish(topic, payload, qos=1)
    wait_until(lambda: proxy_process.metric("offload_proxy_uploaded_bytes_total") > 0,
               "the upload under way", 60)  # fmt: skip
    proxy_process.stop(signal.SIGKILL)
    wait_until(lambda: not pub.client.is_connected(), "the client saw the proxy go", 30)
    proxy_process.start()  # same port: paho reconnects and resends the unacknowledged PUBLISH
    info.wait_for_publish(120)
    assert info.is_published()
    placeholders = watcher.wait(1)
    assert len(placeholders) == 1  # the resend, once; nothing half-published before it
    sub = PahoPeer(proxy_process.port)
    sub.subscribe(broker, topic + "/check")
    pub.client.publish(topic + "/check", payload[: 2 * MiB], qos=1).wait_for_publish(60)
    assert (
        hashlib.sha256(sub.wait(1)[0].payload).digest()
        == hashlib.sha256(payload[: 2 * MiB]).digest()
    )
    for peer in (watcher, pub, sub):
        peer.close()


def test_broker_restarted_clients_reconnect_through_the_proxy(
    proxy: ProxyServer,  # noqa: F811
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
) -> None:
    topic = unique_topic("restart")
    pub = PahoPeer(proxy.port)
    dropped: list[object] = []
    pub.client.on_disconnect = lambda *a: dropped.append(a)
    broker.restart()  # same port
    wait_until(lambda: bool(dropped), "the client saw its broker link go", 30)
    wait_until(pub.client.is_connected, "reconnected through the proxy", 60)
    sub = PahoPeer(proxy.port)
    sub.subscribe(broker, topic)
    payload = os.urandom(MiB)
    pub.client.publish(topic, payload, qos=1).wait_for_publish(60)
    assert sub.wait(1)[0].payload == payload
    pub.close()
    sub.close()


def test_shutdown_finishes_the_upload_under_way_and_its_ack(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    from test_proxy import start_proxy

    server = start_proxy(broker, gateway)
    topic = unique_topic("shutdown")
    watcher = PahoPeer(broker.port)
    watcher.subscribe(broker, topic)
    pub = PahoPeer(server.port)
    acks: list[object] = []
    pub.client.on_publish = lambda _c, _u, mid, rc, _p: acks.append(rc)
    info = pub.client.publish(topic, os.urandom(64 * MiB), qos=1)
    wait_until(lambda: server.metric("offload_proxy_uploaded_bytes_total") > 0,
               "the upload under way", 60)  # fmt: skip
    server.stop()  # SIGTERM's path: close(), with the default 30 s for transfers
    assert info.is_published() and [rc.value for rc in acks] == [0]  # type: ignore[attr-defined]
    assert len(watcher.wait(1)) == 1
    watcher.close()
    pub.close()


def test_shutdown_is_not_held_by_a_fetch_stalled_on_a_silent_store(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto,
    unique_topic: Callable[[str], str],
) -> None:  # fmt: skip
    """A placeholder's payload comes from a store (the gateway's redirect) that sends the
    answer's head and a first piece, then nothing. The proxy's fetch thread waits in that
    read until the HTTP timeout (120 s here); stopping the proxy must not wait for it."""
    size = 400 * 1024
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def stalling_store() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                conn.recv(65536)
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode()
                conn.sendall(head + bytes(1000))  # then silence
                held.append(conn)

    threading.Thread(target=stalling_store, daemon=True).start()
    port = listener.getsockname()[1]
    gw = gateway_factory(broker, s3_public_url=f"http://127.0.0.1:{port}")
    server = start_proxy(broker, gw, http_timeout=120, shutdown_timeout=1)
    try:
        topic = unique_topic("stalled-store")
        peer = PahoPeer(server.port)
        peer.subscribe(broker, topic, qos=1)
        pub = subprocess.run(
            ["mosquitto_pub", "-p", str(server.port), "-t", topic, "-s", "-q", "1"],
            input=os.urandom(size), capture_output=True, timeout=120,
        )  # fmt: skip
        assert pub.returncode == 0, pub.stderr.decode()
        wait_until(lambda: bool(held), "the fetch reached the store", 60)
        assert server.metric("offload_proxy_fetches") == 1  # under way, stalled
    finally:
        thread = server._thread
        server.stop()  # joins for at most 60 s
        listener.close()
        for conn in held:
            conn.close()
    assert thread is not None and not thread.is_alive()
