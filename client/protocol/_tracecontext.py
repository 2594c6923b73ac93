"""W3C Trace Context: the `traceparent` and `tracestate` values, parsed and written. Pure.

The same two values travel as HTTP headers (W3C Trace Context) and as MQTT 5 user
properties (the W3C's MQTT binding of it): the client library, the gateway and the proxy
read them from any publisher and any HTTP client, so every parse is bounded before it
runs and its failure is a value (None), never an exception:

* `traceparent`: at most :data:`MAX_TRACEPARENT` characters, else ignored. Version `00` is
  exactly `00-<32 hex>-<16 hex>-<2 hex>`, lowercase; a later version is read by its first
  55 characters (W3C's forward-compatibility rule: the rest must begin with `-`); `ff`,
  an all-zero trace id or parent id, uppercase or any other character: ignored.
* `tracestate`: at most :data:`MAX_TRACESTATE` characters and 32 members, each key and
  value of W3C's grammar, no key twice; anything else drops the tracestate alone (the
  traceparent still holds), as W3C says.
* Two `traceparent` values (two headers, two user properties) are no context at all.

Nothing parsed here is ever echoed as it came: what is written back out is built from the
parsed integers and the validated tracestate, so a value that reaches a header, a user
property or a log line has passed the grammar.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: Longest `traceparent` looked at. Version 00 is 55 characters; later versions may add
#: fields after them, which are ignored: this keeps a 10 KB value from being scanned.
MAX_TRACEPARENT = 256
#: Longest `tracestate` kept (W3C: propagate at least 512 characters; more may be dropped).
MAX_TRACESTATE = 512
MAX_TRACESTATE_MEMBERS = 32
#: The flags this codec writes back: sampled (0x01) and W3C level 2's random (0x02).
KNOWN_FLAGS = 0x03
SAMPLED = 0x01

_VERSION_00_LENGTH = 55
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_KEY = re.compile(
    r"[a-z][a-z0-9_\-*/]{0,255}"
    r"|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13}"
)
_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
_OWS = " \t"


def _text(value: str | bytes | None, limit: int) -> str | None:
    """`value` as text when it is short enough to look at; bytes must be ASCII."""
    if value is None or len(value) > limit:
        return None
    if isinstance(value, bytes):
        try:
            return value.decode("ascii")
        except UnicodeDecodeError:
            return None
    return value


def parse_tracestate(value: str | bytes | None) -> str:
    """The tracestate in its canonical form (`key=value` joined by `,`), or "" when it is
    absent, too long or not of W3C's grammar (then it is dropped whole)."""
    text = _text(value, MAX_TRACESTATE)
    if not text:
        return ""
    members: list[str] = []
    keys: set[str] = set()
    for raw in text.split(","):
        member = raw.strip(_OWS)
        if not member:
            continue  # W3C allows empty list members
        key, eq, val = member.partition("=")
        if not eq or not _KEY.fullmatch(key) or not _VALUE.fullmatch(val) or key in keys:
            return ""
        keys.add(key)
        members.append(f"{key}={val}")
        if len(members) > MAX_TRACESTATE_MEMBERS:
            return ""
    return ",".join(members)


@dataclass(frozen=True, slots=True)
class TraceContext:
    """One W3C trace context: whose trace, which span is the parent, and its flags.

    Attributes:
        trace_id: the 128-bit trace id (never 0).
        span_id: the 64-bit id of the span that is the parent on the receiving side
            (`parent-id`; never 0).
        flags: the trace flags (bit 0: sampled).
        tracestate: vendor data, validated and canonical ("" for none).
    """

    trace_id: int
    span_id: int
    flags: int = SAMPLED
    tracestate: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.trace_id < 1 << 128 or not 0 < self.span_id < 1 << 64:
            raise ValueError("a trace id and a span id are non-zero 128 and 64-bit numbers")
        if not 0 <= self.flags <= 0xFF:
            raise ValueError("trace flags are one byte")

    @classmethod
    def parse(
        cls, traceparent: str | bytes | None, tracestate: str | bytes | None = None
    ) -> TraceContext | None:
        """A context from the two values as received; None when `traceparent` is not one.

        Args:
            traceparent: the `traceparent` value (header or user property).
            tracestate: the `tracestate` value; dropped alone when it is invalid.
        """
        text = _text(traceparent, MAX_TRACEPARENT)
        if text is None:
            return None
        text = text.strip(_OWS)
        head = text[:_VERSION_00_LENGTH]
        match = _TRACEPARENT.fullmatch(head)
        if match is None:
            return None
        version, trace_hex, span_hex, flags_hex = match.groups()
        if version == "ff" or (version == "00" and len(text) != _VERSION_00_LENGTH):
            return None
        if len(text) > _VERSION_00_LENGTH and text[_VERSION_00_LENGTH] != "-":
            return None
        trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
        if not trace_id or not span_id:
            return None
        return cls(trace_id, span_id, int(flags_hex, 16), parse_tracestate(tracestate))

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[str, str | bytes]]) -> TraceContext | None:
        """A context from (name, value) pairs: MQTT user properties or HTTP headers.

        Names match case-insensitively (HTTP headers); two `traceparent` values are no
        context; several `tracestate` values are one list, as HTTP combines them.
        """
        parent: str | bytes | None = None
        states: list[str | bytes] = []
        seen = 0
        for name, value in pairs:
            if len(name) == len(TRACEPARENT) and name.lower() == TRACEPARENT:
                seen += 1
                parent = value
            elif len(name) == len(TRACESTATE) and name.lower() == TRACESTATE:
                states.append(value)
        if seen != 1:
            return None
        state: str | bytes | None = None
        if len(states) == 1:
            state = states[0]
        elif states:
            texts = [_text(s, MAX_TRACESTATE) for s in states]
            state = None if None in texts else ",".join(t for t in texts if t is not None)
        return cls.parse(parent, state)

    @property
    def traceparent(self) -> str:
        """The `traceparent` value (version 00)."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags & KNOWN_FLAGS:02x}"

    @property
    def trace_id_hex(self) -> str:
        """The trace id as 32 lowercase hex digits (logs, exemplars, the Spark column)."""
        return f"{self.trace_id:032x}"

    @property
    def span_id_hex(self) -> str:
        """The parent span id as 16 lowercase hex digits."""
        return f"{self.span_id:016x}"

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)

    def pairs(self) -> tuple[tuple[str, str], ...]:
        """`traceparent` (and `tracestate` when there is one) as (name, value) pairs: the
        HTTP headers or the MQTT 5 user properties that carry this context."""
        if self.tracestate:
            return ((TRACEPARENT, self.traceparent), (TRACESTATE, self.tracestate))
        return ((TRACEPARENT, self.traceparent),)


def carries_trace(user_properties: Sequence[tuple[str, str]]) -> bool:
    """Whether any user property is named `traceparent` (valid or not): a context the
    publisher set itself, which is never replaced."""
    return any(name == TRACEPARENT for name, _ in user_properties)


def without_trace(user_properties: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The user properties less `traceparent` and `tracestate`."""
    return tuple(p for p in user_properties if p[0] not in (TRACEPARENT, TRACESTATE))
