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
  PUBLISH the broker would refuse), or holding a property the relay reads (a Topic Alias;
  a user property named `_format` or `__chunk`), or a JSON object naming a key in its
  payload (a placeholder).

The rule errs one way only: a packet it cannot read to the end of its property block
(a length that lies, QoS 3, no topic) stops the run, so the relay's own parser sees it
and refuses it as before. Properties are looked for as bytes anywhere in the block, in
every form the parser would read them in: an identifier as any byte that could begin it
(``ident`` or ``ident | 0x80``: a Variable Byte Integer may be written longer than it need
be, and the parser reads it all the same, :func:`identifier_marks`), a user property by its
name as written (its two-byte length and its UTF-8, which has one form: :func:`name_marks`).
So no property block can be written to slip one past; bytes that only happen to match send
a packet the slow way, never the other way round.

On a link the proxy upgrades (an MQTT 3.1.1 client, an MQTT 5 broker: :mod:`._v311`) a run
is translated as it is taken (:func:`scan`), packet by packet as that module's table
says, without an object per packet: toward the broker a PUBLISH gets its empty property
section; toward the client a PUBLISH loses its property section (after the rule above has
read it) and a PUBACK, PUBREC, PUBREL or PUBCOMP its reason code and properties. Every
other packet either passes as it is (the same bytes in both versions) or stops the run.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._wire import encode_varint

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
        property_marks: bytes of which any, anywhere in a PUBLISH's property block, stops a
            run (:func:`identifier_marks`, :func:`name_marks`).
        json_mark: a payload that may be a JSON object (its first byte `{` or blank, as the
            library's placeholder rule reads it) and holds these bytes stops a run (b"":
            none).
        translate: 0, packets pass as they came; :data:`UPGRADE` or :data:`DOWNGRADE`,
            they are translated (:func:`scan`; `publish_limit` is then of the
            translated PUBLISH).
    """

    publish_limit: int
    v5: bool
    property_marks: tuple[bytes, ...] = ()
    json_mark: bytes = b""
    translate: int = 0


def identifier_marks(*idents: int) -> tuple[bytes, ...]:
    """What any property with one of these (one-byte) identifiers holds, however its
    identifier is written: the first byte of each of its encodings, the longer ones too."""
    return tuple(bytes([b]) for b in sorted({b for i in idents for b in (i, i | 0x80)}))


def name_marks(*names: str) -> tuple[bytes, ...]:
    """What a user property with one of these names holds: the name as MQTT writes it."""
    return tuple(len(n.encode()).to_bytes(2, "big") + n.encode() for n in names)


def type_mask(*kinds: int) -> int:
    """The mask that stops a run at each of these packet types."""
    mask = 0
    for kind in kinds:
        mask |= 1 << kind
    return mask


#: Every packet type: nothing passes in runs.
EVERY = 0xFFFF
#: :attr:`RunRule.translate`: a 3.1.1 client's packets to an MQTT 5 broker.
UPGRADE = 1
#: :attr:`RunRule.translate`: an MQTT 5 broker's packets to a 3.1.1 client.
DOWNGRADE = 2
_PUBACK, _PUBCOMP = 4, 7
#: An acknowledgement longer than this is the relay's to refuse (proxy._outbound).
_MAX_ACK = 65536


def scan(
    data: bytes,
    at: int,
    stop: int,
    rule: RunRule,
    max_length: int,
    most: int = 1 << 62,
    until: int = 1 << 62,
) -> tuple[int, int, bool, bytes]:
    """The run of whole packets that pass, from `at`: (its end, its packets, whether a
    packet the caller must see comes next, the run as the other side gets it). It ends
    after `most` packets, or with the packet that reaches offset `until` (a share of the
    loop's time, proxy._turns: the rest is the next run's).

    Not blocked and `end` short of the data: the share was reached, or a packet that may
    still pass is not whole yet (more bytes needed). Blocked: the next packet's type is in
    `stop`, its PUBLISH fails `rule`, it is longer than `max_length` or :data:`RUN_WAIT`
    and not whole, or it is malformed (the caller's framer says how).

    The run is `data[at:end]` as it came, unless `rule` translates (an upgraded link):
    then a PUBLISH is rewritten (:data:`UPGRADE`: an empty property section after the
    packet id; :data:`DOWNGRADE`: the property section left out, once `rule` has let it
    pass), and so is an acknowledgement toward the client with more than its packet id;
    the stretches between are copied as they came.
    """
    # One loop, locals only: this runs for every packet relayed (bench/RESULTS.md, Round 18),
    # and stays whole (issue 51 §6 asked to shorten it): split into a Variable Byte Integer
    # helper and a PUBLISH check, two calls a packet, it took 1.27 x the time for a run of
    # 1 KB QoS 1 PUBLISHes and 1.51 x for small QoS 0 ones (timeit, +126 and +346 ns a
    # packet), and the relay 22 against 16 us of CPU per QoS 1 message, 8 against 7 at QoS 0
    # (python bench/proxy_relay.py --rounds 5 --broker nodelay --against <the split tree>;
    # bench/RESULTS.md, Round 19).
    size = len(data)
    stop |= _RESERVED
    limit, v5, marks, mark = rule.publish_limit, rule.v5, rule.property_marks, rule.json_mark
    up, down = rule.translate == UPGRADE, rule.translate == DOWNGRADE
    find = data.find
    start = at
    out: list[bytes] = []  # translated: the run's pieces
    copied = at  # translated: the packets from here to `at` go as they came
    count = 0
    blocked = False
    bound = until if until < size else size  # (beyond `until`: the next run's)
    while at < bound and count < most:
        first = data[at]
        kind = first >> 4
        if (stop >> kind) & 1:
            blocked = True
            break
        i = at + 1
        if i >= size:
            break
        byte = data[i]
        i += 1
        length = byte & 0x7F
        shift = 7
        while byte & 0x80:
            if i >= size:
                break
            if shift == 28:  # a fifth byte: malformed
                blocked = True
                break
            byte = data[i]
            i += 1
            length |= (byte & 0x7F) << shift
            shift += 7
        if blocked or byte & 0x80:  # malformed, or the length not all here yet
            break
        end = i + length
        if length > max_length:
            blocked = True
            break
        if end > size:
            blocked = end - at > RUN_WAIT
            break
        if kind == PUBLISH:  # whole: may it pass (as it came, or translated)?
            qos = (first >> 1) & 0x03
            if qos == 3 or length < 2:
                blocked = True
                break
            fixed = bytes((first,)) + encode_varint(length + 1) if up else b""
            if (len(fixed) + length + 1 if up else end - at) > limit:  # offloaded
                blocked = True
                break
            topic = (data[i] << 8) | data[i + 1]
            ids = i + 2 + topic + (2 if qos else 0)
            # No topic: a Topic Alias stands for it, or malformed: the relay's to read.
            if topic == 0 or ids > end:
                blocked = True
                break
            props_end = ids
            if v5:
                if ids == end:
                    blocked = True
                    break
                j = ids
                byte = data[j]
                j += 1
                props = byte & 0x7F
                shift = 7
                while byte & 0x80:
                    if j >= end or shift == 28:
                        blocked = True
                        break
                    byte = data[j]
                    j += 1
                    props |= (byte & 0x7F) << shift
                    shift += 7
                props_end = j + props
                if blocked or props_end > end:
                    blocked = True
                    break
                if props and any(find(m, j, props_end) >= 0 for m in marks):
                    blocked = True
                    break
            if (
                mark
                and props_end < end
                and data[props_end] in _JSON_START
                and find(mark, props_end, end) >= 0
            ):
                blocked = True
                break
            if up or down:
                if copied < at:
                    out.append(data[copied:at])
                if up:
                    out += (fixed, data[i:ids], b"\x00", data[ids:end])
                else:
                    fixed = bytes((first,)) + encode_varint(length - (props_end - ids))
                    out += (fixed, data[i:ids], data[props_end:end])
                copied = end
        elif down and _PUBACK <= kind <= _PUBCOMP and length != 2:
            if length < 2 or length > _MAX_ACK:  # the relay refuses it
                blocked = True
                break
            if copied < at:
                out.append(data[copied:at])
            out += (bytes((first, 2)), data[i : i + 2])
            copied = end
        at = end
        count += 1
    if not out:  # nothing translated: the run as it came
        return at, count, blocked, data[start:at]
    if copied < at:
        out.append(data[copied:at])
    return at, count, blocked, b"".join(out)
