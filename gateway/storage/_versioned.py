"""Versioned small objects: read with a version, replace only while it still holds.

The compare-and-swap the retention state is built on (gateway/retention): an account's
ledger, a stored payload's record. On S3 a version is the object's ETag and the write is a
PUT with `If-Match: <ETag>` (replace) or `If-None-Match: *` (create), which the store
decides atomically: of writers racing from one version exactly one wins, whichever replica
they run on. AWS S3 (since November 2024), MinIO, Ceph RGW and SeaweedFS (4.48 tested: 20
races of 8 writers, one winner each, `tests/test_versioned.py`) honour both on PutObject.

A version names the content (S3's ETag of a plain PUT is its MD5, the file store's a
SHA-256), not the write: rewriting identical bytes keeps it. Callers that must tell two
writes of equal bytes apart put a nonce in them (the retention documents do).
"""

from __future__ import annotations

import datetime
import hashlib
import time
from typing import Any

import urllib3
from minio import Minio
from minio.error import MinioException, S3Error

from ._base import StoreError, Versioned

#: What a store call raises when the store cannot be reached or answers nonsense.
UNAVAILABLE = (MinioException, urllib3.exceptions.HTTPError, OSError, ValueError)


def s3_read(client: Minio, bucket: str, key: str) -> Versioned | None:
    """The object and its ETag; None when absent."""
    try:
        response = client.get_object(bucket, key)
    except S3Error as exc:
        if exc.code in ("NoSuchKey", "NoSuchObject"):
            return None
        raise StoreError(f"read of {key!r} failed: {exc}") from exc
    except UNAVAILABLE as exc:
        raise StoreError(f"read of {key!r} failed: {exc}") from exc
    try:
        data = bytes(response.read())
        etag = response.headers.get("ETag", "")
    except UNAVAILABLE as exc:
        raise StoreError(f"read of {key!r} failed: {exc}") from exc
    finally:
        response.close()
        response.release_conn()
    return Versioned(data, etag.strip('"'))


def s3_write(
    client: Minio,
    http: Any,
    bucket: str,
    key: str,
    data: bytes,
    *,
    version: str | None,
    content_type: str = "application/json",
) -> str | None:
    """Create `key` (version None) or replace it while it is at `version`; the new version,
    None when the condition did not hold (someone else wrote first, or it is gone).

    Through a presigned PUT, as `S3Store.create_bytes` (the SDK turns unknown headers into
    `x-amz-meta-*`); never retried by urllib3: a retried write that had succeeded would
    look lost. AWS answers 409 while a racing conditional write is in flight: tried again.
    """
    condition = {"If-None-Match": "*"} if version is None else {"If-Match": f'"{version}"'}
    for _attempt in range(5):
        try:
            url = client.presigned_put_object(bucket, key, expires=datetime.timedelta(minutes=5))
            response = http.request(
                "PUT",
                url,
                body=data,
                headers={**condition, "Content-Type": content_type},
                retries=False,
            )
        except UNAVAILABLE as exc:
            raise StoreError(f"write of {key!r} failed: {exc}") from exc
        if response.status == 200:
            etag = response.headers.get("ETag")
            return etag.strip('"') if etag else hashlib.md5(data).hexdigest()
        if response.status in (404, 412):  # 404: If-Match on an object that is gone
            return None
        if response.status == 409:
            time.sleep(0.05)
            continue
        detail = response.data[:300].decode("utf-8", "replace")
        raise StoreError(f"write of {key!r} failed: HTTP {response.status} {detail}")
    raise StoreError(f"write of {key!r} kept conflicting with concurrent writes")


def content_version(data: bytes) -> str:
    """The file store's version of an object: the SHA-256 of its bytes."""
    return hashlib.sha256(data).hexdigest()
