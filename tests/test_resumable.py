"""Resumable uploads (tus 1.0) against the real gateway on SeaweedFS and on the file store."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.tus._locks import STALL

from _gateway import GatewayServer
from _hostile import RawRequest
from _servers import Mosquitto

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
TUS = {"Tus-Resumable": "1.0.0"}


def _meta(**items: str) -> str:
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" for k, v in items.items())


def _checksum(data: bytes) -> str:
    return "sha256 " + base64.b64encode(hashlib.sha256(data).digest()).decode()


def create(http: httpx.Client, length: int, **meta: str) -> str:
    r = http.post("/uploads/", headers={**TUS, "Upload-Length": str(length),
                                        "Upload-Metadata": _meta(**meta)})  # fmt: skip
    assert r.status_code == 201, r.text
    assert r.headers["tus-resumable"] == "1.0.0"
    assert "upload-expires" in r.headers
    return r.headers["location"]


def patch(
    http: httpx.Client, location: str, offset: int, data: bytes, checksum: str | None = None
) -> httpx.Response:
    headers = {**TUS, "Upload-Offset": str(offset),
               "Content-Type": "application/offset+octet-stream"}  # fmt: skip
    if checksum is not None:
        headers["Upload-Checksum"] = checksum
    return http.patch(location, content=data, headers=headers)


def head_offset(http: httpx.Client, location: str) -> int:
    r = http.head(location, headers=TUS)
    assert r.status_code == 200, r.status_code
    return int(r.headers["upload-offset"])


class Sub:
    def __init__(self, broker: Mosquitto, topic: str) -> None:
        self.proc = subprocess.Popen(
            ["mosquitto_sub", "-V", "5", "-p", str(broker.port), "-h", "127.0.0.1",
             "-t", topic, "-F", "%j", "-C", "1", "-W", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        time.sleep(0.5)

    def message(self) -> dict[str, object]:
        out, err = self.proc.communicate(timeout=70)
        assert self.proc.returncode == 0, err.decode()
        doc: dict[str, object] = json.loads(out)
        return doc


def _segment_objects(gw: GatewayServer, upload_id: str) -> list[str]:
    from gateway._app import build_store

    return [o.key for o in build_store(gw.settings).list(f"uploads/{upload_id}/")]


@pytest.fixture
def gw(gateway_factory: Callable[..., GatewayServer], broker: Mosquitto) -> GatewayServer:
    return gateway_factory(broker, allow_anonymous=True)


def test_options_advertises_the_extensions(gw: GatewayServer) -> None:
    r = httpx.options(f"{gw.url}/uploads/")
    assert r.status_code == 204
    assert r.headers["tus-version"] == "1.0.0"
    assert set(r.headers["tus-extension"].split(",")) >= {"creation", "checksum", "expiration"}
    assert set(r.headers["tus-checksum-algorithm"].split(",")) == {"sha1", "md5", "crc32", "sha256"}
    assert {"creation-with-upload", "concatenation"} <= set(r.headers["tus-extension"].split(","))


def test_segments_with_checksums_complete_and_publish(
    gw: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("tus")
    payload = os.urandom(13 * MiB + 5)
    parts = [payload[: 6 * MiB], payload[6 * MiB : 12 * MiB], payload[12 * MiB :]]
    sub = Sub(broker, topic)
    with httpx.Client(base_url=gw.url, timeout=60) as http:
        loc = create(http, len(payload), topic=topic, filename="big.bin",
                     content_type="application/x-test", **{"prop.origin": "tus"})  # fmt: skip
        upload_id = loc.rsplit("/", 1)[-1]
        offset = 0
        for part in parts:
            r = patch(http, loc, offset, part, _checksum(part))
            assert r.status_code == 204, r.text
            offset += len(part)
            assert int(r.headers["upload-offset"]) == offset
        assert r.headers["x-offload-url"].endswith("/msg/" + r.headers["x-offload-id"])
        assert r.headers["x-offload-sha256"] == hashlib.sha256(payload).hexdigest()
        url = r.headers["x-offload-url"]
        fetched = http.get(url + "/payload")
        assert fetched.content == payload
        assert fetched.headers["etag"] == f'"{hashlib.sha256(payload).hexdigest()}"'
        assert fetched.headers["content-type"] == "application/x-test"
        assert "big.bin" in fetched.headers["content-disposition"]
        # A client whose last answer was lost learns the result with HEAD.
        again = http.head(loc, headers=TUS)
        assert again.headers["x-offload-url"] == url
        assert int(again.headers["upload-offset"]) == len(payload)
    message = sub.message()
    placeholder = json.loads(str(message["payload"]))
    assert placeholder["url"] == url
    assert placeholder["sha256"] == hashlib.sha256(payload).hexdigest()
    assert _segment_objects(gw, upload_id) == []  # staged segments removed


def test_corrupted_segment_is_rejected_alone(
    gw: GatewayServer, unique_topic: Callable[[str], str]
) -> None:
    payload = os.urandom(3 * MiB)
    with httpx.Client(base_url=gw.url, timeout=60) as http:
        loc = create(http, len(payload), topic=unique_topic("bad"),
                     sha256=hashlib.sha256(payload).hexdigest())  # fmt: skip
        assert patch(http, loc, 0, payload[:MiB], _checksum(payload[:MiB])).status_code == 204
        corrupted = bytearray(payload[MiB : 2 * MiB])
        corrupted[1000] ^= 0xFF
        r = patch(http, loc, MiB, bytes(corrupted), _checksum(payload[MiB : 2 * MiB]))
        assert r.status_code == 460, r.text
        assert r.headers["tus-resumable"] == "1.0.0"
        assert head_offset(http, loc) == MiB  # the good segment stays, the bad one is gone
        upload_id = loc.rsplit("/", 1)[-1]
        assert len(_segment_objects(gw, upload_id)) == 1
        seg = payload[MiB:]
        r = patch(http, loc, MiB, seg, _checksum(seg))
        assert r.status_code == 204, r.text
        assert http.get(r.headers["x-offload-url"] + "/payload").content == payload


def test_protocol_errors(gw: GatewayServer, unique_topic: Callable[[str], str]) -> None:
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        no_version = http.post("/uploads/", headers={"Upload-Length": "3"})
        assert no_version.status_code == 412
        no_topic = http.post("/uploads/", headers={**TUS, "Upload-Length": "3"})
        assert no_topic.status_code == 400
        loc = create(http, 10, topic=unique_topic("err"))
        assert patch(http, loc, 5, b"abc").status_code == 409
        assert patch(http, loc, 0, b"x" * 11).status_code == 413
        sha512 = patch(http, loc, 0, b"abc", "sha512 kAFQmDzST7DWlj99KOF/cg==")
        assert sha512.status_code == 400 and "sha1" in sha512.json()["detail"]
        short = patch(http, loc, 0, b"abc", "sha1 kAFQmDzST7DWlj99KOF/cg==")  # 16 bytes
        assert short.status_code == 400
        wrong_type = http.patch(loc, content=b"a", headers={**TUS, "Upload-Offset": "0"})
        assert wrong_type.status_code == 415
        assert http.delete(loc, headers=TUS).status_code == 204
        assert http.head(loc, headers=TUS).status_code == 404


def test_whole_payload_checksum_mismatch_discards(
    gw: GatewayServer, unique_topic: Callable[[str], str]
) -> None:
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        loc = create(http, 4, topic=unique_topic("whole"), sha256="0" * 64)
        r = patch(http, loc, 0, b"abcd")
        assert r.status_code == 460
        assert "whole payload" in r.json()["detail"]
        assert http.head(loc, headers=TUS).status_code == 404


def test_small_segments_and_broker_retry(
    gateway_factory: Callable[..., GatewayServer],
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
) -> None:
    """Segments below S3's 5 MiB part minimum are copied through; a 503 at the end retries."""
    broker = mosquitto_factory()
    gw = gateway_factory(broker, allow_anonymous=True)
    payload = os.urandom(700_000)
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        loc = create(http, len(payload), topic=unique_topic("small"))
        for start in range(0, len(payload) - 100_000, 100_000):
            assert patch(http, loc, start, payload[start : start + 100_000]).status_code == 204
        broker.stop()
        deadline = time.monotonic() + 15
        while http.get("/readyz").json()["checks"].get("broker") == "ok":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        last = len(payload) - 100_000
        r = patch(http, loc, last, payload[last:])
        assert r.status_code == 503 and "broker" in r.json()["detail"]
        assert head_offset(http, loc) == len(payload)  # all bytes kept, not yet announced
        broker.start()
        deadline = time.monotonic() + 20
        while http.get("/readyz").json()["checks"].get("broker") != "ok":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        r = patch(http, loc, len(payload), b"")  # an empty PATCH at the end retries
        assert r.status_code == 204, r.text
        assert http.get(r.headers["x-offload-url"] + "/payload").content == payload


def test_file_store_and_expiry_cleanup(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    tmp_path: Path,
    unique_topic: Callable[[str], str],
) -> None:
    from gateway.storage import FileStore
    from gateway.tus._uploads import cleanup_expired_uploads

    gw = gateway_factory(
        broker, storage_url=f"file://{tmp_path}", upload_expiry=2, allow_anonymous=True
    )
    payload = os.urandom(6 * MiB + 1)
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        done = create(http, len(payload), topic=unique_topic("fs"))
        patch(http, done, 0, payload[: 5 * MiB]).raise_for_status()
        r = patch(http, done, 5 * MiB, payload[5 * MiB :])
        assert http.get(r.headers["x-offload-url"] + "/payload").content == payload
        abandoned = create(http, 100, topic=unique_topic("fs"))
        patch(http, abandoned, 0, b"x" * 40).raise_for_status()
        store = FileStore(tmp_path)
        assert cleanup_expired_uploads(store, time.time()) == 0  # nothing expired yet
        time.sleep(2.5)
        assert http.head(abandoned, headers=TUS).status_code == 410
        assert cleanup_expired_uploads(store, time.time()) == 2  # the abandoned and the done
    assert [i.key for i in store.list("uploads/")] == []
    assert [i.key for i in store.list("data/")]  # the finished message stays


# A client resumes (HEAD, then PATCH) while its lost PATCH is still at the gateway:
# tus-js-client after a page reload, whose resumed PATCH got 409 when the old one landed
# after its HEAD. One request at a time per upload (gateway/tus/_locks.py).
SEGMENT = 256 * 1024


def _raw_patch(gw: GatewayServer, path: str, body: bytes) -> RawRequest:
    return RawRequest(
        gw.port,
        f"PATCH {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nTus-Resumable: 1.0.0\r\n"
        "Upload-Offset: 0\r\nContent-Type: application/offset+octet-stream\r\n"
        f"Content-Length: {len(body)}\r\n\r\n",
        body=body,
    )


def test_a_head_polling_a_live_patch_waits_for_it_and_breaks_nothing(
    gw: GatewayServer,
    unique_topic: Callable[[str], str],
) -> None:
    payload = os.urandom(SEGMENT)
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        location = create(http, 2 * SEGMENT, topic=unique_topic("lock"))
        live = _raw_patch(gw, location.removeprefix(gw.url), payload)
        piece = SEGMENT // 8
        try:
            live.send(piece)
            time.sleep(0.25)  # the gateway is receiving it
            polled: list[int] = []
            poll = threading.Thread(target=lambda: polled.append(head_offset(http, location)))
            poll.start()
            for _ in range(7):  # the rest, a piece every 0.25 s: slow, never stalled
                time.sleep(0.25)
                live.send(piece)
            poll.join(10)
            answer = live.response_head(10)
            assert answer.startswith(b"HTTP/1.1 204"), answer  # not stopped by the HEAD
        finally:
            live.close()
        assert polled == [SEGMENT]  # answered once the PATCH was done: what the next finds


def test_a_resume_takes_over_from_the_lost_patch_still_arriving(
    gw: GatewayServer,
    unique_topic: Callable[[str], str],
) -> None:
    payload = os.urandom(2 * SEGMENT)
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        location = create(http, len(payload), topic=unique_topic("lock"))
        # The "lost" PATCH: half its segment is at the gateway, its client gone silent
        # (a connection that died without a word), the rest may still come later.
        lost = _raw_patch(gw, location.removeprefix(gw.url), payload[:SEGMENT])
        try:
            lost.send(SEGMENT // 2)
            time.sleep(0.5)  # the gateway is receiving it
            began = time.monotonic()
            assert head_offset(http, location) == 0  # the client resumes
            # Once the lost PATCH's body had stalled for STALL seconds, it was stopped.
            assert STALL - 0.6 < time.monotonic() - began < STALL + 3
            with contextlib.suppress(OSError):  # (the gateway may have closed it)
                lost.send(SEGMENT - SEGMENT // 2)  # the rest arrives after the HEAD
            answer = lost.response_head(10)
            assert answer.startswith(b"HTTP/1.1 400"), answer
            assert b"connection: close" in answer.lower(), answer
            assert lost.rest_until_closed(5) is not None  # and it closes
        finally:
            lost.close()
        # Without the lock the lost PATCH landed after the HEAD: this one got 409.
        first = patch(http, location, 0, payload[:SEGMENT])
        assert first.status_code == 204, first.text
        last = patch(http, location, SEGMENT, payload[SEGMENT:])
        assert last.status_code == 204, last.text
        assert last.headers["x-offload-sha256"] == hashlib.sha256(payload).hexdigest()
        assert http.get(last.headers["x-offload-url"] + "/payload").content == payload


def test_delete_takes_over_from_a_patch_under_way(
    gw: GatewayServer,
    unique_topic: Callable[[str], str],
) -> None:
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        location = create(http, 2 * SEGMENT, topic=unique_topic("lock"))
        writing = _raw_patch(gw, location.removeprefix(gw.url), os.urandom(SEGMENT))
        try:
            writing.send(1000)
            time.sleep(0.5)
            began = time.monotonic()
            assert http.delete(location, headers=TUS).status_code == 204
            assert time.monotonic() - began < 1  # at once: the owner ends the upload
            with contextlib.suppress(OSError):
                writing.send(SEGMENT - 1000)  # the rest comes: it was already discarded
            assert writing.response_head(10).startswith(b"HTTP/1.1 400")
        finally:
            writing.close()
        assert http.head(location, headers=TUS).status_code == 404
