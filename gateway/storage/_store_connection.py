"""One connection to the store, read by the event loop into buffers of its own
(`gateway.storage._async_http` makes its requests on it).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import cast

from ._base import StoreError

#: Unread bytes a connection buffers before it stops reading the store's socket.
LIMIT = 1 << 20
#: Bytes of each read buffer: a download's pieces are up to this large. Just under 1 MiB,
#: gateway/cli.py's mmap threshold, so that it comes from the heap (no page faults).
READ_BUFFER = (1 << 20) - 4096
#: A buffer with less room than this left is not read into again.
MIN_ROOM = 64 * 1024
#: Largest answer head accepted.
MAX_HEAD = 65536


class StoreConnection(asyncio.BufferedProtocol):
    """One connection's bytes, read by the event loop straight into buffers of its own
    (READ_BUFFER each at most, and no larger than what is still due of an answer whose
    length is known: `expect`) and handed over as views of them: no copy in user space,
    and as much as the socket holds per piece (uvloop's own read buffer would cut each
    piece at 256,000 bytes). Reading pauses while more than LIMIT bytes wait to be taken.

    A view handed out keeps its buffer alive; the connection never writes into a part of
    a buffer it has handed out (each read goes after the last), and starts a new buffer
    when less than MIN_ROOM is left."""

    def __init__(self) -> None:
        self._full: deque[memoryview] = deque()  # unread bytes of earlier buffers
        self._buffer = memoryview(b"")  # the buffer being filled
        self._start = 0  # its first unread byte
        self._end = 0  # its first free byte
        self._size = 0  # unread bytes in all
        self._eof = False
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._transport: asyncio.Transport | None = None
        self._due = 0  # bytes still to arrive, as far as known (`expect`)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self._transport = cast(asyncio.Transport, transport)

    def expect(self, size: int) -> None:
        """An answer's body of `size` bytes is due, its unread bytes included: the next
        buffers are no larger than the rest of it needs."""
        self._due = max(0, size - self._size)

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self._buffer) - self._end < MIN_ROOM:
            if self._end > self._start:
                self._full.append(self._buffer[self._start : self._end])
            # A fresh buffer is zeroed: for a small answer, 1 MiB of it was most of the
            # read's cost (a head or a small body needs MIN_ROOM at most).
            size = min(READ_BUFFER, max(MIN_ROOM, self._due))
            self._buffer = memoryview(bytearray(size))
            self._start = self._end = 0
        return self._buffer[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        self._size += nbytes
        self._due = max(0, self._due - nbytes)
        if self._size > LIMIT and not self._paused and self._transport is not None:
            self._transport.pause_reading()
            self._paused = True
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, timeout: float) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        async with asyncio.timeout(timeout):
            await self._waiter

    @property
    def usable(self) -> bool:
        transport = self._transport
        return not self._eof and transport is not None and not transport.is_closing()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def write(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)

    def writelines(self, pieces: list[bytes]) -> None:
        assert self._transport is not None
        self._transport.writelines(pieces)

    def shed(self) -> None:
        """Let go of the read buffer when nothing in it is unread (a kept connection
        waiting for its next request holds no buffer; views handed out keep theirs)."""
        if not self._size:
            self._full.clear()
            self._buffer = memoryview(b"")
            self._start = self._end = 0

    def _take(self, size: int) -> memoryview:
        """Up to `size` unread bytes, in order, as one view (of one buffer)."""
        if self._full:
            piece = self._full.popleft()
            if len(piece) > size:
                self._full.appendleft(piece[size:])
                piece = piece[:size]
        else:
            stop = min(self._end, self._start + size)
            piece = self._buffer[self._start : stop]
            self._start = stop
        self._size -= len(piece)
        if self._paused and self._size <= LIMIT and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return piece

    async def read(self, size: int, timeout: float) -> memoryview:
        """Up to `size` bytes as they came; empty at the end."""
        while not self._size and not self._eof:
            await self._wait(timeout)
        return self._take(size) if self._size else memoryview(b"")

    def _peek(self, limit: int) -> bytes:
        """A copy of the first `limit` unread bytes (fewer when fewer are unread)."""
        parts: list[memoryview] = []
        for piece in (*self._full, self._buffer[self._start : self._end]):
            parts.append(piece[: limit - sum(map(len, parts))])
        return b"".join(parts)

    async def head(self, timeout: float) -> bytes:
        """The bytes up to and with the first blank line."""
        while True:
            unread = self._peek(MAX_HEAD + 4)
            end = unread.find(b"\r\n\r\n")
            if end >= 0:
                left = end + 4
                while left:
                    left -= len(self._take(left))
                return unread[: end + 4]
            if len(unread) > MAX_HEAD:
                raise StoreError(f"the store's answer head is over {MAX_HEAD} bytes")
            if self._eof:
                raise ConnectionResetError("the store closed the connection before answering")
            await self._wait(timeout)
