"""The gateway records each payload's CRC-32C in its manifest, on every ingest path.

Peers send through the running gateway (on SeaweedFS, with a real broker): the client
library's BSON upload, hop-client's document, curl and httpx on `/publish`, tuspy and plain
tus PATCHes (one replica, two replicas, concatenation). Each manifest, read from the store
as the Spark source reads it, must hold google_crc32c's value over the bytes that were sent,
in the sidecar and in the id index alike.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import google_crc32c
import httpx
import pytest
from hop import bson as hop_bson
from test_resumable import TUS, _meta, create, patch
from tusclient.client import TusClient

from client import Client, Route
from client.protocol import Manifest, MessageId, index_key, meta_key

from _gateway import GatewayServer

pytestmark = pytest.mark.servers

KiB = 1024
MiB = 1024 * KiB


def crc(data: bytes) -> str:
    return f"{google_crc32c.value(data):08x}"


def stored_manifest(gw: GatewayServer, message_id: str) -> Manifest:
    """The message's manifest from the id index, checked against its sidecar."""
    from gateway._app import build_store

    store = build_store(gw.settings)
    raw = store.get_bytes(index_key(MessageId.parse(message_id)))
    assert raw is not None, message_id
    manifest = Manifest.from_json(raw)
    sidecar = store.get_bytes(meta_key(manifest.data_key))
    assert sidecar is not None and Manifest.from_json(sidecar) == manifest
    assert "crc32c" in json.loads(raw)  # written as a field of its own, not under `extra`
    return manifest


def assert_recorded(gw: GatewayServer, message_id: str, payload: bytes) -> None:
    manifest = stored_manifest(gw, message_id)
    assert manifest.size == len(payload)
    assert manifest.crc32c == crc(payload)


@pytest.fixture
def gw(gateway: GatewayServer) -> GatewayServer:
    return gateway


def test_client_library_offload(
    gw: GatewayServer, clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    payload = os.urandom(3 * MiB + 11)  # past the 256 KiB broker: offloaded as a BSON upload
    result = clients().publish(unique_topic("crc"), payload)
    assert result.route is Route.OFFLOADED and result.message_id is not None
    assert_recorded(gw, result.message_id, payload)


def test_hop_client_document(gw: GatewayServer, unique_topic: Callable[[str], str]) -> None:
    msg_id = uuid.uuid4()
    payload = bytes(range(256)) * 5000
    # What hop.io.Producer._send_large_message builds, in hop-client's own BSON codec.
    body = hop_bson.dumps({"message": payload, "headers": [("_id", msg_id.bytes)]})
    r = httpx.post(f"{gw.url}/topic/{unique_topic('hop')}+oversized", content=body, timeout=30)
    assert r.status_code == 201, r.text
    assert_recorded(gw, str(msg_id), payload)


@pytest.mark.parametrize("size", [0, 1, 9 * MiB + 3])  # empty, tiny, more than one S3 part
def test_curl_publish(
    gw: GatewayServer, unique_topic: Callable[[str], str], tmp_path: Path, size: int
) -> None:
    payload = os.urandom(size)
    source = tmp_path / "body.bin"
    source.write_bytes(payload)
    done = subprocess.run(
        ["curl", "-sS", "--fail-with-body", "--data-binary", f"@{source}",
         f"{gw.url}/publish/{unique_topic('curl')}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    assert_recorded(gw, json.loads(done.stdout)["id"], payload)


def test_chunked_publish(gw: GatewayServer, unique_topic: Callable[[str], str]) -> None:
    payload = os.urandom(2 * MiB + 5)

    def body() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        for start in range(0, len(payload), 100 * KiB):
            yield payload[start : start + 100 * KiB]

    r = httpx.post(f"{gw.url}/publish/{unique_topic('chunked')}", content=body(), timeout=60)
    assert r.status_code == 201, r.text
    assert_recorded(gw, r.json()["id"], payload)


def test_tuspy_upload(
    gw: GatewayServer, unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    payload = os.urandom(700 * KiB + 3)
    source = tmp_path / "tuspy.bin"
    source.write_bytes(payload)
    uploader = TusClient(f"{gw.url}/uploads/").uploader(
        file_path=str(source), chunk_size=256 * KiB, upload_checksum=True,
        metadata={"topic": unique_topic("tuspy")},
    )  # fmt: skip
    uploader.upload()  # type: ignore[attr-defined]
    with httpx.Client(timeout=30) as http:
        head = http.head(uploader.url, headers=TUS)  # type: ignore[attr-defined]
    assert_recorded(gw, head.headers["x-offload-id"], payload)


def test_tus_upload_finished_by_another_replica(
    gateway_factory: Callable[..., GatewayServer],
    gw: GatewayServer,
    unique_topic: Callable[[str], str],
) -> None:
    """The replica that assembles never saw the first segment: it reads the payload back."""
    other = gateway_factory(gw.broker)  # type: ignore[attr-defined]
    payload = os.urandom(300 * KiB + 7)
    with httpx.Client(base_url=gw.url, timeout=30) as first:
        location = create(first, len(payload), topic=unique_topic("replicas"))
        assert patch(first, location, 0, payload[: 100 * KiB]).status_code == 204
    path = httpx.URL(location).path
    with httpx.Client(base_url=other.url, timeout=30) as second:
        done = patch(second, path, 100 * KiB, payload[100 * KiB :])
    assert done.status_code == 204, done.text
    assert_recorded(gw, done.headers["x-offload-id"], payload)


def test_tus_concatenation(gw: GatewayServer, unique_topic: Callable[[str], str]) -> None:
    topic = unique_topic("concat")
    pieces = [os.urandom(70 * KiB), os.urandom(1), os.urandom(33 * KiB)]
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        parts = []
        for piece in pieces:
            r = http.post("/uploads/", headers={
                **TUS, "Upload-Concat": "partial", "Upload-Length": str(len(piece)),
                "Upload-Metadata": _meta(topic=topic)})  # fmt: skip
            assert r.status_code == 201, r.text
            assert patch(http, r.headers["location"], 0, piece).status_code == 204
            parts.append(r.headers["location"])
        final = http.post("/uploads/", headers={
            **TUS, "Upload-Concat": "final;" + " ".join(parts),
            "Upload-Metadata": _meta(topic=topic)})  # fmt: skip
    assert final.status_code == 201, final.text
    assert_recorded(gw, final.headers["x-offload-id"], b"".join(pieces))


def test_manifest_without_crc32c_still_parses_and_bad_ones_are_refused() -> None:
    """Manifests written before the field existed have none; a malformed one is an error."""
    from client.protocol import ProtocolError, Topic

    old = Manifest(MessageId.new(), Topic("a/b"), 0, 3, "0" * 64, "data/a/b/x")
    doc = json.loads(old.to_json())
    assert "crc32c" not in doc  # readers that predate the field see what they always saw
    assert Manifest.from_json(old.to_json()).crc32c is None
    new = Manifest.from_json(json.dumps(doc | {"crc32c": "0a1b2c3d"}).encode())
    assert new.crc32c == "0a1b2c3d" and json.loads(new.to_json())["crc32c"] == "0a1b2c3d"
    for bad in ("0A1B2C3D", "123", 12345678, "0a1b2c3g"):
        with pytest.raises(ProtocolError):
            Manifest.from_json(json.dumps(doc | {"crc32c": bad}).encode())


def test_crc32c_of_a_concatenation_from_its_parts() -> None:
    """`crc32c_combine` (a part's CRC-32C extends the object's: one pass over each byte)
    against google_crc32c over the whole, for splits of every kind."""
    from gateway.storage import crc32c_combine

    rng = random.Random(7)
    for _ in range(200):
        a = rng.randbytes(rng.randrange(0, 3000))
        b = rng.randbytes(rng.choice([0, 1, 2, 3, 7, 8, rng.randrange(0, 70000)]))
        combined = crc32c_combine(google_crc32c.value(a), google_crc32c.value(b), len(b))
        assert combined == google_crc32c.value(a + b), (len(a), len(b))
    # An object in parts of 5 MiB and a short last one, as a multipart upload takes them.
    whole = rng.randbytes(2 * 5 * MiB + 12345)
    crc = 0
    for start in range(0, len(whole), 5 * MiB):
        part = whole[start : start + 5 * MiB]
        crc = crc32c_combine(crc, google_crc32c.value(part), len(part))
    assert crc == google_crc32c.value(whole)
