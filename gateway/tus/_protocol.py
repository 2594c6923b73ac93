"""tus 1.0 header parsing and checksums: pure code over header strings and bytes, no I/O.

The checksum extension says a server MUST support `sha1`; tusd also offers `md5`, `crc32`
and `sha256`, and clients pick from what `Tus-Checksum-Algorithm` lists (tuspy sends `sha1`
unless told otherwise), so all four are offered. `crc32` is IEEE CRC-32 as 4 big-endian
bytes, as tusd encodes it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import zlib
from dataclasses import dataclass
from email.utils import formatdate
from typing import Protocol
from urllib.parse import urlsplit

from ..core import BadRequest, NotFound

TUS_VERSION = "1.0.0"
TUS_EXTENSIONS = "creation,creation-with-upload,checksum,expiration,termination,concatenation"
MAX_PARTS = 64  # partial uploads one final upload may name


class Hasher(Protocol):
    """The part of hashlib's interface a segment check needs."""

    def update(self, data: bytes, /) -> None: ...

    def digest(self) -> bytes: ...


class _Crc32:
    """zlib.crc32 behind hashlib's update/digest interface."""

    def __init__(self) -> None:
        self._value = 0

    def update(self, data: bytes, /) -> None:
        self._value = zlib.crc32(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(4, "big")


# algorithm -> (digest size in bytes, a new hasher); the order is the advertised one.
_ALGORITHMS: dict[str, tuple[int, type[Hasher] | None]] = {
    "sha1": (20, None),
    "md5": (16, None),
    "crc32": (4, _Crc32),
    "sha256": (32, None),
}
CHECKSUM_ALGORITHMS = ",".join(_ALGORITHMS)


@dataclass(frozen=True, slots=True)
class Checksum:
    """An `Upload-Checksum` header: the algorithm and the expected digest."""

    algorithm: str
    digest: bytes

    def new(self) -> Hasher:
        """A fresh hasher of this algorithm."""
        factory = _ALGORITHMS[self.algorithm][1]
        if factory is not None:
            return factory()
        return hashlib.new(self.algorithm)

    def describe(self, digest: bytes) -> str:
        return f"{self.algorithm} {base64.b64encode(digest).decode('ascii')}"


def parse_checksum(header: str | None) -> Checksum | None:
    """`Upload-Checksum: <algorithm> <base64 digest>`; None when absent.

    Raises:
        BadRequest: an algorithm not offered (tus answers 400) or a malformed digest.
    """
    if header is None:
        return None
    algorithm, _, encoded = header.strip().partition(" ")
    algorithm = algorithm.lower()
    if algorithm not in _ALGORITHMS:
        raise BadRequest(
            f"unsupported checksum algorithm {algorithm[:20]!r}; use one of {CHECKSUM_ALGORITHMS}"
        )
    try:
        digest = base64.b64decode(encoded.strip(), validate=True)
    except binascii.Error as exc:
        raise BadRequest("Upload-Checksum digest is not base64") from exc
    size = _ALGORITHMS[algorithm][0]
    if len(digest) != size:
        raise BadRequest(f"Upload-Checksum {algorithm} digest must be {size} bytes")
    return Checksum(algorithm, digest)


def parse_metadata(header: str | None) -> dict[str, str]:
    """tus `Upload-Metadata`: comma-separated `key base64(value)` pairs (value optional).

    Raises:
        BadRequest: a value is not base64 of UTF-8, or a key repeats.
    """
    out: dict[str, str] = {}
    if not header:
        return out
    for item in header.split(","):
        item = item.strip()
        if not item:
            continue
        key, _, encoded = item.partition(" ")
        if key in out:
            raise BadRequest(f"Upload-Metadata key {key!r} repeats")
        try:
            out[key] = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise BadRequest(f"Upload-Metadata {key!r} is not base64 of UTF-8 text") from exc
    return out


def check_upload_id(raw: str) -> str:
    """An upload id from a URL: 32 lowercase hex characters (a UUID4 without dashes).

    Raises:
        NotFound: anything else (no such upload can exist).
    """
    if len(raw) != 32 or any(c not in "0123456789abcdef" for c in raw):
        raise NotFound(f"no upload {raw[:40]!r}")
    return raw


@dataclass(frozen=True, slots=True)
class Concat:
    """An `Upload-Concat` header: `partial`, or `final;<url> <url> ...` (the partial ids)."""

    partial: bool
    parts: tuple[str, ...] = ()


def parse_concat(header: str | None) -> Concat | None:
    """`Upload-Concat` as a value; None when absent.

    The final upload's URLs may be absolute or relative; only their last path segment, an
    upload id under `/uploads/`, counts (any replica serves any upload).

    Raises:
        BadRequest: neither `partial` nor `final;...`, no or too many or repeated parts, or a
            part that is not an upload URL.
    """
    if header is None:
        return None
    value = header.strip()
    if value == "partial":
        return Concat(partial=True)
    if not value.startswith("final;"):
        raise BadRequest("Upload-Concat must be `partial` or `final;<upload URLs>`")
    urls = value[len("final;") :].split()
    if not urls:
        raise BadRequest("Upload-Concat final names no partial uploads")
    if len(urls) > MAX_PARTS:
        raise BadRequest(f"Upload-Concat final names more than {MAX_PARTS} partial uploads")
    parts: list[str] = []
    for url in urls:
        path = urlsplit(url).path
        head, _, last = path.rstrip("/").rpartition("/")
        if not head.endswith("/uploads"):
            raise BadRequest(f"Upload-Concat part {url[:80]!r} is not an upload URL")
        try:
            parts.append(check_upload_id(last))
        except NotFound as exc:
            raise BadRequest(f"Upload-Concat part {url[:80]!r} is not an upload URL") from exc
    if len(set(parts)) != len(parts):
        raise BadRequest("Upload-Concat final names a partial upload twice")
    return Concat(partial=False, parts=tuple(parts))


def http_date(seconds: float) -> str:
    """RFC 9110 IMF-fixdate, as tus wants `Upload-Expires`."""
    return formatdate(seconds, usegmt=True)
