"""Load against the real gateway process: many streaming transfers, saturation, recovery.

The gateway runs as `offload-gateway` in its own process (as in production) on SeaweedFS
and mosquitto; clients come from several loopback source addresses (127.0.0.2, ...: the
loopback interface has all of 127.0.0.0/8), so per-client limits see several clients.
Nothing here asserts a speed: the assertions are that every transfer completes with the
right bytes, that a saturated gateway answers (503/429 with Retry-After) instead of
hanging, and that nothing stays held once the load is gone.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from client.protocol import encode_upload

from _hostile import RawRequest
from _servers import Mosquitto, SeaweedFS, free_port, wait_for_port

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = int(os.environ.get("LOAD_PAYLOAD_MIB", "32")) * MiB
BASE = os.urandom(MiB)  # payloads: a unique 16-byte prefix, then this block repeated


class GatewayProcess:
    """`python -m gateway.cli` on a free loopback port with the given settings."""

    def __init__(self, env: dict[str, str], log_dir: Path, *, ready: bool = True) -> None:
        self.port = free_port()
        self.log = Path(tempfile.mkstemp(prefix="gw-load-", suffix=".log", dir=log_dir)[1])
        full = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
        full.update(env)
        full["PYTHONPATH"] = str(ROOT)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "--host", "127.0.0.1", "--port", str(self.port)],
            env=full,
            cwd=ROOT,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        wait_for_port(self.port, 60, self.proc, self.log)
        self.url = f"http://127.0.0.1:{self.port}"
        probe = f"{self.url}/readyz" if ready else f"{self.url}/healthz"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(probe, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"gateway not ready:\n{self.log.read_text()[-3000:]}")

    def health(self) -> httpx.Response:
        return httpx.get(f"{self.url}/healthz", timeout=10)

    def wait_idle(self, timeout: float = 30) -> dict[str, Any]:
        """Poll /healthz until no transfer holds a slot; the last workers report."""
        deadline = time.monotonic() + timeout
        while True:
            workers: dict[str, Any] = self.health().json()["workers"]
            if workers["transfers"]["active"] == 0 or time.monotonic() > deadline:
                return workers
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def start_gateway(
    seaweed: SeaweedFS,
    bucket_name: str,
    mosquitto_factory: Callable[..., Mosquitto],
    tmp_path: Path,
) -> Iterator[Callable[..., GatewayProcess]]:
    broker = mosquitto_factory()
    started: list[GatewayProcess] = []

    def start(**settings: object) -> GatewayProcess:
        env = {
            "OFFLOAD_STORAGE_URL": seaweed.storage_url(bucket_name),
            "OFFLOAD_S3_ACCESS_KEY": seaweed.access_key,
            "OFFLOAD_S3_SECRET_KEY": seaweed.secret_key,
            "OFFLOAD_MQTT_URL": broker.url,
            "OFFLOAD_SWEEP_INTERVAL": "0",
            "OFFLOAD_LOG_LEVEL": "WARNING",
            # No credentials files: anonymous access asked for by name, as conftest does.
            "OFFLOAD_ALLOW_ANONYMOUS": "true",
        }
        env.update({f"OFFLOAD_{k.upper()}": str(v) for k, v in settings.items()})
        if "password_file" not in settings and "tokens_file" not in settings:
            env["OFFLOAD_ALLOW_ANONYMOUS"] = "true"  # no credentials files: opt in by name
        gw = GatewayProcess(env, tmp_path)
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.stop()


def client(address: str, **kw: Any) -> httpx.AsyncClient:
    """An async client whose connections leave from `address` (a loopback source)."""
    kw.setdefault("timeout", httpx.Timeout(120, connect=10))
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=address), **kw)


def payload_hash(prefix: bytes, size: int) -> str:
    digest = hashlib.sha256(prefix)
    left = size - len(prefix)
    first = BASE[len(prefix) :]
    digest.update(first[:left])
    left -= min(left, len(first))
    while left > 0:
        digest.update(BASE[:left])
        left -= min(left, len(BASE))
    return digest.hexdigest()


async def payload(prefix: bytes, size: int) -> AsyncIterator[bytes]:
    yield prefix + BASE[len(prefix) : min(size, len(BASE))]
    sent = min(size, len(BASE))
    while sent < size:
        piece = BASE[: min(len(BASE), size - sent)]
        sent += len(piece)
        yield piece


async def upload_raw(http: httpx.AsyncClient, url: str, topic: str, size: int) -> str:
    """POST /publish with a streamed body; the sha256 the gateway reports (checked)."""
    prefix = uuid.uuid4().bytes
    response = await http.post(
        f"{url}/publish/{topic}",
        content=payload(prefix, size),
        headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
    )
    assert response.status_code == 201, response.text
    assert response.json()["sha256"] == payload_hash(prefix, size)
    return str(response.json()["id"])


async def upload_bson(http: httpx.AsyncClient, url: str, topic: str, size: int) -> str:
    """POST /topic/<t>+oversized, a hop-client BSON document streamed around the payload."""
    prefix = uuid.uuid4().bytes
    head, tail = encode_upload(size, headers=[("_id", uuid.uuid4().bytes)])

    async def body() -> AsyncIterator[bytes]:
        yield head
        async for piece in payload(prefix, size):
            yield piece
        yield tail

    response = await http.post(
        f"{url}/topic/{topic}+oversized",
        content=body(),
        headers={
            "Content-Type": "application/bson",
            "Content-Length": str(len(head) + size + len(tail)),
        },
    )
    assert response.status_code == 201, response.text
    assert response.json()["sha256"] == payload_hash(prefix, size)
    return str(response.json()["id"])


async def download(http: httpx.AsyncClient, url: str, message_id: str) -> str:
    digest = hashlib.sha256()
    async with http.stream("GET", f"{url}/msg/{message_id}/payload") as response:
        assert response.status_code == 200
        async for piece in response.aiter_bytes():
            digest.update(piece)
    return digest.hexdigest()


ADDRESSES = [f"127.0.0.{i}" for i in range(2, 6)]


def test_clients_can_leave_from_other_loopback_addresses(
    start_gateway: Callable[..., GatewayProcess],
) -> None:
    """The premise of the load tests: the peer address the gateway sees is the source."""
    listener = socket.create_server(("127.0.0.1", 0))
    with (
        listener,
        socket.create_connection(listener.getsockname(), source_address=("127.0.0.3", 0)),
    ):
        peer, address = listener.accept()
        peer.close()
    assert address[0] == "127.0.0.3"


def test_32_concurrent_uploads_and_8_downloads_from_several_addresses_all_complete(
    start_gateway: Callable[..., GatewayProcess], unique_topic: Callable[[str], str]
) -> None:
    # One part in flight per upload: 2 shared cores running SeaweedFS, the gateway and the
    # clients answered some of 64 concurrent 8 MiB part uploads after the store client's
    # 10 s read timeout (503); that is the store's capacity here, not what is tested.
    gw = start_gateway(s3_parallel_uploads=1)
    topic = unique_topic("load")

    async def scenario() -> None:
        clients = [client(a) for a in ADDRESSES]
        try:
            # Two payloads to download while the uploads run (4 readers each).
            sources = [await upload_raw(clients[0], gw.url, topic, PAYLOAD) for _ in range(2)]
            expected = {}
            for sid in sources:
                expected[sid] = await download(clients[0], gw.url, sid)
            uploads = [
                (upload_raw if i % 2 else upload_bson)(
                    clients[i % len(clients)], gw.url, topic, PAYLOAD
                )
                for i in range(32)
            ]
            downloads = [
                download(clients[(i + 1) % len(clients)], gw.url, sources[i % 2]) for i in range(8)
            ]
            results = await asyncio.gather(*uploads, *downloads)
            assert len(set(results[:32])) == 32
            assert results[32:] == [expected[sources[i % 2]] for i in range(8)]
            # Afterwards every address can upload again: no per-client slot was kept.
            for http in clients:
                await upload_raw(http, gw.url, topic, MiB)
        finally:
            for http in clients:
                await http.aclose()

    asyncio.run(scenario())
    workers = gw.wait_idle()
    assert workers["transfers"]["active"] == 0
    assert gw.health().status_code == 200
    assert httpx.get(f"{gw.url}/readyz", timeout=10).status_code == 200


def wait_for(predicate: Callable[[], bool], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_saturated_gateway_refuses_at_once_with_retry_after_and_recovers(
    start_gateway: Callable[..., GatewayProcess], unique_topic: Callable[[str], str]
) -> None:
    gw = start_gateway(max_transfers=4, body_idle_timeout=3, max_uploads_per_client=3)
    topic = unique_topic("sat")
    seed = httpx.post(f"{gw.url}/publish/{topic}", content=os.urandom(MiB), timeout=30)
    assert seed.status_code == 201
    stalled: list[RawRequest] = []
    try:
        # Three stalled uploads from one address take its per-client share...
        for _ in range(3):
            stalled.append(
                RawRequest.post(gw.port, f"/publish/{topic}", 64 * MiB, source="127.0.0.2")
            )
        assert wait_for(lambda: gw.health().json()["workers"]["transfers"]["active"] == 3)
        # ...a fourth from it is refused (429), one from elsewhere takes the last slot.
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2")) as http:
            refused = http.post(f"{gw.url}/publish/{topic}", content=b"x", timeout=10)
        assert refused.status_code == 429 and refused.headers["retry-after"]
        stalled.append(RawRequest.post(gw.port, f"/publish/{topic}", 64 * MiB, source="127.0.0.3"))
        assert wait_for(lambda: gw.health().json()["workers"]["transfers"]["active"] == 4)

        # Every transfer slot is taken: uploads and downloads answer 503 + Retry-After now.
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.4")) as http:
            up = http.post(f"{gw.url}/publish/{topic}", content=b"y" * 1000, timeout=10)
            down = http.get(f"{gw.url}/msg/{seed.json()['id']}/payload", timeout=10)
            meta = http.head(f"{gw.url}/msg/{seed.json()['id']}/payload", timeout=10)
        assert up.status_code == 503 and int(up.headers["retry-after"]) > 0, up.text
        assert down.status_code == 503 and int(down.headers["retry-after"]) > 0, down.text
        assert meta.status_code == 200  # no transfer: not refused
        # Saturated is not wedged: the liveness probe stays green.
        health = gw.health()
        assert health.status_code == 200, health.text

        # The stalled bodies time out (408) and give back every slot they held.
        for request in stalled:
            assert request.response_head().startswith(b"HTTP/1.1 408")
    finally:
        for request in stalled:
            request.close()
    assert gw.wait_idle()["transfers"]["active"] == 0
    for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
        with httpx.Client(transport=httpx.HTTPTransport(local_address=source)) as http:
            again = http.post(f"{gw.url}/publish/{topic}", content=os.urandom(MiB), timeout=30)
            assert again.status_code == 201, again.text
            got = http.get(f"{gw.url}/msg/{seed.json()['id']}/payload", timeout=30)
            assert got.status_code == 200 and len(got.content) == MiB
    assert gw.health().status_code == 200
    assert httpx.get(f"{gw.url}/readyz", timeout=10).status_code == 200


def test_disconnects_and_clients_that_stop_reading_release_their_slots(
    start_gateway: Callable[..., GatewayProcess], unique_topic: Callable[[str], str]
) -> None:
    gw = start_gateway(max_transfers=8, send_idle_timeout=2, max_uploads_per_client=4)
    topic = unique_topic("drop")
    big = httpx.post(f"{gw.url}/publish/{topic}", content=os.urandom(PAYLOAD), timeout=60)
    assert big.status_code == 201
    url = f"/msg/{big.json()['id']}/payload"
    # Uploads cut off mid-body, from one address, more often than its per-client limit,
    # some after their multipart upload started (parts in flight on their own threads).
    chunk = os.urandom(MiB)
    threads: list[int] = []
    for cut_after in (3, 20, 20):
        for _ in range(3):
            request = RawRequest.post(gw.port, f"/publish/{topic}", 32 * MiB, source="127.0.0.5")
            for _ in range(cut_after):
                request.sock.sendall(chunk)
            request.close()
        assert gw.wait_idle()["transfers"]["active"] == 0
        threads.append(len(os.listdir(f"/proc/{gw.proc.pid}/task")))
    # Each aborted upload gave back its threads (the SDK's parallel upload kept two each).
    assert threads[2] <= threads[1] + 1, threads
    # Downloads whose clients never read (a tiny receive window), and one that hangs up.
    readers = [
        RawRequest(
            gw.port, f"GET {url} HTTP/1.1\r\nHost: gw\r\n\r\n", source="127.0.0.6", rcvbuf=4096
        )
        for _ in range(3)
    ]
    try:
        hung_up = RawRequest(gw.port, f"GET {url} HTTP/1.1\r\nHost: gw\r\n\r\n", source="127.0.0.6")
        hung_up.response_head()
        hung_up.close()
        assert wait_for(lambda: gw.health().json()["workers"]["transfers"]["active"] >= 3)
        # The send idle timeout drops the readers that stopped; every slot comes back.
        assert gw.wait_idle()["transfers"]["active"] == 0
    finally:
        for request in readers:
            request.close()
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.5")) as http:
        for _ in range(4):
            again = http.post(f"{gw.url}/publish/{topic}", content=os.urandom(MiB), timeout=30)
            assert again.status_code == 201, again.text
        got = http.get(f"{gw.url}{url}", timeout=60)
        assert got.status_code == 200 and len(got.content) == PAYLOAD
    assert gw.health().status_code == 200


@contextmanager
def tarpit(port: int) -> Iterator[None]:
    """`port` accepts connections and never answers: a store that hangs."""
    listener = socket.create_server(("127.0.0.1", port), backlog=128)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:  # includes the accept timeout
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def test_healthz_reports_a_worker_pool_that_makes_no_progress(tmp_path: Path) -> None:
    """A store that accepts and never answers holds the store workers: /healthz says so
    (503, naming the pool) while it lasts, and is green again once they are free."""
    port = free_port()  # nothing listens yet: the start-up bucket check fails fast
    gw = GatewayProcess(
        {
            "OFFLOAD_STORAGE_URL": f"s3://127.0.0.1:{port}/hung?secure=false",
            "OFFLOAD_S3_ACCESS_KEY": "k",
            "OFFLOAD_S3_SECRET_KEY": "s",
            "OFFLOAD_STORE_THREADS": "1",
            "OFFLOAD_HEALTH_TIMEOUT": "1",
            "OFFLOAD_SWEEP_INTERVAL": "0",
            "OFFLOAD_LOG_LEVEL": "ERROR",
            # Readers admitted: a caller without credentials is refused before any lookup.
            "OFFLOAD_ALLOW_ANONYMOUS": "true",
        },
        tmp_path,
        ready=False,
    )
    lookups: list[subprocess.Popen[bytes]] = []
    try:
        with tarpit(port):
            assert gw.health().status_code == 200
            # Manifest lookups each take the one store thread until the store times out.
            for _ in range(4):
                lookups.append(
                    subprocess.Popen(
                        [
                            "curl",
                            "-s",
                            "-o",
                            "/dev/null",
                            "-m",
                            "90",
                            f"{gw.url}/msg/{uuid.uuid4()}/payload",
                        ]
                    )
                )
            assert wait_for(lambda: gw.health().status_code == 503, timeout=20)
            body = gw.health().json()
            assert body["status"] == "wedged"
            assert body["workers"]["store"]["oldest_wait"] > 1
        # The store is gone now (connections refused): the calls fail fast, the pool drains.
        for lookup in lookups:
            lookup.wait(90)
        assert wait_for(lambda: gw.health().status_code == 200, timeout=60)
    finally:
        gw.stop()


def test_a_login_flood_is_refused_not_queued(
    start_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """Password hashing has its own small pool with a bounded queue: a flood of logins
    gets 503 + Retry-After beyond it, and the gateway stays live."""
    from _auth import write_password_file

    passwd = tmp_path / "passwd"
    write_password_file(passwd, [("alice", "secret", 200_000)])
    gw = start_gateway(password_file=passwd, tls="true", hash_threads=1)

    async def flood() -> list[httpx.Response]:
        # Ten addresses, 15 each: under the per-client upload limit, so hashing decides.
        clients = [client(f"127.0.1.{i}") for i in range(10, 20)]
        try:
            return await asyncio.gather(
                *(
                    clients[i % 10].post(
                        f"{gw.url}/topic/flood/t+oversized",
                        content=b"x",
                        auth=("alice", f"wrong{i}"),
                    )
                    for i in range(150)
                )
            )
        finally:
            for http in clients:
                await http.aclose()

    responses = asyncio.run(flood())
    statuses = {r.status_code for r in responses}
    assert statuses <= {401, 429, 503}, statuses
    refused = [r for r in responses if r.status_code == 503]
    assert refused and all(int(r.headers["retry-after"]) > 0 for r in refused)
    assert "hash workers are saturated" in refused[0].json()["detail"]
    assert gw.health().status_code == 200


def test_the_gateway_process_closes_connections_that_send_no_request(
    start_gateway: Callable[..., GatewayProcess],
) -> None:
    """What `offload-gateway` serves with (gateway/cli.py), not only the in-process test
    server: 200 connections that send nothing are all closed at OFFLOAD_HEADER_TIMEOUT,
    while a request on a fresh connection is served meanwhile."""
    gw = start_gateway(header_timeout=2)
    idle = [RawRequest(gw.port, "") for _ in range(200)]
    try:
        assert gw.health().status_code == 200
        started = time.monotonic()
        assert all(conn.rest_until_closed(within=10) == b"" for conn in idle)
        assert time.monotonic() - started < 10
    finally:
        for conn in idle:
            conn.close()
