"""Packets from one socket: the core's :class:`~proxy.protocol.Framer` fed from an
`asyncio.StreamReader`, with the timeouts that keep a silent peer from holding anything.

Between packets nothing times out here (the broker enforces the client's keep-alive and
closes its side, which ends the relay); once a packet has begun, each read must come within
`idle` seconds: a PUBLISH whose bytes stop halfway is dropped, never forwarded in part.

A relay takes runs of whole packets it need not see (:meth:`PacketStream.run`: one slice for
what a read brought, no object per packet) and frames one by one only the packet that
stops a run (:meth:`PacketStream.head`). What it hands out is charged to the account's
share of the event loop's time (:attr:`PacketStream.turn`, :mod:`proxy._turns`): a run is
cut to what is left of it, and once it is spent the stream waits for the account's next
turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Callable

from ._exceptions import PeerGone, PeerTimeout
from ._turns import Turn
from .protocol import Body, Framer, Head, RunRule

READ_SIZE = 256 * 1024
#: Reads a packet may take to arrive whole and still join a run: one that trickles in is
#: framed and streamed one by one instead (held, it would be copied whole at every read).
RUN_READS = 4


def _uncounted(amount: float) -> None:
    pass


class PacketStream:
    """Runs, heads and body pieces from `reader`.

    Args:
        on_heads: told how many packets were framed one by one (a :class:`Head` each).
        on_run: told how many packets went out in a run.

    Attributes:
        turn: the share of the loop's time what this stream hands out is charged to: its
            own until the relay gives it the account's (:mod:`proxy._turns`).
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        *,
        max_length: int,
        idle: float,
        on_heads: Callable[[float], None] = _uncounted,
        on_run: Callable[[float], None] = _uncounted,
    ) -> None:
        self._reader = reader
        self._framer = Framer(max_length=max_length)
        self.idle = idle
        self._on_heads = on_heads
        self._on_run = on_run
        self.turn = Turn()
        self._took = 1  # packets handed out last time: what a turn's waiter expects to take

    async def run(self, rule: RunRule, stop: Callable[[], int]) -> bytes | None:
        """The next run of whole packets that `rule` and `stop()` (asked again after each
        read: what stops a run may change while this waits) let pass, as they came; b""
        when the next packet is the caller's to frame (:meth:`head`): one it must read, or
        one not whole after :data:`RUN_READS` reads; None when the peer closed between
        packets.

        Raises:
            PeerGone: closed inside a packet.
            PeerTimeout: no byte for `idle` seconds inside a packet.
        """
        framer = self._framer
        reads = 0
        while True:
            turn = self.turn  # (its counts read inline: this runs for every run relayed)
            if turn.packets > 0 and turn.size > 0:
                most, size = turn.packets, turn.size
            else:  # the account's share of this pass of the loop is used
                await turn.wait(self._took)
                most, size = turn.room()
            passed = framer.passed
            run = framer.passable(stop(), rule, most, size)
            if run is None:
                return b""
            if run:
                self._took = taken = framer.passed - passed
                self._on_run(taken)
                turn.charge(taken, len(run))
                return run
            if reads == RUN_READS:  # a packet that comes in pieces is streamed as they come
                return b""
            try:
                await self._fill(self.idle if framer.in_packet else None)
            except PeerGone:
                if framer.in_packet:
                    raise
                return None
            if framer.in_packet:
                reads += 1

    async def _fill(self, timeout: float | None) -> None:
        try:
            if timeout is None:  # between packets: no timer to arm and cancel per packet
                data = await self._reader.read(READ_SIZE)
            else:
                async with asyncio.timeout(timeout):
                    data = await self._reader.read(READ_SIZE)
        except TimeoutError as exc:
            raise PeerTimeout(f"no byte for {timeout} s inside a packet") from exc
        except (ConnectionError, OSError) as exc:
            raise PeerGone(str(exc)) from exc
        if not data:
            raise PeerGone("closed inside a packet" if self._framer.in_packet else "closed")
        self._framer.feed(data)

    async def head(self, timeout: float | None = None) -> Head | None:
        """The next packet's fixed header; None when the peer closed between packets.

        Args:
            timeout: seconds for the whole header when nothing of it has come yet (the
                CONNECT's deadline); None: wait as long as the peer stays connected.
        """
        if self.turn.spent:
            await self.turn.wait(self._took)
        event = self._framer.next_event()  # fast path: a whole header already buffered
        if isinstance(event, Head):
            self._framed(event)
            return event
        assert event is None, "a body piece where a head was due"
        if timeout is None:
            return await self._next_head()
        try:
            async with asyncio.timeout(timeout):
                return await self._next_head()
        except TimeoutError as exc:
            raise PeerTimeout(f"no whole packet header within {timeout} s") from exc

    async def _next_head(self) -> Head | None:
        while True:
            try:
                await self._fill(self.idle if self._framer.in_packet else None)
            except PeerGone:
                if self._framer.in_packet:
                    raise
                return None
            event = self._framer.next_event()
            if isinstance(event, Head):
                self._framed(event)
                return event
            assert event is None, "a body piece where a head was due"

    def _framed(self, head: Head) -> None:
        self._on_heads(1)
        self._took = 1
        self.turn.charge(1, len(head.raw))

    def whole_body(self, head: Head) -> bytes | None:
        """`head`'s body when all of it is buffered already (see Framer.whole_body)."""
        body = self._framer.whole_body(head)
        if body:
            self.turn.charge(0, len(body))
        return body

    async def pieces(self, head: Head) -> AsyncIterator[bytes]:
        """The body of `head`'s packet in the pieces it arrives in."""
        if head.length == 0:
            return
        while True:
            if self.turn.spent:
                await self.turn.wait(1)
            event = self._framer.next_event()
            if event is None:
                await self._fill(self.idle)
                continue
            assert isinstance(event, Body)
            self.turn.charge(0, len(event.data))
            yield event.data
            if event.last:
                return

    async def body(self, head: Head) -> bytes:
        """The whole body of a packet the caller has bounded."""
        whole = self._framer.whole_body(head)
        if whole is not None:
            return whole
        return b"".join([piece async for piece in self.pieces(head)])


def send(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write `data` to a peer whose side may have closed meanwhile.

    Raises:
        PeerGone: its transport is closed (the peer went away, or a write failed: uvloop
            then raises RuntimeError at the next write, asyncio drops it silently) while the
            other direction, which saw it first, is ending the session.
    """
    if writer.transport.is_closing():
        raise PeerGone("the peer's connection is closed")
    writer.write(data)


#: Bytes a transport may hold unsent before a relay waits for it (asyncio's own default
#: high-water mark); below it a write needs no `drain()` round trip through the loop.
HIGH_WATER = 64 * 1024


async def drained(writer: asyncio.StreamWriter, idle: float) -> None:
    """Wait only when the peer is not keeping up: the per-packet fast path. A peer that
    takes too little for `idle` seconds is cut off (:func:`drain_within`), as it is while a
    payload is written to it."""
    if writer.transport.get_write_buffer_size() > HIGH_WATER:
        await drain_within(writer, idle)


#: The most of a payload written to a client in one loop step: a large piece goes out in
#: slices with a loop turn between them, so that other connections' packets are relayed in
#: between (a 1 MiB socket write on loopback takes the better part of a millisecond).
SLICE = 256 * 1024


async def drain_within(writer: asyncio.StreamWriter, idle: float) -> None:
    """Wait until the peer (client or broker) has taken what is buffered, at most `idle`
    seconds.

    Raises:
        PeerTimeout: it took too little for `idle` seconds (a client that stops reading
            would otherwise hold a payload's fetch slot, thread and memory for ever, and a
            broker that does the same the connection and the PUBLISH it is relaying).
    """
    try:
        async with asyncio.timeout(idle):
            await writer.drain()
    except TimeoutError as exc:
        raise PeerTimeout(f"the peer took too little of a packet for {idle} s") from exc


async def write_all(
    writer: asyncio.StreamWriter, pieces: AsyncIterable[bytes], idle: float
) -> None:
    """Write every piece as it comes (:func:`write_piece`), then wait until the client has
    taken them all (:func:`drain_within`)."""
    async for piece in pieces:
        await write_piece(writer, piece, idle)
    await drain_within(writer, idle)


async def write_piece(writer: asyncio.StreamWriter, piece: bytes | memoryview, idle: float) -> None:
    """Write `piece` in slices of at most :data:`SLICE`, yielding to the loop after each;
    :func:`drain_within` `idle` when the client lags."""
    view = memoryview(piece)
    for start in range(0, len(view), SLICE):
        writer.write(view[start : start + SLICE])
        if writer.transport.get_write_buffer_size() > HIGH_WATER:
            await drain_within(writer, idle)
        else:
            await asyncio.sleep(0)
