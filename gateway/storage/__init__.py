"""Object storage behind the gateway: an interface and its two implementations."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from ._base import (
    AsyncBody,
    DirectStore,
    ObjectInfo,
    ObjectStore,
    StoreError,
    SupportsAsyncRead,
    SupportsAsyncWrite,
    SupportsDirect,
    Versioned,
)
from ._crc import available as crc32c_available
from ._crc import crc32c_combine, crc32c_extend
from ._file import FileStore
from ._s3 import S3Store

__all__ = [
    "AsyncBody",
    "DirectStore",
    "FileStore",
    "ObjectInfo",
    "ObjectStore",
    "S3Store",
    "StoreError",
    "SupportsAsyncRead",
    "SupportsAsyncWrite",
    "SupportsDirect",
    "Versioned",
    "crc32c_available",
    "crc32c_combine",
    "crc32c_extend",
    "open_store",
]


def open_store(
    url: str,
    *,
    access_key: str | None = None,
    secret_key: str | None = None,
    region: str | None = None,
    part_size: int = 8 * 1024 * 1024,
    parallel_uploads: int = 2,
    part_memory: int = 128 * 1024 * 1024,
    checksums: bool = True,
    timeout: float = 10.0,
) -> S3Store | FileStore:
    """Open the store a storage URL names.

    Args:
        url: `s3://HOST:PORT/BUCKET?secure=false|true&region=R` or `file:///PATH`.
        access_key: S3 access key.
        secret_key: S3 secret key.
        region: S3 region (overrides `region=` in the URL).
        part_size: multipart part size in bytes.
        parallel_uploads: parts in flight per upload.
        part_memory: part buffers all uploads share (see `S3Store`).
        checksums: unsigned bodies with a CRC-32C the store verifies, if it does.
        timeout: seconds an S3 request may wait for the store's next bytes (connecting is
            bounded separately, at most 3 s, so a store that is down still fails fast).
    """
    parts = urlsplit(url)
    if parts.scheme == "file":
        return FileStore(Path(unquote(parts.path)))
    if parts.scheme != "s3":
        raise ValueError(f"unsupported storage URL scheme {parts.scheme!r}")
    bucket = parts.path.strip("/")
    if not parts.netloc or not bucket or "/" in bucket:
        raise ValueError("storage URL must be s3://HOST:PORT/BUCKET")
    query = parse_qs(parts.query)
    secure = query.get("secure", ["true"])[0].lower() in ("1", "true", "yes")
    return S3Store(
        parts.netloc,
        bucket,
        access_key=access_key,
        secret_key=secret_key,
        secure=secure,
        region=region or query.get("region", [None])[0],
        part_size=part_size,
        parallel_uploads=parallel_uploads,
        part_memory=part_memory,
        checksums=checksums,
        timeout=timeout,
    )
