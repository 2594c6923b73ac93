"""Decoding of the small BSON values an envelope buffers: everything except the payload.

Shared by the streaming parser (:mod:`._envelope_parse`), which hands each buffered field's
bytes to :func:`read_value`, and by the strict field views (:mod:`._envelope_fields`),
which reuse :func:`fail` so every envelope error reads alike. See :mod:`._envelope` for the
format decisions these functions enforce (supported types, binary subtypes, duplicate keys,
array indices, nesting depth).

Each element type has its own small reader in :data:`_READERS`, a table indexed by the BSON
type byte; the entry of an unsupported type raises an error that names the type.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias

from ._errors import MalformedEnvelope

MAX_BSON_DOCUMENT = 2**31 - 1  # a BSON document's length is a signed int32
MAX_DEPTH = 32  # nesting of documents/arrays inside one buffered field

INT32 = struct.Struct("<i")
INT64 = struct.Struct("<q")
BIN_HEAD = struct.Struct("<ib")  # binary: int32 length, subtype byte
_UINT64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Element types whose value has a fixed size, and the variable ones led by an int32.
FIXED_SIZE = {0x01: 8, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8}
VARIABLE = frozenset({0x02, 0x03, 0x04, 0x05})
_TYPE_NAMES = {
    0x01: "double",
    0x02: "string",
    0x03: "document",
    0x04: "array",
    0x05: "binary",
    0x06: "undefined",
    0x07: "ObjectId",
    0x08: "bool",
    0x09: "UTC datetime",
    0x0A: "null",
    0x0B: "regex",
    0x0C: "DBPointer",
    0x0D: "JavaScript code",
    0x0E: "symbol",
    0x0F: "code with scope",
    0x10: "int32",
    0x11: "timestamp/uint64",
    0x12: "int64",
    0x13: "decimal128",
    0x7F: "max key",
    0xFF: "min key",
}


def type_name(etype: int) -> str:
    """A BSON element type as the error messages spell it, e.g. ``ObjectId (0x07)``."""
    return f"{_TYPE_NAMES.get(etype, 'unknown type')} (0x{etype:02x})"


def fail(reason: str) -> MalformedEnvelope:
    """The one error every envelope check raises, with a common prefix."""
    return MalformedEnvelope(f"malformed BSON envelope: {reason}")


def decode_cstring(raw: bytes, what: str) -> str:
    """An element name's bytes (without the NUL) as text; BSON names must be UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(f"{what} {raw[:40]!r} is not valid UTF-8") from exc


# A reader decodes the value of one element type at buf[pos:], which must end by `limit`,
# and returns (value, end). `depth` is how deep the value's container is nested.
_Reader: TypeAlias = Callable[[bytes, int, int, str, int], tuple[Any, int]]


def read_value(
    etype: int, buf: bytes, pos: int, limit: int, where: str, depth: int
) -> tuple[Any, int]:
    """Decode one value of type `etype` starting at `pos` that must end by `limit`.

    Args:
        etype: The element's BSON type byte.
        buf: The bytes holding the value.
        pos: Where the value starts.
        limit: The container's end: the value may not run past it.
        where: The field's path, for error messages.
        depth: How deep the value's container is nested.

    Returns:
        ``(value, end)``, `end` being the offset just after the value.

    Raises:
        MalformedEnvelope: The type is unsupported or the value is malformed.
    """
    return _READERS[etype](buf, pos, limit, where, depth)


def _runs_past(where: str, etype: int) -> MalformedEnvelope:
    return fail(f"{where}: {type_name(etype)} runs past its container")


def _read_double(buf: bytes, pos: int, limit: int, where: str, depth: int) -> tuple[Any, int]:
    if pos + 8 > limit:
        raise _runs_past(where, 0x01)
    return _DOUBLE.unpack_from(buf, pos)[0], pos + 8


def _read_bool(buf: bytes, pos: int, limit: int, where: str, depth: int) -> tuple[Any, int]:
    if pos + 1 > limit:
        raise _runs_past(where, 0x08)
    if buf[pos] not in (0, 1):
        raise fail(f"{where}: bool byte must be 0 or 1, got {buf[pos]}")
    return buf[pos] == 1, pos + 1


def _read_datetime(buf: bytes, pos: int, limit: int, where: str, depth: int) -> tuple[Any, int]:
    if pos + 8 > limit:
        raise _runs_past(where, 0x09)
    ms = INT64.unpack_from(buf, pos)[0]
    try:
        return _EPOCH + timedelta(milliseconds=ms), pos + 8
    except OverflowError as exc:
        raise fail(f"{where}: datetime {ms} ms is out of range") from exc


def _read_null(buf: bytes, pos: int, limit: int, where: str, depth: int) -> tuple[Any, int]:
    if pos > limit:
        raise _runs_past(where, 0x0A)
    return None, pos


def _read_int32(buf: bytes, pos: int, limit: int, where: str, depth: int) -> tuple[Any, int]:
    if pos + 4 > limit:
        raise _runs_past(where, 0x10)
    return INT32.unpack_from(buf, pos)[0], pos + 4


def _read_uint64(buf: bytes, pos: int, limit: int, where: str, depth: int) -> tuple[Any, int]:
    if pos + 8 > limit:
        raise _runs_past(where, 0x11)
    return _UINT64.unpack_from(buf, pos)[0], pos + 8


def _read_int64(buf: bytes, pos: int, limit: int, where: str, depth: int) -> tuple[Any, int]:
    if pos + 8 > limit:
        raise _runs_past(where, 0x12)
    return INT64.unpack_from(buf, pos)[0], pos + 8


def _read_binary(buf: bytes, pos: int, limit: int, where: str, depth: int) -> tuple[Any, int]:
    if pos + 5 > limit:
        raise fail(f"{where}: binary header runs past its container")
    length, subtype = BIN_HEAD.unpack_from(buf, pos)
    if length < 0:
        raise fail(f"{where}: negative binary length {length}")
    start, end = pos + 5, pos + 5 + length
    if end > limit:
        raise fail(f"{where}: binary of {length} bytes runs past its container")
    if subtype == 0:
        return buf[start:end], end
    if subtype == 2:
        inner = INT32.unpack_from(buf, start)[0] if length >= 4 else -1
        if inner != length - 4:
            raise fail(f"{where}: old binary (subtype 2) inner length does not match")
        return buf[start + 4 : end], end
    raise fail(f"{where}: binary subtype {subtype & 0xFF} is not supported (only 0 and 2)")


def _read_string(buf: bytes, pos: int, limit: int, where: str, depth: int) -> tuple[Any, int]:
    if pos + 4 > limit:
        raise fail(f"{where}: {type_name(0x02)} length runs past its container")
    length = INT32.unpack_from(buf, pos)[0]
    end = pos + 4 + length
    if length < 1 or end > limit:
        raise fail(f"{where}: string length {length} does not fit its container")
    if buf[end - 1] != 0:
        raise fail(f"{where}: string is not NUL-terminated")
    try:
        return buf[pos + 4 : end - 1].decode("utf-8"), end
    except UnicodeDecodeError as exc:
        raise fail(f"{where}: string is not valid UTF-8") from exc


def _container_reader(as_array: bool) -> _Reader:
    etype = 0x04 if as_array else 0x03

    def read(buf: bytes, pos: int, limit: int, where: str, depth: int) -> tuple[Any, int]:
        if pos + 4 > limit:
            raise fail(f"{where}: {type_name(etype)} length runs past its container")
        length = INT32.unpack_from(buf, pos)[0]
        end = pos + length
        if length < 5 or end > limit:
            raise fail(f"{where}: {type_name(etype)} length {length} does not fit its container")
        return read_document(buf, pos, end, as_array, where, depth + 1), end

    return read


def _unsupported_reader(etype: int) -> _Reader:
    def read(buf: bytes, pos: int, limit: int, where: str, depth: int) -> tuple[Any, int]:
        raise fail(f"{where}: unsupported BSON element {type_name(etype)}")

    return read


_SUPPORTED: dict[int, _Reader] = {
    0x01: _read_double,
    0x02: _read_string,
    0x03: _container_reader(as_array=False),
    0x04: _container_reader(as_array=True),
    0x05: _read_binary,
    0x08: _read_bool,
    0x09: _read_datetime,
    0x0A: _read_null,
    0x10: _read_int32,
    0x11: _read_uint64,
    0x12: _read_int64,
}

# The reader of every type byte, indexed by it: a type outside _SUPPORTED gets one that
# raises, naming the type. A tuple, because indexing it is cheaper than a dict lookup and
# this runs once per buffered value.
_READERS: tuple[_Reader, ...] = tuple(
    _SUPPORTED.get(etype) or _unsupported_reader(etype) for etype in range(256)
)


def read_document(
    buf: bytes, start: int, end: int, as_array: bool, where: str, depth: int
) -> dict[str, Any] | list[Any]:
    """Decode the document or array occupying exactly ``buf[start:end]``.

    Raises:
        MalformedEnvelope: Too deep, badly terminated, a duplicate key, an array key out of
            order, or a malformed element.
    """
    if depth > MAX_DEPTH:
        raise fail(f"{where}: nested deeper than {MAX_DEPTH} levels")
    if buf[end - 1] != 0:
        raise fail(f"{where}: {'array' if as_array else 'document'} is not NUL-terminated")
    items: list[Any] = []
    result: dict[str, Any] = {}
    pos = start + 4
    while True:
        etype = buf[pos]
        if etype == 0:
            if pos != end - 1:
                raise fail(f"{where}: terminator at byte {pos - start} of {end - start}")
            return items if as_array else result
        nul = buf.find(b"\x00", pos + 1, end - 1)
        if nul < 0:
            raise fail(f"{where}: element name is not NUL-terminated")
        name = decode_cstring(buf[pos + 1 : nul], f"{where}: element name")
        if as_array:
            if name != str(len(items)):
                raise fail(f"{where}: array key {name!r} where {str(len(items))!r} belongs")
            inner = f"{where}[{name}]"
        else:
            if name in result:
                raise fail(f"{where}: duplicate key {name!r}")
            inner = f"{where}.{name}"
        value, pos = _READERS[etype](buf, nul + 1, end - 1, inner, depth)
        if as_array:
            items.append(value)
        else:
            result[name] = value
