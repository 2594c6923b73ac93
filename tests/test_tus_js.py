"""tus-js-client, the tus project's JavaScript client, in Node and in headless Chromium.

The browser test is the case CORS and concatenation exist for: a web page, cross-origin to
the gateway, uploads a file with `parallelUploads: 3`, is reloaded mid-upload, finds the
upload again in localStorage and resumes it; the placeholder arrives on MQTT.

tus-js-client comes from npm (tests/browser/package.json and its lock), installed once into
a cache directory; the browser is the distribution's chromium (scripts/_bootstrap.sh),
driven by Playwright through `executable_path`: nothing else is downloaded.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from test_resumable import Sub

from _gateway import GatewayServer
from _npm import npm_modules
from _servers import Mosquitto

pytestmark = pytest.mark.servers

PEERS = Path(__file__).parent / "browser"
CHROMIUM = os.environ.get("OFFLOAD_TEST_CHROMIUM", "/usr/bin/chromium")
KiB = 1024


@pytest.fixture(scope="session")
def tus_js() -> Path:
    """node_modules holding tus-js-client, installed from the committed lock on first use."""
    try:
        return npm_modules(PEERS, "npm", "tus-js-client")
    except RuntimeError as exc:
        pytest.fail(str(exc))


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def site(tmp_path: Path, tus_js: Path) -> Iterator[tuple[str, Path]]:
    """A static web server on loopback for the test page: (its origin, its directory)."""
    root = tmp_path / "site"
    root.mkdir()
    shutil.copy(PEERS / "page.html", root / "page.html")
    shutil.copy(tus_js / "tus-js-client" / "dist" / "tus.min.js", root / "tus.min.js")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=root))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()


def _uploads_objects(gw: GatewayServer) -> list[str]:
    from gateway._app import build_store

    return sorted(o.key for o in build_store(gw.settings).list("uploads/"))


def _check_published(
    gw: GatewayServer, sub: Sub, url: str, sha256: str, payload: bytes, media: str
) -> None:
    assert sha256 == hashlib.sha256(payload).hexdigest()
    with httpx.Client(timeout=30) as http:
        fetched = http.get(url + "/payload")
    assert fetched.content == payload
    assert fetched.headers["content-type"] == media
    placeholder = json.loads(str(sub.message()["payload"]))
    assert placeholder["url"] == url and placeholder["sha256"] == sha256
    # Only the final upload's small state is left: segments and partial uploads are gone.
    left = _uploads_objects(gw)
    assert len(left) == 1 and left[0].endswith(".json"), left


@pytest.mark.parametrize("mode", ["with-upload", "parallel"])
def test_tus_js_client_in_node(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
    tus_js: Path,
    tmp_path: Path,
    mode: str,
) -> None:
    gw = gateway_factory(broker, allow_anonymous=True)
    topic = unique_topic("node")
    payload = os.urandom(300 * KiB + 11)
    source = tmp_path / "node.bin"
    source.write_bytes(payload)
    sub = Sub(broker, topic)
    done = subprocess.run(
        ["node", str(PEERS / "upload.cjs"), str(tus_js), f"{gw.url}/uploads/", str(source),
         topic, mode],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    requests = seen["requests"]
    if mode == "with-upload":
        assert requests[0] == "POST 201" and requests.count("POST 201") == 1
        assert "PATCH 204" in requests  # the rest followed in PATCHes
    else:
        assert requests.count("POST 201") == 4  # three partial uploads and the final one
        assert requests[-1] == "POST 201"
    _check_published(gw, sub, seen["url"], seen["sha256"], payload, "application/x-node")


def test_browser_parallel_upload_survives_a_reload(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
    site: tuple[str, Path],
) -> None:
    from playwright.sync_api import sync_playwright

    origin, root = site
    payload = os.urandom(2 * 1024 * KiB)
    (root / "payload.bin").write_bytes(payload)
    chunks = 3 * 6  # three parts of ~683 KiB in 128 KiB PATCHes
    gw = gateway_factory(broker, allow_anonymous=True, cors_origins=origin)
    topic = unique_topic("browser")
    sub = Sub(broker, topic)
    page_url = f"{origin}/page.html?endpoint={quote(gw.url + '/uploads/')}&topic={quote(topic)}"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(page_url)
            page.wait_for_function("['held', 'error', 'done'].includes(window.report.phase)")
            before = page.evaluate("window.report")
            assert before["phase"] == "held", before
            staged = _uploads_objects(gw)
            assert sum(k.endswith(".json") for k in staged) == 3, staged  # three parts begun
            page.reload()  # interrupts the upload; the new page finds it in localStorage
            page.wait_for_function(
                "window.report.phase === 'done' || window.report.phase === 'error'",
                timeout=60_000,
            )
            after = page.evaluate("window.report")
        finally:
            browser.close()
    assert after["phase"] == "done", f"tus-js-client: {after.get('error')!r} (report: {after})"
    assert after["first"] is False and after["resumed"] == 1, after
    assert after["patches"] < chunks, (before, after)  # resumed, not started again
    _check_published(gw, sub, after["url"], after["sha256"], payload, "application/x-browser")
