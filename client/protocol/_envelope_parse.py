"""The incremental parser of one upload or download document (format: :mod:`._envelope`).

The parser is a state machine in the manner of h11: its state is a :class:`_State`, and two
tables say what each state does. :data:`_READERS` maps every state to the method that
consumes bytes in it: the payload is handed out as views, an element name is scanned for its
NUL, and every other state gathers a fixed number of bytes (across feeds if need be) and then
runs its step from :data:`_STEPS`. A step decodes those bytes, checks them, and moves the
parser on with :meth:`EnvelopeParser._expect`, which bounds every part of an element by the
document's declared end and the buffered fields by ``max_fields`` before a byte of it is
read.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, TypeAlias

from ._bson_values import (
    BIN_HEAD,
    FIXED_SIZE,
    INT32,
    MAX_BSON_DOCUMENT,
    VARIABLE,
    decode_cstring,
    fail,
    read_value,
    type_name,
)
from ._envelope_events import Complete, Event, PayloadData, PayloadEnd, PayloadStart
from ._errors import EnvelopeTooLarge, MalformedEnvelope

_MESSAGE = "message"
_NAME_WINDOW = 256  # bytes copied per search for a name's NUL: names are short


class _State(enum.IntEnum):
    """Where the parser is in the document, named for what it waits for.

    An IntEnum so that the tables below hash it at C speed: the parser looks its state up
    at every step, and a plain Enum's Python-level ``__hash__`` shows in the benchmark.
    """

    LENGTH = enum.auto()  # the document's int32 length
    TYPE = enum.auto()  # an element's type byte, or the document's terminator
    NAME = enum.auto()  # an element's NUL-terminated name
    VALUE_LENGTH = enum.auto()  # a buffered string, document, array or binary's int32 length
    VALUE = enum.auto()  # a buffered field's value
    MESSAGE_HEAD = enum.auto()  # 'message': its binary length and subtype
    MESSAGE_OLD = enum.auto()  # 'message': an old binary's (subtype 2) inner length
    PAYLOAD = enum.auto()  # payload bytes, handed out as views
    DONE = enum.auto()  # nothing: the document ended


# Bound once for the hot path: looking a member up on an Enum class costs more, in 3.11,
# than the rest of that path.
_PAYLOAD = _State.PAYLOAD


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
        self._state = _State.LENGTH
        self._need = 4  # bytes a fixed-size state waits for
        self._pending = bytearray()  # a fixed-size state's (or a name's) bytes split across feeds
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
        n = len(view)
        if self._state is _PAYLOAD and 0 < n < self._remaining:
            # The hot path: a slice wholly inside the payload is one view and one event.
            self._offset += n
            self._remaining -= n
            return [PayloadData(view)]
        events: list[Event] = []
        try:
            pos = 0
            while pos < n:
                pos = _READERS[self._state](self, view, pos, n, events)
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
        if self._state is not _State.DONE:
            if self._offset == 0 and not self._pending:
                self._failure = fail("empty body")
            elif self._length:
                # _offset counts bytes consumed, including those waiting in _pending
                self._failure = fail(f"truncated: {self._offset} of {self._length} declared bytes")
            else:
                self._failure = fail("truncated before the document length")
            raise self._failure

    # ------------------------------------------------------------------ transitions

    def _expect(self, state: _State, need: int) -> None:
        """Wait for `need` bytes of an element's part, which must end before the terminator."""
        if self._offset + need > self._length - 1:
            raise fail(
                f"field {self._name!r} needs {need} bytes at byte {self._offset}, past the "
                f"end of the {self._length}-byte document"
            )
        self._wait(state, need)

    def _next_element(self) -> None:
        """Wait for the next element's type byte, or for the document's terminator."""
        self._wait(_State.TYPE, 1)

    def _wait(self, state: _State, need: int) -> None:
        if self._overhead + need > self._max_fields:
            raise EnvelopeTooLarge("fields other than message", self._max_fields)
        self._state = state
        self._need = need

    # ------------------------------------------------------------------ readers
    # Each consumes bytes of `view` from `pos` (< n) and returns where it stopped.

    def _read_payload(self, view: memoryview, pos: int, n: int, events: list[Event]) -> int:
        # The payload's first and last slices, and those that share a feed with other parts.
        take = min(self._remaining, n - pos)
        events.append(PayloadData(view[pos : pos + take]))
        self._offset += take
        self._remaining -= take
        if not self._remaining:
            events.append(PayloadEnd())
            self._next_element()
        return pos + take

    def _read_fixed(self, view: memoryview, pos: int, n: int, events: list[Event]) -> int:
        # Gather the bytes the state needs, across feeds if need be, then run its step.
        need, have = self._need, len(self._pending)
        take = min(need - have, n - pos)
        self._offset += take
        self._overhead += take
        if not have and take == need:
            chunk = bytes(view[pos : pos + take])
        else:
            self._pending += view[pos : pos + take]
            if len(self._pending) < need:
                return pos + take
            chunk = bytes(self._pending)
            self._pending.clear()
        _STEPS[self._state](self, chunk, events)
        return pos + take

    def _read_name(self, view: memoryview, pos: int, n: int, events: list[Event]) -> int:
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
                raise fail(
                    f"element name is not NUL-terminated within the {self._length}-byte document"
                )
            return pos + used
        raw = bytes(self._pending) + window[:nul]
        self._pending.clear()
        self._name = decode_cstring(raw, "element name")
        self._on_name()
        return pos + used

    def _read_trailing(self, view: memoryview, pos: int, n: int, events: list[Event]) -> int:
        raise fail(f"trailing bytes after the {self._length}-byte document")

    # ------------------------------------------------------------------ steps
    # Each decodes the bytes a fixed-size state gathered and moves the parser on.

    def _on_length(self, chunk: bytes, events: list[Event]) -> None:
        length = INT32.unpack(chunk)[0]
        if length > self._max_document:
            raise EnvelopeTooLarge("document", self._max_document, length)
        if length < 5:
            raise fail(f"declared document length {length} is less than 5")
        self._length = length
        self._next_element()

    def _on_type(self, chunk: bytes, events: list[Event]) -> None:
        etype = chunk[0]
        if self._offset == self._length:  # this was the terminator's position
            if etype != 0:
                raise fail(f"document does not end with NUL at byte {self._length - 1}")
            if not self._payload_seen:
                raise fail("no 'message' field")
            self._state = _State.DONE
            events.append(Complete(MappingProxyType(self._fields)))
        elif etype == 0:
            raise fail(f"document ends after {self._offset} bytes but declares {self._length}")
        else:
            self._etype = etype
            self._name = ""
            self._state = _State.NAME

    def _on_name(self) -> None:
        name, etype = self._name, self._etype
        if name == _MESSAGE:
            if self._payload_seen:
                raise fail("duplicate field 'message'")
            if etype != 0x05:
                raise fail(f"'message' must be a binary, got {type_name(etype)}")
            self._payload_seen = True
            self._expect(_State.MESSAGE_HEAD, 5)
            return
        if name in self._fields:
            raise fail(f"duplicate field {name!r}")
        if etype in VARIABLE:
            self._expect(_State.VALUE_LENGTH, 4)
            return
        size = FIXED_SIZE.get(etype)
        if size is None:
            raise fail(f"field {name!r}: unsupported BSON element {type_name(etype)}")
        if size == 0:  # null: nothing to read
            self._fields[name] = None
            self._next_element()
        else:
            self._prefix = b""
            self._expect(_State.VALUE, size)

    def _on_value_length(self, chunk: bytes, events: list[Event]) -> None:
        length = INT32.unpack(chunk)[0]
        etype, where = self._etype, f"field {self._name!r}"
        if etype == 0x02:
            if length < 1:
                raise fail(f"{where}: string length {length} is less than 1")
            rest = length
        elif etype == 0x05:
            if length < 0:
                raise fail(f"{where}: negative binary length {length}")
            rest = length + 1
        else:
            if length < 5:
                raise fail(f"{where}: {type_name(etype)} length {length} is less than 5")
            rest = length - 4
        self._prefix = chunk
        self._expect(_State.VALUE, rest)

    def _on_value(self, chunk: bytes, events: list[Event]) -> None:
        raw = self._prefix + chunk
        where = self._name
        value, end = read_value(self._etype, raw, 0, len(raw), where, 0)
        if end != len(raw):  # cannot happen: sizes are computed alike; keep it loud
            raise fail(f"field {where!r}: value length mismatch")
        self._fields[where] = value
        self._next_element()

    def _on_message_head(self, chunk: bytes, events: list[Event]) -> None:
        length, subtype = BIN_HEAD.unpack(chunk)
        if length < 0:
            raise fail(f"'message' has negative binary length {length}")
        if subtype == 2:
            if length < 4:
                raise fail("'message' old binary (subtype 2) is shorter than its length")
            self._remaining = length
            self._expect(_State.MESSAGE_OLD, 4)
        elif subtype != 0:
            raise fail(f"'message' binary subtype {subtype & 0xFF} is not supported")
        else:
            self._start_payload(length, events)

    def _on_message_old(self, chunk: bytes, events: list[Event]) -> None:
        inner = INT32.unpack(chunk)[0]
        if inner != self._remaining - 4:
            raise fail("'message' old binary (subtype 2) inner length does not match")
        self._start_payload(inner, events)

    def _start_payload(self, length: int, events: list[Event]) -> None:
        if self._offset + length > self._length - 1:
            raise fail(
                f"'message' of {length} bytes at byte {self._offset} runs past the end of "
                f"the {self._length}-byte document"
            )
        # A copy: the fields after the payload must not show up in this event.
        events.append(PayloadStart(length, MappingProxyType(dict(self._fields))))
        if length:
            self._remaining = length
            self._state = _State.PAYLOAD
        else:
            events.append(PayloadEnd())
            self._next_element()


_Reader: TypeAlias = Callable[[EnvelopeParser, memoryview, int, int, list[Event]], int]
_Step: TypeAlias = Callable[[EnvelopeParser, bytes, list[Event]], None]

# What each state does with the bytes it is fed.
_READERS: dict[_State, _Reader] = {
    _State.LENGTH: EnvelopeParser._read_fixed,
    _State.TYPE: EnvelopeParser._read_fixed,
    _State.NAME: EnvelopeParser._read_name,
    _State.VALUE_LENGTH: EnvelopeParser._read_fixed,
    _State.VALUE: EnvelopeParser._read_fixed,
    _State.MESSAGE_HEAD: EnvelopeParser._read_fixed,
    _State.MESSAGE_OLD: EnvelopeParser._read_fixed,
    _State.PAYLOAD: EnvelopeParser._read_payload,
    _State.DONE: EnvelopeParser._read_trailing,
}

# What each fixed-size state does once its bytes are gathered.
_STEPS: dict[_State, _Step] = {
    _State.LENGTH: EnvelopeParser._on_length,
    _State.TYPE: EnvelopeParser._on_type,
    _State.VALUE_LENGTH: EnvelopeParser._on_value_length,
    _State.VALUE: EnvelopeParser._on_value,
    _State.MESSAGE_HEAD: EnvelopeParser._on_message_head,
    _State.MESSAGE_OLD: EnvelopeParser._on_message_old,
}
