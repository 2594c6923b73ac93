"""A streaming MQTT framer: fixed header and Remaining Length, then the body as it arrives.

Bytes in, events out (h11's shape): :meth:`Framer.feed` takes what the socket gave,
:meth:`Framer.next_event` hands back a :class:`Head` (the packet's first byte, its Remaining
Length and the fixed-header bytes as received), then the body as :class:`Body` pieces of
whatever size arrived, the last one flagged. Nothing is ever joined: a 256 MiB PUBLISH
passes through in the pieces the socket delivered, and the framer holds at most what was
fed and not yet taken. A varint longer than four bytes, a reserved packet type 0 or a
length over `max_length` is refused as soon as its bytes are seen.

Between packets, :meth:`Framer.passable` hands out instead the longest run of whole packets
that a relay need not see (:mod:`proxy.protocol._runs`) as one slice, with no event per
packet: :attr:`Framer.heads` counts the packets framed one by one, :attr:`Framer.passed`
those handed out in runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import MalformedPacket, PacketTooLarge
from ._runs import RunRule, scan
from ._wire import MAX_VARINT, decode_varint

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = range(8, 16)


@dataclass(frozen=True, slots=True)
class Head:
    """A packet's fixed header; its body follows as :class:`Body` events (none when 0)."""

    first: int  # packet type << 4 | flags
    length: int  # Remaining Length
    raw: bytes  # the fixed header's bytes as they came

    @property
    def type(self) -> int:
        return self.first >> 4

    @property
    def flags(self) -> int:
        return self.first & 0x0F


@dataclass(frozen=True, slots=True)
class Body:
    """A piece of the current packet's body; `last` when it completes the packet."""

    data: bytes
    last: bool


class Framer:
    """Packet boundaries in one direction of one connection.

    Args:
        max_length: the largest Remaining Length accepted; larger is :class:`PacketTooLarge`.
    """

    def __init__(self, *, max_length: int = MAX_VARINT) -> None:
        self.max_length = max_length
        self._data = b""
        self._pos = 0
        self._remaining: int | None = None  # body bytes still to come; None: in a header
        self.heads = 0  # packets framed one by one (a Head each)
        self.passed = 0  # packets handed out in runs (no object each)

    @property
    def buffered(self) -> int:
        """Bytes fed and not yet handed out."""
        return len(self._data) - self._pos

    @property
    def in_packet(self) -> bool:
        """Whether a packet has begun and not ended (a header or body is partly read)."""
        return self._remaining is not None or self.buffered > 0

    def feed(self, data: bytes) -> None:
        if self._pos >= len(self._data):
            self._data, self._pos = data, 0
        elif data:
            self._data, self._pos = self._data[self._pos :] + data, 0

    def next_event(self) -> Head | Body | None:
        """The next event, or None until more bytes are fed.

        Raises:
            MalformedPacket: a reserved packet type or a five-byte Remaining Length.
            PacketTooLarge: a Remaining Length over `max_length`.
        """
        if self._remaining is None:
            return self._head()
        available = len(self._data) - self._pos
        if available == 0:
            return None
        take = min(available, self._remaining)
        piece = self._data[self._pos : self._pos + take]
        self._pos += take
        self._remaining -= take
        last = self._remaining == 0
        if last:
            self._remaining = None
        return Body(piece, last)

    def passable(
        self, stop: int, rule: RunRule, packets: int = MAX_VARINT, size: int = MAX_VARINT
    ) -> bytes | None:
        """The longest run of whole packets at the front of what was fed that `stop` (a
        mask of packet types) and `rule` let pass, taken as one slice (translated where
        `rule` says, :func:`proxy.protocol._runs.scan`); b"" when none is
        whole yet (feed more), None when the next packet is the caller's: its
        :class:`Head` is the next event (or the error that refuses it). The run ends after
        `packets` packets, or after the packet that reaches `size` bytes (the rest waits
        for the next call).

        Only between packets: inside one (its body being handed out as pieces), None.
        """
        if self._remaining is not None:
            return None
        data, start = self._data, self._pos
        end, count, blocked, run = scan(
            data, start, stop, rule, self.max_length, packets, start + size
        )
        if end == start:
            return None if blocked else b""
        self.passed += count
        if end == len(data):
            self._data, self._pos = b"", 0  # hold nothing between reads
        else:
            self._pos = end
        return run

    def whole_body(self, head: Head) -> bytes | None:
        """The body of the packet `head` began, taken at once when all of it is already
        buffered; None (nothing taken) when some is still to come. The small-packet fast
        path: one slice, no :class:`Body` events."""
        if head.length == 0:
            return b""
        remaining = self._remaining
        if remaining is None or remaining != head.length:
            return None  # part of the body was taken as pieces already
        if len(self._data) - self._pos < remaining:
            return None
        piece = self._data[self._pos : self._pos + remaining]
        self._pos += remaining
        self._remaining = None
        return piece

    def _head(self) -> Head | None:
        data, at = self._data, self._pos
        if at >= len(data):
            return None
        first = data[at]
        if first >> 4 == 0:
            raise MalformedPacket("reserved packet type 0")
        got = decode_varint(data, at + 1)
        if got is None:
            return None
        length, end = got
        if length > self.max_length:
            raise PacketTooLarge(f"Remaining Length {length} is over {self.max_length}")
        raw = data[at:end]
        self._pos = end
        if length:
            self._remaining = length
        self.heads += 1
        return Head(first, length, raw)
