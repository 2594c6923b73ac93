"""Typed, strict views of a parsed envelope's fields (see `_envelope` for the wire format).

Split from the parser: the parser turns bytes into plain values, these functions check that
the values are what an upload or a download document must carry, with a precise reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._bson_values import fail as _fail


def _header_pairs(value: object, lenient: bool) -> tuple[tuple[str, bytes], ...]:
    def header_value(name: str, raw: object) -> bytes:
        if isinstance(raw, bytes):
            return raw
        if lenient and isinstance(raw, str):
            return raw.encode("utf-8")
        kind = "binary or string" if lenient else "binary"
        raise _fail(f"header {name!r} value must be a {kind}, got {type(raw).__name__}")

    if isinstance(value, dict):
        if not lenient:
            raise _fail("headers must be an array of [string, binary] pairs, got a document")
        return tuple((name, header_value(name, raw)) for name, raw in value.items())
    if not isinstance(value, list):
        raise _fail(f"headers must be an array of [string, binary] pairs, got {value!r:.60}")
    pairs = []
    for index, pair in enumerate(value):
        if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], str):
            raise _fail(f"header {index} must be a [string, binary] pair, got {pair!r:.60}")
        pairs.append((pair[0], header_value(pair[0], pair[1])))
    return tuple(pairs)


def _check_headers(headers: object) -> None:
    if not isinstance(headers, tuple) or not all(
        isinstance(h, tuple) and len(h) == 2 and isinstance(h[0], str) and isinstance(h[1], bytes)
        for h in headers
    ):
        raise _fail("headers must be a tuple of (str, bytes) pairs")


def _key(value: object, lenient: bool) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if lenient and isinstance(value, str):
        return value.encode("utf-8")
    raise _fail(f"key must be a binary, got {type(value).__name__}")


@dataclass(frozen=True, slots=True)
class UploadFields:
    """The non-payload fields of an upload document."""

    headers: tuple[tuple[str, bytes], ...]
    key: bytes | None

    def __post_init__(self) -> None:
        _check_headers(self.headers)
        if self.key is not None and not isinstance(self.key, bytes):
            raise _fail("key must be bytes or None")


@dataclass(frozen=True, slots=True)
class DownloadFields:
    """The metadata of a download document."""

    timestamp_ms: int
    headers: tuple[tuple[str, bytes], ...]
    key: bytes | None
    topic: str

    def __post_init__(self) -> None:
        ts = self.timestamp_ms
        if isinstance(ts, bool) or not isinstance(ts, int) or not -(2**63) <= ts < 2**63:
            raise _fail(f"metadata.timestamp must be an int64, got {ts!r:.60}")
        _check_headers(self.headers)
        if self.key is not None and not isinstance(self.key, bytes):
            raise _fail("metadata.key must be bytes or None")
        if not isinstance(self.topic, str):
            raise _fail(f"metadata.topic must be a string, got {type(self.topic).__name__}")


def upload_fields(fields: Mapping[str, Any]) -> UploadFields:
    """Validate the fields of a parsed upload document.

    Args:
        fields: :attr:`Complete.fields` of an upload. ``headers`` may be missing (no
            headers), an array of [name, value] pairs or a document; values and ``key`` may be
            binaries or strings (hop-client writes ``str`` as a BSON string).

    Returns:
        The headers in document order and the key (None when missing or null).

    Raises:
        MalformedEnvelope: A field has the wrong type; the message says which and why.
    """
    headers = _header_pairs(fields.get("headers", []), lenient=True)
    return UploadFields(headers=headers, key=_key(fields.get("key"), lenient=True))


def download_fields(fields: Mapping[str, Any]) -> DownloadFields:
    """Validate the ``metadata`` of a parsed download document.

    Args:
        fields: :attr:`Complete.fields` of a download.

    Returns:
        Timestamp, headers, key (None when missing or null) and topic.

    Raises:
        MalformedEnvelope: A field is missing or has the wrong type.
    """
    meta = fields.get("metadata")
    if not isinstance(meta, dict):
        raise _fail("'metadata' must be a document")
    for name in ("timestamp", "headers", "topic"):
        if name not in meta:
            raise _fail(f"metadata.{name} is missing")
    ts = meta["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int):
        raise _fail(f"metadata.timestamp must be an integer, got {type(ts).__name__}")
    return DownloadFields(
        timestamp_ms=ts,
        headers=_header_pairs(meta["headers"], lenient=False),
        key=_key(meta.get("key"), lenient=False),
        topic=meta["topic"],
    )
