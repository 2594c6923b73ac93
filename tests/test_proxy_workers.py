"""`offload-proxy --workers 2`, the real command: both workers serve the parent's sockets,
/metrics adds them up (gauges over the living), a worker that dies is started again, SIGTERM
stops them all, and a worker that cannot start stops the parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from _servers import Mosquitto, free_port, wait_until

pytestmark = pytest.mark.servers

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Workers:
    proc: subprocess.Popen[bytes]
    port: int
    metrics_port: int

    def workers(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children()

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=10)

    def metric(self, name: str) -> float:
        for family in text_string_to_metric_families(self.get("/metrics").text):
            for sample in family.samples:
                if sample.name == name:
                    return float(sample.value)
        raise KeyError(name)

    def served_by(self) -> dict[int, int]:
        """Client connections each worker holds (pid -> count)."""
        counts = {}
        for worker in self.workers():
            try:
                held = worker.net_connections("tcp")
            except psutil.NoSuchProcess:  # a worker that was killed, not yet reaped
                continue
            with_clients = [
                c for c in held
                if c.laddr and c.laddr.port == self.port and c.status == "ESTABLISHED"
            ]  # fmt: skip
            counts[worker.pid] = len(with_clients)
        return counts


def start(broker: Mosquitto, *extra: str, env: dict[str, str] | None = None) -> Workers:
    port, metrics_port = free_port(), free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    environ.update({"PYTHONPATH": str(ROOT), "OFFLOAD_PROXY_SHUTDOWN_TIMEOUT": "2", **(env or {})})
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "--broker", broker.url, "--port", str(port),
         "--endpoint", "http://127.0.0.1:9", "--metrics-port", str(metrics_port), *extra],
        env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    return Workers(proc, port, metrics_port)


@pytest.fixture
def two(broker: Mosquitto) -> Iterator[Workers]:
    workers = start(broker, "--workers", "2")
    assert workers.proc.stdout is not None
    line = workers.proc.stdout.readline().decode()  # printed once both listen
    assert f":{workers.port} (2 workers)" in line, line
    seen: set[int] = set()
    try:
        seen.update(w.pid for w in workers.workers())
        yield workers
    finally:
        if workers.proc.poll() is None:
            seen.update(w.pid for w in workers.workers())  # restarted ones too
            workers.proc.kill()
            workers.proc.wait(30)
        for pid in seen:  # a failed test may leave a worker behind: never past the test
            if _running(pid):
                psutil.Process(pid).kill()


def _subscriber(port: int, topic: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["mosquitto_sub", "-p", str(port), "-t", topic, "-q", "1", "-V", "5",
         "-i", f"w-{uuid.uuid4().hex[:8]}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def test_two_workers_serve_one_port_and_metrics_add_up(two: Workers, broker: Mosquitto) -> None:
    assert len(two.workers()) == 2
    assert two.get("/healthz").text.strip() == "ok (2 of 2 workers)"
    topic = f"workers/{uuid.uuid4().hex[:8]}"
    subs = [_subscriber(two.port, topic) for _ in range(6)]
    try:
        wait_until(lambda: sum(two.served_by().values()) == 6, "6 subscribers served", 30)
        wait_until(lambda: two.metric("offload_proxy_connections") == 6, "gauge summed", 10)
        sent = subprocess.run(
            ["mosquitto_pub", "-p", str(two.port), "-t", topic, "-m", "m", "-q", "1"],
            capture_output=True, timeout=30,
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        # A worker killed outright: its clients' connections go, the parent starts another,
        # and the gauge counts the living workers' connections only.
        victim = max(two.served_by().items(), key=lambda item: item[1])[0]
        os.kill(victim, signal.SIGKILL)
        wait_until(
            lambda: len(two.workers()) == 2 and victim not in two.served_by(),
            "a new worker",
            30,
        )
        wait_until(lambda: two.get("/healthz").status_code == 200, "healthy again", 30)
        wait_until(
            lambda: two.metric("offload_proxy_connections") == sum(two.served_by().values()),
            "the dead worker's connections no longer counted",
            30,
        )
    finally:
        for sub in subs:
            sub.kill()
            sub.wait()
    pids = [w.pid for w in two.workers()]
    two.proc.send_signal(signal.SIGTERM)
    assert two.proc.wait(30) == 0
    assert not any(_running(pid) for pid in pids)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_worker_that_cannot_start_stops_the_parent(broker: Mosquitto) -> None:
    workers = start(
        broker, "--workers", "2", env={"OFFLOAD_PROXY_IDENTITY_FILES": "/nonexistent/key.txt"}
    )
    try:
        assert workers.proc.wait(60) == 1
    finally:
        if workers.proc.poll() is None:
            workers.proc.kill()
            workers.proc.wait()


def test_workers_stop_when_their_parent_is_killed(two: Workers) -> None:
    pids = [w.pid for w in two.workers()]
    assert len(pids) == 2
    two.proc.kill()  # SIGKILL: no chance to pass anything on
    two.proc.wait(10)
    wait_until(lambda: not any(_running(pid) for pid in pids), "workers gone", 20)
