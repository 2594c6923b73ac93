"""Sans-I/O streaming BSON codec for hop-client's offload documents.

Two documents cross the offload API (reference 002, "Large Message Support"):

* upload (``POST /topic/<t>+oversized``): ``{message: binary, headers: [[str, binary], ...]
  or {str: binary}, key?: binary}``;
* download (``GET /msg/<id>``): ``{message: binary, metadata: {timestamp: int64 ms,
  headers: [[str, binary], ...], key?: binary, topic: str}}``.

Payloads can be as large as BSON allows (a document is at most 2**31 - 1 bytes, its length
being an int32), so neither side ever holds the payload: the encoders return the bytes that
go before and after it, and :class:`EnvelopeParser` hands the payload back as zero-copy
slices of the buffers it is fed while it buffers and decodes only the small other fields.

Decisions the format leaves open:

* Field order does not matter. Our encoders put every other field before ``message`` so a
  reader learns headers and metadata before the payload; hop-client puts ``message`` first.
* ``message`` must be a binary element of subtype 0 (generic) or 2 (the deprecated "old
  binary", whose redundant inner length is checked and stripped); any other type or subtype
  is rejected. The same rule holds for binaries inside the other fields.
* Duplicate keys are rejected at every level: readers that keep the first and readers that
  keep the last value would otherwise disagree on what was sent. Array keys must be the
  indices "0", "1", ... as the BSON spec requires.
* Supported element types in the buffered fields: double, string, document, array, binary,
  bool, UTC datetime, null, int32, uint64 (0x11, as hop.bson writes it), int64. Anything else
  (ObjectId, regex, code, decimal128, min/max key, ...) is an error naming the type.
* Nesting deeper than :data:`MAX_DEPTH` is rejected, so no input can exhaust the stack.
* Upload header values and key may be BSON strings as well as binaries, because hop-client's
  ``Producer.write`` documents "string-like" header values and its BSON encoder writes a
  ``str`` as a string; they are returned as their UTF-8 bytes. Download documents must use
  binaries, as hop-client's ``_check_bson_message_structure`` requires.
* A download without a key omits ``metadata.key`` (hop-client reads ``.get("key", None)``);
  a missing or null key reads back as None.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, TypeAlias

from ._errors import EnvelopeTooLarge, MalformedEnvelope

MAX_BSON_DOCUMENT = 2**31 - 1  # a BSON document's length is a signed int32
MAX_DEPTH = 32  # nesting of documents/arrays inside one buffered field

_INT32 = struct.Struct("<i")
_INT64 = struct.Struct("<q")
_UINT64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
_BIN_HEAD = struct.Struct("<ib")  # binary: int32 length, subtype byte

_MESSAGE = "message"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NO_FIELDS: Mapping[str, Any] = MappingProxyType({})

# Element types whose value has a fixed size, and the variable ones led by an int32.
_FIXED_SIZE = {0x01: 8, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8}
_VARIABLE = frozenset({0x02, 0x03, 0x04, 0x05})
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


def _type_name(etype: int) -> str:
    return f"{_TYPE_NAMES.get(etype, 'unknown type')} (0x{etype:02x})"


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class PayloadStart:
    """The ``message`` element's header was read: `length` payload bytes follow.

    `fields` holds the fields that came before ``message``, already decoded: with our
    encoders the headers and key (so a server can pick the object key before the payload),
    with hop-client's nothing. It does not take part in comparisons.
    """

    length: int
    fields: Mapping[str, Any] = field(default_factory=lambda: _NO_FIELDS, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class PayloadData:
    """A slice of the payload, in order.

    `data` is a read-only view of the buffer given to :meth:`EnvelopeParser.feed`: consume
    it (or copy it) before that buffer is reused or resized.
    """

    data: bytes | memoryview


@dataclass(frozen=True, slots=True)
class PayloadEnd:
    """The last payload byte was delivered."""


@dataclass(frozen=True, slots=True)
class Complete:
    """The document ended well; `fields` holds every top-level field except ``message``."""

    fields: Mapping[str, Any]


Event: TypeAlias = PayloadStart | PayloadData | PayloadEnd | Complete


# --------------------------------------------------------------------------- encoding


def _fail(reason: str) -> MalformedEnvelope:
    return MalformedEnvelope(f"malformed BSON envelope: {reason}")


def _utf8(value: str, what: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _fail(f"{what} is not valid UTF-8: {exc.reason}") from exc


def _cstring(name: str) -> bytes:
    raw = _utf8(name, f"field name {name!r}")
    if b"\x00" in raw:
        raise _fail(f"field name {name!r} contains NUL")
    return raw + b"\x00"


def _bytes(value: object, what: str) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise _fail(f"{what} must be bytes, got {type(value).__name__}")


def _binary_element(name: str, value: bytes) -> bytes:
    return b"\x05" + _cstring(name) + _BIN_HEAD.pack(len(value), 0) + value


def _string_element(name: str, value: str) -> bytes:
    raw = _utf8(value, name)
    return b"\x02" + _cstring(name) + _INT32.pack(len(raw) + 1) + raw + b"\x00"


def _document(elements: bytes) -> bytes:
    return _INT32.pack(len(elements) + 5) + elements + b"\x00"


def _headers_element(headers: Sequence[tuple[str, bytes]]) -> bytes:
    # [[name, value], ...]: hop-client checks for a list of 2-item collections.
    pairs = bytearray()
    for index, header in enumerate(headers):
        if not isinstance(header, tuple | list) or len(header) != 2:
            raise _fail(f"header {index} must be a (name, value) pair")
        name, value = header
        if not isinstance(name, str):
            raise _fail(f"header {index} name must be a string, got {type(name).__name__}")
        pair = _string_element("0", name) + _binary_element(
            "1", _bytes(value, f"header {name!r} value")
        )
        pairs += b"\x04" + _cstring(str(index)) + _document(pair)
    return b"\x04" + _cstring("headers") + _document(bytes(pairs))


def _message_head(payload_len: int) -> bytes:
    if isinstance(payload_len, bool) or not isinstance(payload_len, int) or payload_len < 0:
        raise _fail(f"payload length must be a non-negative int, got {payload_len!r}")
    if payload_len > MAX_BSON_DOCUMENT:
        raise EnvelopeTooLarge("BSON payload", MAX_BSON_DOCUMENT, payload_len)
    return b"\x05" + _cstring(_MESSAGE) + _BIN_HEAD.pack(payload_len, 0)


def _frame(elements: bytes, payload_len: int) -> tuple[bytes, bytes]:
    message_head = _message_head(payload_len)
    total = 4 + len(elements) + len(message_head) + payload_len + 1
    if total > MAX_BSON_DOCUMENT:
        raise EnvelopeTooLarge("BSON document", MAX_BSON_DOCUMENT, total)
    return _INT32.pack(total) + elements + message_head, b"\x00"


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
        raise _fail(f"timestamp must be an int, got {type(timestamp_ms).__name__}")
    if not -(2**63) <= timestamp_ms < 2**63:
        raise _fail(f"timestamp {timestamp_ms} does not fit an int64")
    if not isinstance(topic, str):
        raise _fail(f"topic must be a string, got {type(topic).__name__}")
    # Always int64 so the field's BSON type does not depend on the value.
    meta = b"\x12" + _cstring("timestamp") + _INT64.pack(timestamp_ms)
    meta += _headers_element(headers)
    if key is not None:
        meta += _binary_element("key", _bytes(key, "key"))
    meta += _string_element("topic", topic)
    return _frame(b"\x03" + _cstring("metadata") + _document(meta), payload_len)


# --------------------------------------------------------------------------- small values


def _decode_cstring(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(f"{what} {raw[:40]!r} is not valid UTF-8") from exc


def _read_binary(buf: bytes, pos: int, limit: int, where: str) -> tuple[bytes, int]:
    if pos + 5 > limit:
        raise _fail(f"{where}: binary header runs past its container")
    length, subtype = _BIN_HEAD.unpack_from(buf, pos)
    if length < 0:
        raise _fail(f"{where}: negative binary length {length}")
    start, end = pos + 5, pos + 5 + length
    if end > limit:
        raise _fail(f"{where}: binary of {length} bytes runs past its container")
    if subtype == 0:
        return buf[start:end], end
    if subtype == 2:
        inner = _INT32.unpack_from(buf, start)[0] if length >= 4 else -1
        if inner != length - 4:
            raise _fail(f"{where}: old binary (subtype 2) inner length does not match")
        return buf[start + 4 : end], end
    raise _fail(f"{where}: binary subtype {subtype & 0xFF} is not supported (only 0 and 2)")


def _read_value(
    etype: int, buf: bytes, pos: int, limit: int, where: str, depth: int
) -> tuple[Any, int]:
    """Decode one value starting at `pos` that must end by `limit`; returns (value, end)."""
    size = _FIXED_SIZE.get(etype)
    if size is not None:
        if pos + size > limit:
            raise _fail(f"{where}: {_type_name(etype)} runs past its container")
        if etype == 0x01:
            return _DOUBLE.unpack_from(buf, pos)[0], pos + 8
        if etype == 0x08:
            if buf[pos] not in (0, 1):
                raise _fail(f"{where}: bool byte must be 0 or 1, got {buf[pos]}")
            return buf[pos] == 1, pos + 1
        if etype == 0x09:
            ms = _INT64.unpack_from(buf, pos)[0]
            try:
                return _EPOCH + timedelta(milliseconds=ms), pos + 8
            except OverflowError as exc:
                raise _fail(f"{where}: datetime {ms} ms is out of range") from exc
        if etype == 0x0A:
            return None, pos
        if etype == 0x10:
            return _INT32.unpack_from(buf, pos)[0], pos + 4
        if etype == 0x11:
            return _UINT64.unpack_from(buf, pos)[0], pos + 8
        return _INT64.unpack_from(buf, pos)[0], pos + 8
    if etype == 0x05:
        return _read_binary(buf, pos, limit, where)
    if etype not in _VARIABLE:
        raise _fail(f"{where}: unsupported BSON element {_type_name(etype)}")
    if pos + 4 > limit:
        raise _fail(f"{where}: {_type_name(etype)} length runs past its container")
    length = _INT32.unpack_from(buf, pos)[0]
    if etype == 0x02:
        end = pos + 4 + length
        if length < 1 or end > limit:
            raise _fail(f"{where}: string length {length} does not fit its container")
        if buf[end - 1] != 0:
            raise _fail(f"{where}: string is not NUL-terminated")
        try:
            return buf[pos + 4 : end - 1].decode("utf-8"), end
        except UnicodeDecodeError as exc:
            raise _fail(f"{where}: string is not valid UTF-8") from exc
    end = pos + length
    if length < 5 or end > limit:
        raise _fail(f"{where}: {_type_name(etype)} length {length} does not fit its container")
    return _read_document(buf, pos, end, etype == 0x04, where, depth + 1), end


def _read_document(
    buf: bytes, start: int, end: int, as_array: bool, where: str, depth: int
) -> dict[str, Any] | list[Any]:
    """Decode the document or array occupying exactly ``buf[start:end]``."""
    if depth > MAX_DEPTH:
        raise _fail(f"{where}: nested deeper than {MAX_DEPTH} levels")
    if buf[end - 1] != 0:
        raise _fail(f"{where}: {'array' if as_array else 'document'} is not NUL-terminated")
    items: list[Any] = []
    result: dict[str, Any] = {}
    pos = start + 4
    while True:
        etype = buf[pos]
        if etype == 0:
            if pos != end - 1:
                raise _fail(f"{where}: terminator at byte {pos - start} of {end - start}")
            return items if as_array else result
        nul = buf.find(b"\x00", pos + 1, end - 1)
        if nul < 0:
            raise _fail(f"{where}: element name is not NUL-terminated")
        name = _decode_cstring(buf[pos + 1 : nul], f"{where}: element name")
        if as_array:
            if name != str(len(items)):
                raise _fail(f"{where}: array key {name!r} where {str(len(items))!r} belongs")
            inner = f"{where}[{name}]"
        else:
            if name in result:
                raise _fail(f"{where}: duplicate key {name!r}")
            inner = f"{where}.{name}"
        value, pos = _read_value(etype, buf, nul + 1, end - 1, inner, depth)
        if as_array:
            items.append(value)
        else:
            result[name] = value


# --------------------------------------------------------------------------- parsing

# Parser states; the "need" states wait for a fixed number of bytes.
_LEN, _TYPE, _NAME, _MSG_HEAD, _MSG_OLD, _PAYLOAD, _VALUE_LEN, _VALUE, _DONE = range(9)
_NAME_WINDOW = 256  # bytes copied per search for a name's NUL: names are short


class EnvelopeParser:
    """Incremental parser of one upload or download document.

    Feed it the body in slices of any size; it yields the payload as :class:`PayloadData`
    views of those slices, buffers and decodes every other field (up to `max_fields` bytes
    in all) and ends with :class:`Complete`. Once it raised, it raises again on every call.

    Args:
        max_document: Largest declared document length accepted; bigger raises
            :class:`EnvelopeTooLarge` as soon as the 4-byte length is read.
        max_fields: Largest number of non-payload bytes buffered (names, headers, key, ...).
    """

    def __init__(self, *, max_document: int, max_fields: int = 1 << 20) -> None:
        for what, value in (("max_document", max_document), ("max_fields", max_fields)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 5:
                raise ValueError(f"{what} must be an int of at least 5, got {value!r}")
        self._max_document = min(max_document, MAX_BSON_DOCUMENT)
        self._max_fields = max_fields
        self._state = _LEN
        self._need = 4  # bytes the current "need" state waits for
        self._pending = bytearray()  # a "need" state's bytes split across feeds
        self._offset = 0  # document bytes consumed
        self._length = 0  # declared document length, once read
        self._overhead = 0  # non-payload bytes consumed, bounded by max_fields
        self._etype = 0
        self._name = ""
        self._prefix = b""  # a variable-size value's int32 length, kept for decoding
        self._remaining = 0  # payload bytes still to come
        self._payload_seen = False
        self._fields: dict[str, Any] = {}
        self._failure: MalformedEnvelope | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Consume the next bytes of the body.

        Args:
            data: Any slice of the body; may be empty. Payload events view this buffer.

        Returns:
            The events these bytes completed, in order.

        Raises:
            MalformedEnvelope: The bytes cannot be (the start of) a valid document.
            EnvelopeTooLarge: The declared length or the non-payload fields exceed a bound.
        """
        if self._failure is not None:
            raise self._failure
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        view = view.toreadonly()
        events: list[Event] = []
        try:
            self._run(view, events)
        except MalformedEnvelope as exc:
            self._failure = exc
            raise
        return events

    def end(self) -> None:
        """Declare the body finished.

        Raises:
            MalformedEnvelope: The document is incomplete (or the parser failed before).
        """
        if self._failure is not None:
            raise self._failure
        if self._state != _DONE:
            if self._offset == 0 and not self._pending:
                self._failure = _fail("empty body")
            elif self._length:
                # _offset counts bytes consumed, including those waiting in _pending
                self._failure = _fail(f"truncated: {self._offset} of {self._length} declared bytes")
            else:
                self._failure = _fail("truncated before the document length")
            raise self._failure

    # The loop below is the hot path for payload bytes: one slice and one event per feed.
    def _run(self, view: memoryview, events: list[Event]) -> None:
        pos, n = 0, len(view)
        while pos < n:
            state = self._state
            if state == _PAYLOAD:
                take = min(self._remaining, n - pos)
                events.append(PayloadData(view[pos : pos + take]))
                pos += take
                self._offset += take
                self._remaining -= take
                if not self._remaining:
                    events.append(PayloadEnd())
                    self._expect(_TYPE, 1)
            elif state == _NAME:
                pos = self._scan_name(view, pos, n)
            elif state == _DONE:
                raise _fail(f"trailing bytes after the {self._length}-byte document")
            else:
                have = len(self._pending)
                take = min(self._need - have, n - pos)
                if not have and take == self._need:
                    chunk = bytes(view[pos : pos + take])
                else:
                    self._pending += view[pos : pos + take]
                    if len(self._pending) < self._need:
                        pos += take
                        self._offset += take
                        self._overhead += take
                        continue
                    chunk = bytes(self._pending)
                    self._pending.clear()
                pos += take
                self._offset += take
                self._overhead += take
                self._step(chunk, events)

    def _expect(self, state: int, need: int) -> None:
        # Every part of an element must end before the document's terminator byte.
        if state != _TYPE and self._offset + need > self._length - 1:
            raise _fail(
                f"field {self._name!r} needs {need} bytes at byte {self._offset}, past the "
                f"end of the {self._length}-byte document"
            )
        if state != _PAYLOAD and self._overhead + need > self._max_fields:
            raise EnvelopeTooLarge("fields other than message", self._max_fields)
        self._state = state
        self._need = need

    def _scan_name(self, view: memoryview, pos: int, n: int) -> int:
        room = self._length - 1 - self._offset  # the name may not reach the terminator
        budget = self._max_fields - self._overhead
        window = bytes(view[pos : pos + min(n - pos, room, budget + 1, _NAME_WINDOW)])
        nul = window.find(b"\x00")
        used = len(window) if nul < 0 else nul + 1
        self._offset += used
        self._overhead += used
        if self._overhead > self._max_fields:
            raise EnvelopeTooLarge("fields other than message", self._max_fields)
        if nul < 0:
            self._pending += window
            if self._offset >= self._length - 1:
                raise _fail(
                    f"element name is not NUL-terminated within the {self._length}-byte document"
                )
            return pos + used
        raw = bytes(self._pending) + window[:nul]
        self._pending.clear()
        self._name = _decode_cstring(raw, "element name")
        self._named()
        return pos + used

    def _named(self) -> None:
        name, etype = self._name, self._etype
        if name == _MESSAGE:
            if self._payload_seen:
                raise _fail("duplicate field 'message'")
            if etype != 0x05:
                raise _fail(f"'message' must be a binary, got {_type_name(etype)}")
            self._payload_seen = True
            self._expect(_MSG_HEAD, 5)
            return
        if name in self._fields:
            raise _fail(f"duplicate field {name!r}")
        if etype in _VARIABLE:
            self._expect(_VALUE_LEN, 4)
            return
        size = _FIXED_SIZE.get(etype)
        if size is None:
            raise _fail(f"field {name!r}: unsupported BSON element {_type_name(etype)}")
        if size == 0:  # null: nothing to read
            self._fields[name] = None
            self._expect(_TYPE, 1)
        else:
            self._prefix = b""
            self._expect(_VALUE, size)

    def _step(self, chunk: bytes, events: list[Event]) -> None:
        state = self._state
        if state == _TYPE:
            etype = chunk[0]
            if self._offset == self._length:  # this was the terminator's position
                if etype != 0:
                    raise _fail(f"document does not end with NUL at byte {self._length - 1}")
                if not self._payload_seen:
                    raise _fail("no 'message' field")
                self._state = _DONE
                events.append(Complete(MappingProxyType(self._fields)))
            elif etype == 0:
                raise _fail(f"document ends after {self._offset} bytes but declares {self._length}")
            else:
                self._etype = etype
                self._name = ""
                self._state = _NAME
        elif state == _VALUE_LEN:
            length = _INT32.unpack(chunk)[0]
            etype, where = self._etype, f"field {self._name!r}"
            if etype == 0x02:
                if length < 1:
                    raise _fail(f"{where}: string length {length} is less than 1")
                rest = length
            elif etype == 0x05:
                if length < 0:
                    raise _fail(f"{where}: negative binary length {length}")
                rest = length + 1
            else:
                if length < 5:
                    raise _fail(f"{where}: {_type_name(etype)} length {length} is less than 5")
                rest = length - 4
            self._prefix = chunk
            self._expect(_VALUE, rest)
        elif state == _VALUE:
            raw = self._prefix + chunk
            where = self._name
            value, end = _read_value(self._etype, raw, 0, len(raw), where, 0)
            if end != len(raw):  # cannot happen: sizes are computed alike; keep it loud
                raise _fail(f"field {where!r}: value length mismatch")
            self._fields[where] = value
            self._expect(_TYPE, 1)
        elif state == _MSG_HEAD:
            length, subtype = _BIN_HEAD.unpack(chunk)
            if length < 0:
                raise _fail(f"'message' has negative binary length {length}")
            if subtype == 2:
                if length < 4:
                    raise _fail("'message' old binary (subtype 2) is shorter than its length")
                self._remaining = length
                self._expect(_MSG_OLD, 4)
            elif subtype != 0:
                raise _fail(f"'message' binary subtype {subtype & 0xFF} is not supported")
            else:
                self._start_payload(length, events)
        elif state == _MSG_OLD:
            inner = _INT32.unpack(chunk)[0]
            if inner != self._remaining - 4:
                raise _fail("'message' old binary (subtype 2) inner length does not match")
            self._start_payload(inner, events)
        else:  # _LEN
            length = _INT32.unpack(chunk)[0]
            if length > self._max_document:
                raise EnvelopeTooLarge("document", self._max_document, length)
            if length < 5:
                raise _fail(f"declared document length {length} is less than 5")
            self._length = length
            self._expect(_TYPE, 1)

    def _start_payload(self, length: int, events: list[Event]) -> None:
        if self._offset + length > self._length - 1:
            raise _fail(
                f"'message' of {length} bytes at byte {self._offset} runs past the end of "
                f"the {self._length}-byte document"
            )
        # A copy: the fields after the payload must not show up in this event.
        events.append(PayloadStart(length, MappingProxyType(dict(self._fields))))
        if length:
            self._remaining = length
            self._state = _PAYLOAD
        else:
            events.append(PayloadEnd())
            self._expect(_TYPE, 1)
