"""tuspy, the tus project's Python client, against the running gateway: no code of ours.

tuspy with `upload_checksum=True` sends `Upload-Checksum: sha1 ...` on every PATCH, the
algorithm the tus checksum extension says a server must support.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from test_resumable import TUS, Sub
from tusclient.client import TusClient
from tusclient.storage.filestorage import FileStorage

from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

KiB = 1024


@pytest.fixture
def gw(gateway_factory: Callable[..., GatewayServer], broker: Mosquitto) -> GatewayServer:
    return gateway_factory(broker, allow_anonymous=True)


def test_tuspy_with_checksums_stops_after_one_segment_and_a_new_uploader_resumes(
    gw: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_topic("tuspy")
    payload = os.urandom(700 * KiB + 3)
    sub = Sub(broker, topic)
    client = TusClient(f"{gw.url}/uploads/")
    metadata = {"topic": topic, "filename": "tuspy.bin", "filetype": "application/x-tuspy"}
    storage = FileStorage(str(tmp_path / "tus-urls.json"))
    source = tmp_path / "tuspy.bin"  # a path: tuspy closes a stream it fingerprints
    source.write_bytes(payload)

    def uploader() -> object:
        return client.uploader(
            file_path=str(source), chunk_size=256 * KiB, metadata=metadata,
            upload_checksum=True, store_url=True, url_storage=storage,
        )  # fmt: skip

    first = uploader()
    first.upload_chunk()  # type: ignore[attr-defined]
    assert first.offset == 256 * KiB  # type: ignore[attr-defined]
    location = first.url  # type: ignore[attr-defined]
    with httpx.Client(timeout=30) as http:
        assert http.head(location, headers=TUS).headers["upload-offset"] == str(256 * KiB)

    # The process "dies"; a new uploader finds the URL by the file's fingerprint and resumes.
    second = uploader()
    assert second.url == location  # type: ignore[attr-defined]
    assert second.offset == 256 * KiB  # type: ignore[attr-defined]
    second.upload()  # type: ignore[attr-defined]
    assert second.offset == len(payload)  # type: ignore[attr-defined]
    sha256 = hashlib.sha256(payload).hexdigest()
    with httpx.Client(timeout=30) as http:
        head = http.head(location, headers=TUS)
        assert head.headers["x-offload-sha256"] == sha256
        fetched = http.get(head.headers["x-offload-url"] + "/payload")
        assert fetched.content == payload
        assert fetched.headers["content-type"] == "application/x-tuspy"
    placeholder = json.loads(str(sub.message()["payload"]))
    assert placeholder["url"] == head.headers["x-offload-url"]
    assert placeholder["sha256"] == sha256
