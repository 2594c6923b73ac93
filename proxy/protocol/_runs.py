"""Runs of packets the proxy passes as they came, found without a Python object per packet
(STYLE 20). Pure.

A read from a socket brings several whole packets at a time (small telemetry: 4 to 11 in
most reads, bench/RESULTS.md "Round 17"). The proxy changes few of them, so a relay
direction asks :func:`scan` for the longest prefix of whole packets it need not see and
writes that prefix in one write, as it came. Only the packet that stops the run is framed
(:class:`proxy.protocol.Head`) and handled one by one.

What stops a run is the relay's to say, in two parts:

* a mask of packet types (``1 << type``), which may change from one run to the next (the
  broker's PUBACK while the proxy waits for one to a placeholder it sent, say);
* a :class:`RunRule` for PUBLISH, fixed for a connection's direction: over a size (a
  PUBLISH the broker would refuse), or holding one of a few property identifiers (a Topic
  Alias, a user property), or a JSON object naming a key in its payload (a placeholder).

The rule errs one way only: a packet it cannot read to the end of its property block
(a length that lies, QoS 3, no topic) stops the run, so the relay's own parser sees it
and refuses it as before. A property identifier is looked for as any byte of the block
that could begin it (``ident`` or ``ident | 0x80``: a Variable Byte Integer may be written
longer than it need be, and the parser reads it all the same), so a property block cannot
be written to slip one past it; a byte that only happens to match sends a packet the slow
way, never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: A packet not yet whole that may still join a run is waited for up to this size; a larger
#: one is the relay's to stream (a run never holds more than one read and this).
RUN_WAIT = 64 * 1024

PUBLISH = 3
_RESERVED = 1  # type 0: the framer refuses it
#: What a JSON object may begin with: `{`, or what `bytes.lstrip()` strips before it.
_JSON_START = frozenset(b"{ \t\n\r\x0b\x0c")


@dataclass(frozen=True, slots=True)
class RunRule:
    """Which PUBLISHes a run may carry as they came.

    Attributes:
        publish_limit: a whole PUBLISH (fixed header included) larger than this stops a run.
        v5: PUBLISHes carry a property block (MQTT 5).
        properties: property identifiers (one byte each) of which any in a PUBLISH's
            property block stops a run.
        json_mark: a payload that may be a JSON object (its first byte `{` or blank, as the
            library's placeholder rule reads it) and holds these bytes stops a run (b"":
            none).
    """

    publish_limit: int
    v5: bool
    properties: bytes = b""
    json_mark: bytes = b""
    _marks: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The first byte of every encoding of each identifier, the longer ones included.
        marks = {b for ident in self.properties for b in (ident, ident | 0x80)}
        object.__setattr__(self, "_marks", tuple(sorted(marks)))


def type_mask(*kinds: int) -> int:
    """The mask that stops a run at each of these packet types."""
    mask = 0
    for kind in kinds:
        mask |= 1 << kind
    return mask


#: Every packet type: nothing passes in runs.
EVERY = 0xFFFF


def scan(data: bytes, at: int, stop: int, rule: RunRule, max_length: int) -> tuple[int, int, bool]:
    """The run of whole packets that pass, from `at`: (its end, its packets, whether a
    packet the caller must see comes next).

    Not blocked and `end` short of the data: a packet that may still pass is not whole yet
    (more bytes needed). Blocked: the next packet's type is in `stop`, its PUBLISH fails
    `rule`, it is longer than `max_length` or :data:`RUN_WAIT` and not whole, or it is
    malformed (the caller's framer says how).
    """
    # One loop, locals only: this runs for every packet relayed (bench/RESULTS.md, Round 18).
    size = len(data)
    stop |= _RESERVED
    limit, v5, marks, mark = rule.publish_limit, rule.v5, rule._marks, rule.json_mark
    find = data.find
    count = 0
    while at < size:
        first = data[at]
        kind = first >> 4
        if (stop >> kind) & 1:
            return at, count, True
        i = at + 1
        if i >= size:
            return at, count, False
        byte = data[i]
        i += 1
        length = byte & 0x7F
        if byte & 0x80:
            shift = 7
            while True:
                if i >= size:
                    return at, count, False
                byte = data[i]
                i += 1
                length |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    break
                shift += 7
                if shift == 28:  # a fifth byte: malformed
                    return at, count, True
        end = i + length
        if length > max_length:
            return at, count, True
        if end > size:
            return at, count, end - at > RUN_WAIT
        if kind == PUBLISH:  # whole: may it pass as it came?
            qos = (first >> 1) & 0x03
            if end - at > limit or qos == 3 or length < 2:
                return at, count, True
            topic = (data[i] << 8) | data[i + 1]
            if topic == 0:  # a Topic Alias stands for it, or malformed: the relay's to read
                return at, count, True
            i += 2 + topic + (2 if qos else 0)
            if v5:
                if i >= end:
                    return at, count, True
                byte = data[i]
                i += 1
                props = byte & 0x7F
                shift = 7
                while byte & 0x80:
                    if i >= end or shift == 28:
                        return at, count, True
                    byte = data[i]
                    i += 1
                    props |= (byte & 0x7F) << shift
                    shift += 7
                props_end = i + props
                if props_end > end:
                    return at, count, True
                if props:
                    for m in marks:
                        if find(m, i, props_end) >= 0:
                            return at, count, True
                i = props_end
            elif i > end:
                return at, count, True
            if mark and i < end and data[i] in _JSON_START and find(mark, i, end) >= 0:
                return at, count, True
        at = end
        count += 1
    return at, count, False
