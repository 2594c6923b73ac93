"""Upload bodies go unsigned with a CRC-32C the store verifies (issue 31 item 2).

Against the real SeaweedFS: the start-up probe finds that it verifies `x-amz-checksum-crc32c`,
and from then on every body request (single PUT, UploadPart) is signed `UNSIGNED-PAYLOAD`
with the body's CRC-32C beside it, which the store checks; `checksums=False` signs with the
body's SHA-256 as before. What the SDK sent is read from its own request trace.
"""

from __future__ import annotations

import base64
import io
import os
import re
import threading

import google_crc32c
import pytest
from minio.error import S3Error

from gateway.storage import S3Store, StoreError
from gateway.storage._checksums import HEADER, crc32c_header

from _servers import SeaweedFS

pytestmark = pytest.mark.servers

MiB = 1024 * 1024


def store(seaweed: SeaweedFS, bucket: str, **kw: bool) -> S3Store:
    s3 = S3Store(
        seaweed.endpoint,
        bucket,
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
        part_size=5 * MiB,
        timeout=60,
        **kw,  # type: ignore[arg-type]
    )
    s3.ensure_bucket()
    return s3


class Trace(io.StringIO):
    """An SDK trace kept per thread, read back thread after thread.

    Parts go up two at a time, and the SDK writes one request's trace in several calls, so in
    one shared stream another thread's lines could land inside it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._threads: dict[int, list[str]] = {}

    def write(self, text: str) -> int:
        self._threads.setdefault(threading.get_ident(), []).append(text)
        return len(text)

    def getvalue(self) -> str:
        return "".join("".join(pieces) for pieces in list(self._threads.values()))


def _part_number(request: dict[str, str]) -> int:
    found = re.search(r"[?&]partNumber=([0-9]+)", request["path"])
    return int(found.group(1)) if found else 0


def body_requests(trace: str) -> list[dict[str, str]]:
    """The headers of each PUT in an SDK trace, in part order (bodies are not traced for PUTs).

    Parts are uploaded in parallel: the order they were sent in is not their order.
    """
    requests = []
    for block in trace.split("---------START-HTTP---------")[1:]:
        lines = block.strip().splitlines()
        if not lines or not lines[0].startswith("PUT "):
            continue
        headers = {}
        for line in lines[1:]:
            if not line.strip() or line.startswith("HTTP/1.1"):
                break
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        headers["path"] = lines[0]
        requests.append(headers)
    return sorted(requests, key=_part_number)


@pytest.mark.parametrize("size", [3 * MiB, 11 * MiB + 5])  # one PUT; three parts
def test_bodies_go_unsigned_with_the_crc32c_the_store_verifies(
    seaweed: SeaweedFS, bucket_name: str, size: int
) -> None:
    s3 = store(seaweed, bucket_name)
    assert s3.checksums  # SeaweedFS verifies them: the probe at start-up saw it
    data = os.urandom(size)
    trace = Trace()
    s3.client.trace_on(trace)
    try:
        s3.put_stream("obj", io.BytesIO(data), size)
    finally:
        s3.client.trace_off()
    sent = body_requests(trace.getvalue())
    assert len(sent) == (1 if size < 5 * MiB else 3)
    offset = 0
    for request in sent:
        assert request["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD", request
        length = int(request["content-length"])
        expected = google_crc32c.value(data[offset : offset + length])
        assert base64.b64decode(request[HEADER]) == expected.to_bytes(4, "big")
        offset += length
    assert offset == size
    assert s3.get_bytes("obj") == data


def test_without_checksums_bodies_are_signed_with_their_sha256(
    seaweed: SeaweedFS, bucket_name: str
) -> None:
    s3 = store(seaweed, bucket_name, checksums=False)
    assert not s3.checksums
    data = os.urandom(11 * MiB)
    trace = Trace()
    s3.client.trace_on(trace)
    try:
        s3.put_stream("obj", io.BytesIO(data), -1)
    finally:
        s3.client.trace_off()
    sent = body_requests(trace.getvalue())
    assert len(sent) == 3
    for request in sent:
        assert re.fullmatch("[0-9a-f]{64}", request["x-amz-content-sha256"]), request
        assert HEADER not in request
    assert s3.get_bytes("obj") == data


def test_the_store_refuses_a_body_whose_crc32c_does_not_match(
    seaweed: SeaweedFS, bucket_name: str
) -> None:
    """What the probe relies on, and what protects a body damaged between us and the store."""
    s3 = store(seaweed, bucket_name)
    data = os.urandom(1000)
    with pytest.raises(S3Error, match=r"BadDigest|InvalidDigest|checksum"):
        s3.client._put_object(bucket_name, "bad", data, crc32c_header(data[:-1] + b"x"))
    assert s3.get_bytes("bad") is None
    with pytest.raises(StoreError):  # nothing half-done remains either
        s3.put_stream("short", io.BytesIO(data), len(data) + 1)
    assert s3.get_bytes("short") is None
