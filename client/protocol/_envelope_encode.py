"""Encoders of the upload and download documents, around a payload they never see.

Both return ``(head, tail)``: the caller sends ``head``, then exactly ``payload_len`` payload
bytes, then ``tail``, so a payload of any size streams from a file or a socket without being
held. Every field other than ``message`` goes into ``head``, before the payload, so a reader
learns headers and metadata first (see :mod:`._envelope` for the format).
"""

from __future__ import annotations

from collections.abc import Sequence

from ._bson_values import BIN_HEAD, INT32, INT64, MAX_BSON_DOCUMENT, fail
from ._errors import EnvelopeTooLarge

_MESSAGE = "message"


def _utf8(value: str, what: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise fail(f"{what} is not valid UTF-8: {exc.reason}") from exc


def _cstring(name: str) -> bytes:
    raw = _utf8(name, f"field name {name!r}")
    if b"\x00" in raw:
        raise fail(f"field name {name!r} contains NUL")
    return raw + b"\x00"


def _bytes(value: object, what: str) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise fail(f"{what} must be bytes, got {type(value).__name__}")


def _binary_element(name: str, value: bytes) -> bytes:
    return b"\x05" + _cstring(name) + BIN_HEAD.pack(len(value), 0) + value


def _string_element(name: str, value: str) -> bytes:
    raw = _utf8(value, name)
    return b"\x02" + _cstring(name) + INT32.pack(len(raw) + 1) + raw + b"\x00"


def _document(elements: bytes) -> bytes:
    return INT32.pack(len(elements) + 5) + elements + b"\x00"


def _headers_element(headers: Sequence[tuple[str, bytes]]) -> bytes:
    # [[name, value], ...]: hop-client checks for a list of 2-item collections.
    pairs = bytearray()
    for index, header in enumerate(headers):
        if not isinstance(header, tuple | list) or len(header) != 2:
            raise fail(f"header {index} must be a (name, value) pair")
        name, value = header
        if not isinstance(name, str):
            raise fail(f"header {index} name must be a string, got {type(name).__name__}")
        pair = _string_element("0", name) + _binary_element(
            "1", _bytes(value, f"header {name!r} value")
        )
        pairs += b"\x04" + _cstring(str(index)) + _document(pair)
    return b"\x04" + _cstring("headers") + _document(bytes(pairs))


def _message_head(payload_len: int) -> bytes:
    if isinstance(payload_len, bool) or not isinstance(payload_len, int) or payload_len < 0:
        raise fail(f"payload length must be a non-negative int, got {payload_len!r}")
    if payload_len > MAX_BSON_DOCUMENT:
        raise EnvelopeTooLarge("BSON payload", MAX_BSON_DOCUMENT, payload_len)
    return b"\x05" + _cstring(_MESSAGE) + BIN_HEAD.pack(payload_len, 0)


def _frame(elements: bytes, payload_len: int) -> tuple[bytes, bytes]:
    message_head = _message_head(payload_len)
    total = 4 + len(elements) + len(message_head) + payload_len + 1
    if total > MAX_BSON_DOCUMENT:
        raise EnvelopeTooLarge("BSON document", MAX_BSON_DOCUMENT, total)
    return INT32.pack(total) + elements + message_head, b"\x00"


def encode_upload(
    payload_len: int, *, headers: Sequence[tuple[str, bytes]], key: bytes | None = None
) -> tuple[bytes, bytes]:
    """The bytes around the payload of an upload document, headers and key first.

    The body is ``head + payload + tail``, ``len(head) + payload_len + len(tail)`` bytes.

    Args:
        payload_len: Exact number of payload bytes the caller will send between the two.
        headers: Kafka-style headers, (name, value) pairs; order and duplicates are kept.
        key: The message key, or None to leave the field out.

    Returns:
        ``(head, tail)``.

    Raises:
        MalformedEnvelope: A header or the key has the wrong type or is not encodable.
        EnvelopeTooLarge: The document would exceed BSON's 2**31 - 1 byte limit.
    """
    elements = _headers_element(headers)
    if key is not None:
        elements += _binary_element("key", _bytes(key, "key"))
    return _frame(elements, payload_len)


def encode_download(
    payload_len: int,
    *,
    timestamp_ms: int,
    headers: Sequence[tuple[str, bytes]],
    key: bytes | None,
    topic: str,
) -> tuple[bytes, bytes]:
    """The bytes around the payload of a download document, metadata first.

    hop-client's ``bson.loads`` and ``Consumer._check_bson_message_structure`` accept it.

    Args:
        payload_len: Exact number of payload bytes the caller will send between the two.
        timestamp_ms: Milliseconds since the epoch, written as an int64.
        headers: The headers stored with the message.
        key: The message key; None leaves ``metadata.key`` out.
        topic: The topic the message was published to.

    Returns:
        ``(head, tail)``.

    Raises:
        MalformedEnvelope: A value has the wrong type or is not encodable.
        EnvelopeTooLarge: The document would exceed BSON's 2**31 - 1 byte limit.
    """
    if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int):
        raise fail(f"timestamp must be an int, got {type(timestamp_ms).__name__}")
    if not -(2**63) <= timestamp_ms < 2**63:
        raise fail(f"timestamp {timestamp_ms} does not fit an int64")
    if not isinstance(topic, str):
        raise fail(f"topic must be a string, got {type(topic).__name__}")
    # Always int64 so the field's BSON type does not depend on the value.
    meta = b"\x12" + _cstring("timestamp") + INT64.pack(timestamp_ms)
    meta += _headers_element(headers)
    if key is not None:
        meta += _binary_element("key", _bytes(key, "key"))
    meta += _string_element("topic", topic)
    return _frame(b"\x03" + _cstring("metadata") + _document(meta), payload_len)
