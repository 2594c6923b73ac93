"""One id, one content: uploads racing for one message id, on SeaweedFS and on the file store.

The id index is created only where none exists (`If-None-Match: *` on S3, `link(2)` on
disk); of concurrent uploads with one id exactly one commits, the others get 409 (different
content) or 201 `created: false` (identical content), and the stored bytes are the winner's.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import bson
import httpx
import pytest

from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers

RACERS = 6
SIZE = 256 * 1024


def upload_doc(payload: bytes, msg_id: uuid.UUID) -> bytes:
    return bson.encode({"message": bson.Binary(payload), "headers": [["_id", msg_id.bytes]]})


@pytest.fixture(params=["s3", "file"])
def gw(
    request: pytest.FixtureRequest,
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    tmp_path: Path,
) -> GatewayServer:
    if request.param == "file":
        return gateway_factory(broker, storage_url=f"file://{tmp_path}/store")
    return gateway_factory(broker)


def race(gw: GatewayServer, path: str, bodies: list[bytes], **kw: str) -> list[httpx.Response]:
    """POST every body at once (threads released together); the answers in body order."""
    answers: list[httpx.Response | None] = [None] * len(bodies)
    start = threading.Barrier(len(bodies))

    def post(index: int) -> None:
        with httpx.Client(base_url=gw.url, timeout=60) as http:
            start.wait()
            answers[index] = http.post(path, content=bodies[index], headers=kw)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert all(a is not None for a in answers)
    return [a for a in answers if a is not None]


@pytest.mark.parametrize("route", ["/topic/ids/race+oversized", "/publish/ids/race"])
def test_concurrent_uploads_of_one_id_with_different_content_one_wins(
    gw: GatewayServer, route: str
) -> None:
    for _round in range(3):
        msg_id = uuid.uuid4()
        payloads = [os.urandom(SIZE) for _ in range(RACERS)]
        bodies = [upload_doc(p, msg_id) for p in payloads]
        answers = race(gw, route, bodies, **{"Content-Type": "application/bson"})
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [201] + [409] * (RACERS - 1), [a.text for a in answers]
        winner = next(i for i, a in enumerate(answers) if a.status_code == 201)
        assert answers[winner].json()["sha256"] == hashlib.sha256(payloads[winner]).hexdigest()
        assert answers[winner].json()["created"] is True
        for loser in (a for a in answers if a.status_code == 409):
            assert "already exists" in loser.json()["detail"]
        served = httpx.get(f"{gw.url}/msg/{msg_id}/payload", timeout=30)
        assert served.status_code == 200 and served.content == payloads[winner]


def test_concurrent_identical_uploads_one_creates_the_others_find_it(gw: GatewayServer) -> None:
    msg_id = uuid.uuid4()
    payload = os.urandom(SIZE)
    answers = race(gw, "/topic/ids/same+oversized", [upload_doc(payload, msg_id)] * RACERS)
    assert [a.status_code for a in answers] == [201] * RACERS
    created = sorted(a.json()["created"] for a in answers)
    assert created == [False] * (RACERS - 1) + [True]
    assert {a.json()["id"] for a in answers} == {str(msg_id)}
    assert httpx.get(f"{gw.url}/msg/{msg_id}/payload").content == payload


def test_losers_leave_nothing_behind(gw: GatewayServer, tmp_path: Path) -> None:
    """Every loser's payload and sidecar are removed: one message's three objects remain."""
    from gateway._app import build_store

    msg_id = uuid.uuid4()
    bodies = [upload_doc(os.urandom(1024), msg_id) for _ in range(RACERS)]
    race(gw, "/topic/ids/clean+oversized", bodies)
    store = build_store(gw.settings)
    keys = sorted(o.key for o in store.list("data/ids/clean/")) + [
        o.key for o in store.list(f"ids/{msg_id}")
    ]
    assert len(keys) == 3, keys  # payload, its sidecar, the id index


@pytest.mark.parametrize("kind", ["s3", "file"])
def test_store_create_bytes_is_exclusive_under_contention(
    kind: str, seaweed: SeaweedFS, bucket_name: str, tmp_path: Path
) -> None:
    """The interface both stores implement: one of many concurrent creates wins, intact."""
    from gateway.storage import FileStore, S3Store

    store: S3Store | FileStore
    if kind == "s3":
        store = S3Store(
            seaweed.endpoint, bucket_name, access_key=seaweed.access_key,
            secret_key=seaweed.secret_key,
        )  # fmt: skip
    else:
        store = FileStore(tmp_path / "files")
    store.ensure_bucket()

    def create(i: int, key: str, start: threading.Barrier, results: dict[int, bool]) -> None:
        start.wait()
        results[i] = store.create_bytes(key, f"writer {i}".encode())

    for round_ in range(10):
        key = f"ids/probe-{round_}.json"
        results: dict[int, bool] = {}
        start = threading.Barrier(8)
        threads = [threading.Thread(target=create, args=(i, key, start, results)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        winners = [i for i, won in results.items() if won]
        assert len(results) == 8 and len(winners) == 1, results
        assert store.get_bytes(key) == f"writer {winners[0]}".encode()
        assert store.create_bytes(key, b"late") is False
        assert store.get_bytes(key) == f"writer {winners[0]}".encode()


def test_seaweedfs_refuses_conditional_writes_over_an_existing_key(
    seaweed: SeaweedFS, bucket_name: str
) -> None:
    """What the S3 store relies on, shown on the SeaweedFS CI runs: `If-None-Match: *` is
    honoured by PutObject and by CompleteMultipartUpload (412, the object untouched)."""
    import datetime
    import re

    import urllib3
    from minio import Minio

    client = Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)
    client.make_bucket(bucket_name)
    http = urllib3.PoolManager()
    ttl = datetime.timedelta(minutes=5)

    def signed(method: str, key: str, **query: str) -> str:
        return client.get_presigned_url(method, bucket_name, key, ttl, extra_query_params=query)

    once = {"If-None-Match": "*"}
    assert http.request("PUT", signed("PUT", "k"), body=b"first", headers=once).status == 200
    assert http.request("PUT", signed("PUT", "k"), body=b"second", headers=once).status == 412
    assert client.get_object(bucket_name, "k").read() == b"first"

    started = http.request("POST", signed("POST", "k", uploads=""))
    upload_id = re.search(rb"<UploadId>([^<]+)</UploadId>", started.data)
    assert started.status == 200 and upload_id is not None
    uid = upload_id.group(1).decode()
    part = http.request("PUT", signed("PUT", "k", partNumber="1", uploadId=uid), body=b"third")
    assert part.status == 200
    etag = part.headers["ETag"]
    body = (
        "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber>"
        f"<ETag>{etag}</ETag></Part></CompleteMultipartUpload>"
    ).encode()
    done = http.request("POST", signed("POST", "k", uploadId=uid), body=body, headers=once)
    assert done.status == 412, done.data
    assert client.get_object(bucket_name, "k").read() == b"first"
