"""`offload-gateway` as operators start it: the real console script, several workers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import httpx
import psutil
import pytest

from client.http._scram import ScramAuth

from _auth import write_password_file
from _gateway import GatewayServer
from _servers import Mosquitto, free_port, wait_until

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
    try:  # slow on a loaded machine, but never without using CPU (tests/_servers.py)
        wait_until(partial(_workers_serving, proc.pid, port, url), "two workers", 180, proc, log,
                   stall=10)  # fmt: skip
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


def test_workers_slow_to_start_are_waited_for_not_killed(tmp_path: Path) -> None:
    """A worker answers uvicorn's health check only once its interpreter has imported the
    gateway (1.7 s of CPU alone; 20 s and more on a loaded node or a CPU-limited pod).
    uvicorn's 5 s killed each one and started another for as long as the load lasted: 13
    workers in 80 s on 2 cores at load 16, and nothing served. Here every worker's start is
    held 6 s (a sitecustomize, before anything of uvicorn runs in it)."""
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(
        "import sys, time\nif '--multiprocessing-fork' in sys.argv:\n    time.sleep(6)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env |= {"OFFLOAD_STORAGE_URL": f"file://{tmp_path / 'store'}",
            "OFFLOAD_ALLOW_ANONYMOUS": "true",
            "PYTHONPATH": os.pathsep.join([str(slow), env.get("PYTHONPATH", "")])}  # fmt: skip
    port = free_port()
    log = tmp_path / "gateway.log"
    proc = subprocess.Popen(
        [shutil.which("offload-gateway") or "offload-gateway", "--port", str(port),
         "--workers", "2"],
        env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_until(
            lambda: (
                "died" in log.read_text()
                or _workers_serving(proc.pid, port, f"http://127.0.0.1:{port}")
            ),
            "two slow workers",
            90,
            proc,
            log,
        )
    finally:
        proc.terminate()
        proc.wait(30)
    assert "died" not in log.read_text(), log.read_text()


# -- /docs without internet ---------------------------------------------------------------------


def _asset_urls(html: str) -> list[str]:
    return re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", html)


def test_every_asset_the_docs_pages_load_is_served_by_the_gateway(
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    gw = gateway_factory(None, allow_anonymous=True)
    for page in ("/docs", "/redoc"):
        html = httpx.get(f"{gw.url}{page}").text
        urls = _asset_urls(html)
        assert any(u.endswith(".js") for u in urls), html
        for url in urls:
            assert url.startswith("/"), f"{page} loads {url} from elsewhere"
            assert httpx.get(f"{gw.url}{url}").status_code == 200, url


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt install)")
def test_swagger_ui_renders_with_no_network(gateway_factory: Callable[..., GatewayServer]) -> None:
    gw = gateway_factory(None, allow_anonymous=True)
    dom = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         # Every name but loopback fails to resolve: a CDN reference would leave a blank page.
         "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
         "--virtual-time-budget=10000", "--dump-dom", f"{gw.url}/docs"],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    # Drawn by Swagger UI's script from /openapi.json, not present in the served HTML.
    assert 'class="title">mqtt-offload gateway' in dom
    assert 'data-path="/publish/{topic}"' in dom


def test_docs_and_their_assets_are_routes_in_the_metrics(
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    gw = gateway_factory(None, allow_anonymous=True)
    for path in ("/docs", "/openapi.json", "/static-offline-docs/swagger-ui.css", "/no/such"):
        httpx.get(f"{gw.url}{path}")
    metrics = httpx.get(gw.metrics_url).text
    for route in ("/docs", "/openapi.json", "/static-offline-docs"):
        assert f'route="{route}",status="200"' in metrics
    assert 'route="unmatched",status="200"' not in metrics
    assert 'route="unmatched",status="404"' in metrics  # a real miss still is one


def test_curl_default_form_type_is_not_the_messages_content_type(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto, tmp_path: Path
) -> None:
    gateway = gateway_factory(broker, allow_anonymous=True)
    photo = tmp_path / "photo.bin"
    photo.write_bytes(b"\x89PNG not really")
    sent = subprocess.run(
        ["curl", "-s", "--data-binary", f"@{photo}", f"{gateway.url}/publish/cams/1"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    url = json.loads(sent.stdout)["url"]
    got = httpx.get(f"{url}/payload")
    assert got.content == photo.read_bytes()
    assert "form-urlencoded" not in got.headers.get("content-type", "")
    typed = subprocess.run(
        ["curl", "-s", "--data-binary", f"@{photo}", "-H", "Content-Type: image/png",
         f"{gateway.url}/publish/cams/1"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert httpx.get(json.loads(typed.stdout)["url"] + "/payload").headers["content-type"] == (
        "image/png"
    )
