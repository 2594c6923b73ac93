"""The offload API against real SeaweedFS, through real HTTP."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable

import bson
import httpx
import pytest
from minio import Minio

from _gateway import GatewayServer
from _servers import SeaweedFS

pytestmark = pytest.mark.servers


@pytest.fixture
def gw(gateway_factory: Callable[..., GatewayServer]) -> GatewayServer:
    return gateway_factory(None)


def upload_doc(payload: bytes, msg_id: uuid.UUID | None, key: bytes | None = None) -> bytes:
    headers: list[list[object]] = [["_format", b"blob"]]
    if msg_id is not None:
        headers.insert(0, ["_id", bson.Binary(msg_id.bytes)])
    doc: dict[str, object] = {"message": bson.Binary(payload), "headers": headers}
    if key is not None:
        doc["key"] = bson.Binary(key)
    return bson.encode(doc)


def test_upload_then_download_both_shapes(gw: GatewayServer) -> None:
    payload = os.urandom(3 * 1024 * 1024 + 17)
    msg_id = uuid.uuid4()
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        r = http.post("/topic/a/b c+oversized", content=upload_doc(payload, msg_id, b"k"))
        assert r.status_code == 201, r.text
        assert r.headers["location"] == f"/msg/{msg_id}"
        body = r.json()
        assert body["id"] == str(msg_id)
        assert body["sha256"] == hashlib.sha256(payload).hexdigest()
        assert body["size"] == len(payload)
        raw = http.get(f"/msg/{msg_id}/payload")
        assert raw.status_code == 200
        assert raw.content == payload
        assert raw.headers["etag"] == f'"{body["sha256"]}"'
        doc = bson.decode(http.get(f"/msg/{msg_id}").content)
        assert doc["message"] == payload
        assert doc["metadata"]["topic"] == "a/b c"
        assert doc["metadata"]["key"] == b"k"
        assert isinstance(doc["metadata"]["timestamp"], int)
        assert ["_id", msg_id.bytes] in [list(h) for h in doc["metadata"]["headers"]]


def test_idempotent_retry_and_conflict(gw: GatewayServer) -> None:
    msg_id = uuid.uuid4()
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        first = http.post("/topic/t+oversized", content=upload_doc(b"same", msg_id))
        again = http.post("/topic/t+oversized", content=upload_doc(b"same", msg_id))
        other = http.post("/topic/t+oversized", content=upload_doc(b"different", msg_id))
    assert (first.status_code, again.status_code, other.status_code) == (201, 201, 409)
    assert again.json()["created"] is False
    assert "already exists" in other.json()["detail"]


def test_gateway_assigns_an_id_when_none_is_sent(gw: GatewayServer) -> None:
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        r = http.post("/topic/t+oversized", content=upload_doc(b"x" * 10, None))
        assert r.status_code == 201
        assigned = r.json()["id"]
        assert http.get(f"/msg/{assigned}/payload").content == b"x" * 10


def test_ranges_etag_and_head(gw: GatewayServer) -> None:
    payload = bytes(range(256)) * 4
    msg_id = uuid.uuid4()
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        assert http.post("/topic/r+oversized", content=upload_doc(payload, msg_id)).is_success
        url = f"/msg/{msg_id}/payload"
        part = http.get(url, headers={"Range": "bytes=100-199"})
        assert part.status_code == 206
        assert part.content == payload[100:200]
        assert part.headers["content-range"] == f"bytes 100-199/{len(payload)}"
        tail = http.get(url, headers={"Range": "bytes=-10"})
        assert tail.content == payload[-10:]
        assert http.get(url, headers={"Range": "bytes=5000-"}).status_code == 416
        etag = http.head(url).headers["etag"]
        assert http.get(url, headers={"If-None-Match": etag}).status_code == 304
        head = http.head(f"/msg/{msg_id}")
        assert head.status_code == 200
        assert int(head.headers["content-length"]) == len(http.get(f"/msg/{msg_id}").content)


@pytest.mark.parametrize(
    ("path", "body", "status", "reason"),
    [
        ("/topic/t+oversized", b"", 400, ""),
        ("/topic/t+oversized", b"\x05\x00\x00\x00", 400, ""),
        ("/topic/t+oversized", b"junk junk junk junk", 400, ""),
        ("/topic/t+oversized", b"\xff\xff\xff\x7f\x00", 400, "declares"),
        ("/topic/t+oversized", bson.encode({"message": "text"}), 400, "message"),
        ("/topic/t+oversized", bson.encode({"headers": []}), 400, "message"),
        ("/topic/t+oversized", bson.encode({"message": b"x", "headers": [[1, b"x"]]}), 400, ""),
        ("/topic/a/+/b+oversized", bson.encode({"message": b"x"}), 400, "wildcard"),
        ("/topic/a/#+oversized", bson.encode({"message": b"x"}), 400, ""),
        ("/topic/+oversized", bson.encode({"message": b"x"}), 400, "empty"),
        ("/topic/t", bson.encode({"message": b"x"}), 400, "+oversized"),
        ("/topic/$SYS/x+oversized", bson.encode({"message": b"x"}), 400, "reserved"),
    ],
)
def test_bad_uploads_get_4xx_with_reason(
    gw: GatewayServer, path: str, body: bytes, status: int, reason: str
) -> None:
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        r = http.post(path, content=body)
        assert r.status_code == status, r.text
        assert reason in r.json()["detail"]
        assert http.get("/healthz").status_code == 200


def test_length_lying_document_is_rejected_and_nothing_is_stored(
    gw: GatewayServer, seaweed: SeaweedFS, bucket_name: str
) -> None:
    doc = bytearray(upload_doc(b"y" * 1000, uuid.uuid4()))
    doc[0:4] = (len(doc) + 500).to_bytes(4, "little")  # claims more than is sent
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        r = http.post("/topic/t+oversized", content=bytes(doc))
    assert r.status_code == 400
    assert "declares" in r.json()["detail"]
    s3 = Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)
    assert [o.object_name for o in s3.list_objects(bucket_name, recursive=True)] == []


# A fixed id, not uuid4(): every xdist worker must collect the same test ids.
UNKNOWN_ID = "6f1c2a9e-4b7d-4e3a-9c5f-0d8e7b6a5c4d"


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/msg/not-a-uuid", 400),
        ("/msg/../../etc/passwd", 404),
        (f"/msg/{UNKNOWN_ID}", 404),
        ("/msg/%2e%2e%2fids", 404),
        (f"/msg/{UNKNOWN_ID}/payload", 404),
    ],
)
def test_bad_and_unknown_ids(gw: GatewayServer, path: str, status: int) -> None:
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        assert http.get(path).status_code == status


def test_declared_body_too_large_is_413(gateway_factory: Callable[..., GatewayServer]) -> None:
    small = gateway_factory(None, max_body_bytes=1000)
    with httpx.Client(base_url=small.url, timeout=30) as http:
        r = http.post("/topic/t+oversized", content=upload_doc(b"z" * 2000, uuid.uuid4()))
    assert r.status_code == 413
    assert "1000" in r.json()["detail"]


def test_streamed_body_over_the_limit_is_413_without_content_length(
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    small = gateway_factory(None, max_body_bytes=1000)
    body = upload_doc(b"z" * 5000, uuid.uuid4())

    def chunks():  # type: ignore[no-untyped-def]
        for i in range(0, len(body), 512):
            yield body[i : i + 512]

    with httpx.Client(base_url=small.url, timeout=30) as http:
        r = http.post("/topic/t+oversized", content=chunks())
        assert r.status_code == 413, r.text
        assert http.get("/healthz").status_code == 200


def test_file_store_needs_no_server(tmp_path: object) -> None:
    from gateway import Settings

    server = GatewayServer(Settings(storage_url=f"file://{tmp_path}", allow_anonymous=True)).start()
    try:
        msg_id = uuid.uuid4()
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.post("/topic/f+oversized", content=upload_doc(b"disk", msg_id)).is_success
            assert http.get(f"/msg/{msg_id}/payload").content == b"disk"
            assert http.get("/readyz").status_code == 200
    finally:
        server.stop()


def test_metrics_and_request_ids(gw: GatewayServer) -> None:
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        r = http.post("/topic/m+oversized", content=upload_doc(b"m" * 100, uuid.uuid4()))
        assert r.status_code == 201
        assert len(r.headers["x-request-id"]) == 32
        echoed = http.get("/healthz", headers={"X-Request-ID": "abc-123"})
        assert echoed.headers["x-request-id"] == "abc-123"
        text = httpx.get(gw.metrics_url).text
        assert http.get("/metrics").status_code == 404  # never on the API's port
    counter = 'offload_http_requests_total{method="POST",route="/topic/{topic:path}",status="201"}'
    assert counter in text
    assert "offload_uploads_total" in text
    assert "offload_http_received_bytes_total" in text


def test_manifest_cache_never_outlives_a_local_delete() -> None:
    import asyncio

    from client.protocol import Manifest, MessageId, Topic
    from gateway.ingest._service import ManifestCache

    cache = ManifestCache(size=2, ttl=60)
    manifests = [
        Manifest(MessageId.new(), Topic("t"), 0, 1, "00" * 32, f"data/t/{i}") for i in range(3)
    ]
    for m in manifests:
        cache.put(m)
    assert cache.get(manifests[0].id) is None  # evicted: bounded
    assert cache.get(manifests[2].id) == manifests[2]
    cache.evict(manifests[2].id)
    assert cache.get(manifests[2].id) is None
    expired = ManifestCache(ttl=0)
    expired.put(manifests[1])
    asyncio.run(asyncio.sleep(0.01))
    assert expired.get(manifests[1].id) is None
