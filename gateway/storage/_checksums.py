"""Unsigned payloads with a CRC-32C checksum: each proxied byte hashed once for the store.

Signing an S3 request over plain http means hashing its body with SHA-256 first: the
gateway already takes the payload's SHA-256 (for the manifest) and its CRC-32C in the same
pass, so that second SHA-256 was 15 % of an upload's gateway samples (bench/RESULTS.md,
issue 31). S3 lets a request sign `UNSIGNED-PAYLOAD` instead and protect the body with an
`x-amz-checksum-crc32c` header that the store verifies (400 BadDigest on a mismatch);
CRC-32C runs in hardware at ~10 GiB/s. A multipart upload then declares the algorithm when
it is created and lists each part's checksum when it is completed, as AWS requires.

A store that does not verify the checksum would take damaged bytes silently, so the
gateway only does this when a start-up probe (`probe`) saw the store refuse a wrong
checksum, take a right one, and complete a checksummed multipart upload; otherwise every
request is signed with its SHA-256 as before. Either way the manifest's SHA-256, which
every consumer checks, covers the payload end to end.
"""

from __future__ import annotations

import base64
import contextlib
import uuid
from collections.abc import Sequence
from xml.etree.ElementTree import Element, SubElement, tostring

from minio import Minio
from minio.error import S3Error
from minio.helpers import DictType, md5sum_hash

from ._crc import available, crc32c_extend

HEADER = "x-amz-checksum-crc32c"
ALGORITHM: DictType = {"x-amz-checksum-algorithm": "CRC32C"}
_PROBE_PREFIX = "probes/checksum-"


def crc32c_header(data: bytes | bytearray | memoryview, crc: int | None = None) -> DictType:
    """The header that asks the store to verify `data`'s CRC-32C (base64, big-endian);
    `crc`, when the caller has already taken it, saves a pass over `data`."""
    if crc is None:
        crc = crc32c_extend(0, data)
    return {HEADER: base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")}


def complete(
    client: Minio,
    bucket: str,
    key: str,
    upload_id: str,
    parts: Sequence[tuple[str, str]],
) -> None:
    """CompleteMultipartUpload listing each part's ETag and CRC-32C header value.

    Raises:
        ValueError: the store answered 200 with an error document (S3 may, for Complete).
    """
    root = Element("CompleteMultipartUpload")
    for number, (etag, checksum) in enumerate(parts, start=1):
        part = SubElement(root, "Part")
        SubElement(part, "PartNumber").text = str(number)
        SubElement(part, "ETag").text = f'"{etag}"'
        SubElement(part, "ChecksumCRC32C").text = checksum
    body = tostring(root)
    response = client._execute(
        "POST",
        bucket,
        key,
        body=body,
        headers={"Content-Type": "application/xml", "Content-MD5": md5sum_hash(body) or ""},
        query_params={"uploadId": upload_id},
    )
    if b"<Error>" in response.data[:512]:
        raise ValueError(f"completing {key!r} failed: {response.data[:300]!r}")


def probe(client: Minio, bucket: str) -> str | None:
    """None when the store verifies CRC-32C checksums on unsigned payloads, else why not."""
    if not available:
        return "no CRC-32C implementation in C (google_crc32c)"
    key = f"{_PROBE_PREFIX}{uuid.uuid4().hex}"
    data = b"checksum probe"
    try:
        try:
            client._put_object(bucket, key, data, crc32c_header(b"something else"))
        except S3Error:
            pass  # refused: what a store that verifies does
        else:
            return "the store took a body whose x-amz-checksum-crc32c was wrong"
        client._put_object(bucket, key, data, crc32c_header(data))
        upload_id = client._create_multipart_upload(
            bucket, key, {"Content-Type": "application/octet-stream", **ALGORITHM}
        )
        header = crc32c_header(data)
        etag = client._upload_part(bucket, key, data, header, upload_id, 1)
        complete(client, bucket, key, upload_id, [(etag, str(header[HEADER]))])
        return None
    except Exception as exc:  # any refusal means: sign as before
        return f"{type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(Exception):
            client.remove_object(bucket, key)
