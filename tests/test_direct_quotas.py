"""Per-user caps on open uploads (direct grants and tus uploads), and what the sweeper removes.

Real gateway, SeaweedFS and mosquitto; the requests are what one user could send in a loop.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from minio import Minio

from gateway._sweeper import Sweeper
from gateway.storage import S3Store

from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
USERS = {"alice": "a-secret", "bob": "b-secret"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def auth_files() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="offload-quotas-"))
    for i, (user, password) in enumerate(USERS.items()):
        args = ["mosquitto_passwd", "-b", "-H", "sha512-pbkdf2", "-I", "1000"]
        if i == 0:
            args.insert(1, "-c")
        subprocess.run([*args, str(path / "passwd"), user, password], check=True)
    (path / "acl").write_text("".join(f"user {u}\ntopic readwrite q/#\n" for u in USERS))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def store(seaweed: SeaweedFS) -> Minio:
    return Minio(
        seaweed.endpoint,
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
        secure=False,
    )


def capped(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    seaweed: SeaweedFS,
    auth_files: Path,
    **caps: object,
) -> GatewayServer:
    return gateway_factory(
        broker,
        s3_public_url=f"http://{seaweed.endpoint}",
        password_file=auth_files / "passwd",
        acl_file=auth_files / "acl",
        tls=True,  # "behind an HTTPS proxy": Basic credentials are accepted
        sweep_interval=0,  # these tests sweep by hand
        **caps,
    )


def grant(gw: GatewayServer, user: str, size: int, data: bytes = b"x") -> httpx.Response:
    """A grant for `size` bytes (one part of `data` when it is that size, else 5 MiB parts)."""
    part = max(size, 1) if size == len(data) else 5 * MiB
    count = max(1, -(-size // part))
    body = {"size": size, "sha256": sha(data), "part_size": part, "parts": [sha(data)] * count}
    return httpx.post(
        f"{gw.url}/direct/grant/q/{user}", json=body, auth=(user, USERS[user]), timeout=60
    )


def tus_create(gw: GatewayServer, user: str, length: int) -> httpx.Response:
    topic = base64.b64encode(f"q/{user}".encode()).decode()
    headers = {"Tus-Resumable": "1.0.0", "Upload-Length": str(length)}
    headers["Upload-Metadata"] = f"topic {topic}"
    return httpx.post(f"{gw.url}/uploads/", headers=headers, auth=(user, USERS[user]))


def refused(answer: httpx.Response, reason: str) -> None:
    assert answer.status_code == 429, answer.text
    assert reason in answer.json()["detail"], answer.text
    assert 1 <= int(answer.headers["Retry-After"]) <= 60, answer.headers


def test_open_uploads_and_reserved_bytes_are_capped_per_user(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    seaweed: SeaweedFS,
    auth_files: Path,
) -> None:
    gw = capped(
        gateway_factory,
        broker,
        seaweed,
        auth_files,
        max_open_uploads=3,
        max_reserved_bytes=20 * MiB,
    )
    data = b"x"
    first = grant(gw, "alice", 1, data)
    opened = [first, grant(gw, "alice", 1, data), tus_create(gw, "alice", 1)]
    assert [a.status_code for a in opened] == [201, 201, 201], [a.text for a in opened]
    # Alice is at her cap: a fourth upload of either kind is refused, and asks to come back.
    refused(grant(gw, "alice", 1, data), "OFFLOAD_MAX_OPEN_UPLOADS=3")
    refused(tus_create(gw, "alice", 1), "OFFLOAD_MAX_OPEN_UPLOADS=3")
    # Bob is not Alice: his own caps, here the bytes.
    assert grant(gw, "bob", 15 * MiB).status_code == 201
    refused(grant(gw, "bob", 6 * MiB), "OFFLOAD_MAX_RESERVED_BYTES")
    refused(tus_create(gw, "bob", 6 * MiB), "OFFLOAD_MAX_RESERVED_BYTES")
    assert tus_create(gw, "bob", 5 * MiB).status_code == 201  # exactly at the byte cap

    # An upload that ends makes room: a commit, and a tus termination.
    [url] = first.json()["urls"]
    assert httpx.put(url, content=data).status_code == 200
    auth = ("alice", USERS["alice"])
    done = httpx.post(f"{gw.url}/direct/commit", json={"grant": first.json()["grant"]}, auth=auth)
    assert done.status_code == 201, done.text
    assert grant(gw, "alice", 1, data).status_code == 201
    refused(grant(gw, "alice", 1, data), "OFFLOAD_MAX_OPEN_UPLOADS=3")
    location = opened[2].headers["Location"]
    ended = httpx.delete(f"{gw.url}{location}", headers={"Tus-Resumable": "1.0.0"}, auth=auth)
    assert ended.status_code == 204, ended.text
    assert tus_create(gw, "alice", 1).status_code == 201


def test_the_sweeper_aborts_the_multipart_upload_of_an_abandoned_grant(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    seaweed: SeaweedFS,
    auth_files: Path,
    store: Minio,
    bucket_name: str,
) -> None:
    # With the caps off too: the records are what the sweeper finds abandoned grants by.
    gw = capped(
        gateway_factory, broker, seaweed, auth_files, max_open_uploads=0, max_reserved_bytes=0
    )
    answer = grant(gw, "alice", 6 * MiB)  # two parts: a multipart upload is started
    assert answer.status_code == 201, answer.text
    expires = answer.json()["expires"]

    def open_uploads() -> list[Any]:
        return store._list_multipart_uploads(bucket_name, prefix="data/").uploads

    assert len(open_uploads()) == 1
    s3 = S3Store(
        seaweed.endpoint, bucket_name, access_key=seaweed.access_key, secret_key=seaweed.secret_key
    )
    sweeper = Sweeper(s3, grace=60, direct=s3.direct(f"http://{seaweed.endpoint}"))
    # Before expiry and grace: kept (a commit may still come).
    sweeper.sweep_once(now_ms=(expires + 30) * 1000)
    assert len(open_uploads()) == 1
    report = sweeper.sweep_once(now_ms=(expires + 61) * 1000)
    assert open_uploads() == [] and report.uploads == 1, report
    records = list(store.list_objects(bucket_name, prefix="quota/", recursive=True))
    assert records == []  # its open-upload record went with it


def test_concurrent_grants_of_one_user_pass_the_cap_no_further(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    seaweed: SeaweedFS,
    auth_files: Path,
) -> None:
    """Twelve grants at once from one user at one replica: exactly the cap of them pass."""
    gw = capped(gateway_factory, broker, seaweed, auth_files, max_open_uploads=3)
    barrier = threading.Barrier(12)

    def one(_: int) -> httpx.Response:
        barrier.wait()
        return grant(gw, "alice", 1)

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(one, range(12)))
    codes = sorted(a.status_code for a in answers)
    assert codes == [201] * 3 + [429] * 9, [a.text for a in answers]
