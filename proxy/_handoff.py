"""Pieces between the event loop and a transfer's worker thread, bounded both ways.

A payload's bytes cross the proxy twice: client socket -> gateway upload, and gateway
fetch -> client socket. The gateway side of each runs on a worker thread (a blocking httpx
client: the HTTP exchange, the SHA-256, the socket calls all release the GIL), so the event
loop only moves pieces between the client's socket and one of these channels. A loop step
then costs a socket read or write of one piece, never an HTTP exchange or a hash: small
messages on other connections wait behind at most one such step, not behind a whole
megabyte's work (bench/RESULTS.md, "Proxy: payloads on worker threads").

Each channel holds at most `depth` pieces: a slow reader (the client, or the gateway)
slows the writer, and memory per transfer stays `depth` pieces.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from typing import Generic, TypeVar

T = TypeVar("T")

#: How often a waiting worker thread looks whether the loop side has given up.
POLL = 0.25


class Stopped(Exception):
    """The other side of a channel has given up (an error, a cancelled task, shutdown)."""


class ToLoop(Generic[T]):
    """From one worker thread to the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, depth: int) -> None:
        self._loop = loop
        self._items: asyncio.Queue[T] = asyncio.Queue()
        self._room = threading.Semaphore(depth)
        self.stopped = threading.Event()  # set by the loop side when it stops reading

    def put(self, item: T) -> None:
        """(worker thread) Hand `item` over; waits while the channel is full.

        Raises:
            Stopped: the loop side has stopped reading, or the loop is closed.
        """
        while not self._room.acquire(timeout=POLL):
            if self.stopped.is_set():
                raise Stopped
        if self.stopped.is_set():
            raise Stopped
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError as exc:  # the loop is closed
            raise Stopped from exc

    async def get(self) -> T:
        """(event loop) The next item."""
        item = await self._items.get()
        self._room.release()
        return item

    def stop(self) -> None:
        """(event loop) Read no more: a thread waiting to hand over gives up."""
        self.stopped.set()


class FromLoop(Generic[T]):
    """From the event loop to one worker thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, depth: int) -> None:
        self._loop = loop
        self._items: queue.SimpleQueue[T | None] = queue.SimpleQueue()
        self._room = asyncio.Semaphore(depth)
        self._gone = False  # (loop side) the thread reads no more
        self._depth = depth

    async def put(self, item: T) -> None:
        """(event loop) Hand `item` over; waits while the channel is full.

        Raises:
            Stopped: the thread has stopped reading (its transfer ended or failed).
        """
        await self._room.acquire()
        if self._gone:
            raise Stopped
        self._items.put(item)

    def abort(self) -> None:
        """(event loop) No more items: the thread's next :meth:`get` raises :class:`Stopped`."""
        self._items.put(None)

    def get(self, timeout: float) -> T:
        """(worker thread) The next item.

        Raises:
            Stopped: the loop side aborted.
            TimeoutError: nothing came for `timeout` seconds.
        """
        try:
            item = self._items.get(timeout=timeout)
        except queue.Empty as exc:
            raise TimeoutError(f"no piece for {timeout} s") from exc
        if item is None:
            raise Stopped
        try:
            self._loop.call_soon_threadsafe(self._room.release)
        except RuntimeError as exc:
            raise Stopped from exc
        return item

    def gone(self) -> None:
        """(worker thread) Reads no more: a loop side waiting for room gives up."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        self._gone = True
        for _ in range(self._depth + 1):
            self._room.release()
