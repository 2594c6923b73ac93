"""`offload-gateway` as operators start it: the real console script, several workers."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from client._scram import ScramAuth

from _auth import write_password_file
from _servers import free_port

pytestmark = pytest.mark.servers


def _workers_serving(parent: int, port: int, url: str) -> bool:
    """Two worker processes hold the listening socket, and requests are answered."""
    try:
        children = psutil.Process(parent).children()
        holding = [
            c for c in children
            if any(k.laddr and k.laddr.port == port for k in c.net_connections("tcp"))
        ]  # fmt: skip
        if len(holding) < 2:
            return False
        return all(
            httpx.get(f"{url}/healthz", headers={"Connection": "close"}).status_code == 200
            for _ in range(10)
        )
    except (psutil.Error, httpx.HTTPError):
        return False


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Two uvicorn workers, a password file and no OFFLOAD_AUTH_SECRET."""
    passwd = tmp_path / "passwd"
    write_password_file(passwd, [("alice", "s3cret", 4096)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env |= {"OFFLOAD_STORAGE_URL": f"file://{tmp_path / 'store'}",
            "OFFLOAD_PASSWORD_FILE": str(passwd)}  # fmt: skip
    port = free_port()
    gateway = shutil.which("offload-gateway") or "offload-gateway"
    log = tmp_path / "gateway.log"
    proc = subprocess.Popen(
        [gateway, "--port", str(port), "--workers", "2"],
        env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not _workers_serving(proc.pid, port, url):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    try:
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(30)
    assert "generated one for the 2 workers" in log.read_text()


def test_scram_logins_succeed_whichever_worker_answers(
    two_workers: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, _ = two_workers

    def login(_: int) -> int:
        # A new connection per round trip, so the two SCRAM steps land on either worker.
        with httpx.Client(auth=ScramAuth("alice", "s3cret"), headers={"Connection": "close"}) as c:
            return c.post(f"{url}/publish/workers/t", content=b"x").status_code

    with ThreadPoolExecutor(4) as pool:  # both workers busy, as under real load
        statuses = list(pool.map(login, range(24)))
    # Authenticated every time (a failed login is 401), then told there is no broker.
    assert statuses == [503] * 24
