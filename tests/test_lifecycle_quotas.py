"""Quotas on what an account keeps (`OFFLOAD_MAX_STORED_BYTES_PER_USER`, gateway/retention),
against real SeaweedFS with two gateway replicas on one bucket and SCRAM logins."""

from __future__ import annotations

import base64
import hashlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bson
import httpx
import pytest

from client import gateway_auth
from gateway._sweeper import Sweeper
from gateway.retention import Keeper
from gateway.storage import S3Store

from _auth import AUTH_SECRET, credential_files
from _gateway import GatewayServer
from _servers import SeaweedFS

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
USERS = {"alice": "alice-pw", "bob": "bob-pw"}


@pytest.fixture(scope="module")
def files() -> Iterator[Path]:
    with credential_files("quota-", USERS, "pattern readwrite #\n") as path:
        yield path


def secured(
    factory: Callable[..., GatewayServer], files: Path, **settings: object
) -> GatewayServer:
    return factory(
        None,
        password_file=files / "passwd",
        acl_file=files / "acl",
        auth_secret=AUTH_SECRET,
        allow_anonymous=False,
        sweep_interval=0,
        **settings,
    )


def login(user: str) -> httpx.Auth:
    auth = gateway_auth(username=user, password=USERS[user], token=None, scheme="scram")
    assert auth is not None
    return auth


def put(
    gw: GatewayServer, user: str, body: bytes | Iterator[bytes], **params: object
) -> httpx.Response:
    return httpx.put(
        f"{gw.url}/msg/{uuid.uuid4()}",
        params={"topic": f"quota/{user}", **params},
        content=body,
        auth=login(user),
        timeout=60,
    )


def usage(gw: GatewayServer, user: str) -> dict[str, object]:
    answer = httpx.get(f"{gw.url}/usage", auth=login(user), timeout=30)
    assert answer.status_code == 200, answer.text
    doc: dict[str, object] = answer.json()
    return doc


def test_the_quota_holds_across_two_replicas_and_bytes_come_back(
    gateway_factory: Callable[..., GatewayServer], files: Path, store: S3Store
) -> None:
    """Twelve 1 MiB uploads of one account, four at a time through two replicas, quota
    5 MiB: five stored, seven refused with 413 naming the quota, none past it; another
    account unaffected; its bytes back once its messages are gone."""
    one, two = (secured(gateway_factory, files, max_stored_bytes_per_user=5 * MiB) for _ in "12")
    bodies = [os.urandom(MiB) for _ in range(12)]
    with ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(lambda i: put((one, two)[i % 2], "alice", bodies[i], ttl=60), range(12))
        )
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [201] * 5 + [413] * 7, [a.text for a in answers]
    refusal = next(a for a in answers if a.status_code == 413).json()["detail"]
    assert "OFFLOAD_MAX_STORED_BYTES_PER_USER=5242880" in refusal and "'alice'" in refusal
    assert "\n" not in refusal
    stored = sum(o.size for o in store.list("data/quota/alice/") if not o.key.endswith(".json"))
    assert stored == 5 * MiB
    assert usage(one, "alice") == {
        "user": "alice", "counted": True, "stored_bytes": 5 * MiB, "held_bytes": 0,
        "limit_bytes": 5 * MiB,
    }  # fmt: skip
    assert put(two, "bob", os.urandom(MiB)).status_code == 201  # another account: its own
    assert usage(two, "bob")["stored_bytes"] == MiB

    # Shared content counts once: asked by SHA-256 and size first, alice's stored payload
    # is linked to a new message (no bytes sent), not refused.
    kept = bodies[next(i for i, a in enumerate(answers) if a.status_code == 201)]
    assert link(two, "alice", kept).status_code == 201
    assert usage(one, "alice")["stored_bytes"] == 5 * MiB

    sweeper = Sweeper(store, interval=0, keeper=Keeper.counting(store))
    sweeper.sweep_once(now_ms=int(time.time() * 1000) + 120_000)  # the ttl=60 ones expired
    assert usage(two, "alice")["stored_bytes"] == MiB  # the link (default TTL) holds one
    assert put(two, "alice", os.urandom(4 * MiB)).status_code == 201
    assert put(two, "alice", os.urandom(MiB)).status_code == 413


def link(gw: GatewayServer, user: str, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{gw.url}/msg/{uuid.uuid4()}/link",
        params={"topic": f"quota/{user}"},
        headers={
            "X-Offload-Sha256": hashlib.sha256(body).hexdigest(),
            "X-Offload-Size": str(len(body)),
        },
        auth=login(user),
        timeout=30,
    )


def test_an_upload_of_unknown_length_passes_the_quota_by_less_than_a_part(
    gateway_factory: Callable[..., GatewayServer], files: Path, store: S3Store
) -> None:
    """Chunked bodies reserve a part (5 MiB) at a time: quota 6 MiB, 4 MiB uploads, the
    second stored (8 MiB, under 6 + 5), the third refused."""
    gw = secured(gateway_factory, files, max_stored_bytes_per_user=6 * MiB, s3_part_size=5 * MiB)

    def chunked(size: int) -> Iterator[bytes]:
        for _ in range(size // (256 * 1024)):
            yield os.urandom(256 * 1024)

    assert [put(gw, "alice", chunked(4 * MiB)).status_code for _ in range(3)] == [201, 201, 413]
    assert usage(gw, "alice")["stored_bytes"] == 8 * MiB


def _hop(gw: GatewayServer, body: bytes) -> httpx.Response:
    doc = bson.encode({"message": bson.Binary(body), "headers": [["_id", uuid.uuid4().bytes]]})
    return httpx.post(
        f"{gw.url}/topic/quota/alice+oversized", content=doc, auth=login("alice"), timeout=60
    )


def _publish(gw: GatewayServer, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{gw.url}/publish/quota/alice", content=body, auth=login("alice"), timeout=60
    )


def _tus(gw: GatewayServer, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{gw.url}/uploads/",
        headers={
            "Tus-Resumable": "1.0.0",
            "Upload-Length": str(len(body)),
            "Upload-Metadata": "topic " + base64.b64encode(b"quota/alice").decode(),
        },
        auth=login("alice"),
        timeout=60,
    )


def _direct(gw: GatewayServer, body: bytes) -> httpx.Response:
    digest = hashlib.sha256(body).hexdigest()
    request = {"size": len(body), "sha256": digest, "part_size": len(body), "parts": [digest]}
    return httpx.post(
        f"{gw.url}/direct/grant/quota/alice", json=request, auth=login("alice"), timeout=60
    )


@pytest.mark.parametrize("path", [_hop, _publish, _tus, _direct], ids=lambda f: f.__name__[1:])
def test_every_upload_path_is_refused_before_its_bytes_past_the_quota(
    path: Callable[[GatewayServer, bytes], httpx.Response],
    gateway_factory: Callable[..., GatewayServer],
    mosquitto_factory: Callable[..., object],
    files: Path,
    seaweed: SeaweedFS,
    store: S3Store,
) -> None:
    """The BSON document, the publish route, a tus creation and a direct grant each hold
    their bytes before any is written (or any URL handed out): refused with 413 naming
    the quota, nothing kept, nothing held; one that fits is taken."""
    gw = secured(
        gateway_factory,
        files,
        max_stored_bytes_per_user=MiB,
        mqtt_url=mosquitto_factory().url,  # type: ignore[attr-defined]
        s3_public_url=f"http://{seaweed.endpoint}",
    )
    refused = path(gw, os.urandom(MiB + 1))
    assert refused.status_code == 413, refused.text
    assert "OFFLOAD_MAX_STORED_BYTES_PER_USER=1048576" in refused.json()["detail"]
    assert [o.key for o in store.list("data/")] == [] and [
        o.key for o in store.list("uploads/")
    ] == []
    assert usage(gw, "alice")["held_bytes"] == 0
    taken = path(gw, os.urandom(MiB // 2))
    assert taken.status_code == 201, taken.text
