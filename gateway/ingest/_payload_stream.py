"""A download's payload: read from the store in its transfer slot's thread (`PayloadStream`),
or by the event loop itself (`read_on_loop`).

Kept apart from `OffloadService` (which admits the transfer and opens the object): this is
the part that runs while the response streams, and gives the slot back however it ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import deque
from collections.abc import AsyncIterator, Iterator

from ..core import Slot, close_at_request_end
from ..storage import AsyncBody

# Store bytes read per hop to the transfer thread. The store's pieces are small (256 KiB:
# under the 1 MiB mmap threshold of gateway/cli.py, so their memory is reused instead of
# mapped, faulted in and unmapped for each piece), so one hop reads several: a hop costs a
# thread wake-up and two loop callbacks (bench/RESULTS.md, "Gateway downloads").
BATCH = 2 * 1024 * 1024


def abandon(job: concurrent.futures.Future[Iterator[bytes]], slot: Slot) -> None:
    """Close what a cancelled open produced, once it finishes, and give the slot back."""
    try:
        if not job.cancelled() and job.exception() is None:
            closer = getattr(job.result(), "close", None)
            if closer is not None:
                closer()
    finally:
        slot.release()


class PayloadStream:
    """Pull a blocking iterator from its transfer slot's thread, one batch read ahead.

    Each hop to the thread reads pieces until `BATCH` bytes (or the end); the next batch is
    read from the store while the current one is written to the client, so the two
    transfers overlap (bench/RESULTS.md: a download otherwise waits for each store read in
    turn). Memory: two batches per download, each under `BATCH` plus one store piece. The
    slot has at most one job at a time: closing after a disconnect runs after the read in
    flight, in the same pool. Closed on the end, on `aclose`, or when dropped unread (a
    response that never started), so the slot and the store connection are always given
    back.
    """

    def __init__(self, pieces: Iterator[bytes], slot: Slot) -> None:
        self._iterator = iter(pieces)
        self._slot = slot
        self._pending: concurrent.futures.Future[list[bytes]] | None = None
        self._ready: deque[bytes] = deque()
        self._closed = False
        close_at_request_end(self._close)

    def __aiter__(self) -> PayloadStream:
        return self

    def _step(self) -> list[bytes]:
        """The next batch of pieces; an empty list at the end."""
        batch: list[bytes] = []
        size = 0
        for piece in self._iterator:
            if piece:
                batch.append(piece)
                size += len(piece)
                if size >= BATCH:
                    break
        if batch:
            self._slot.touch()
        return batch

    async def __anext__(self) -> bytes:
        if self._ready:
            return self._ready.popleft()
        if self._closed:
            raise StopAsyncIteration
        if self._pending is None:
            self._pending = self._slot.submit(self._step)
        try:
            batch = await asyncio.wrap_future(self._pending)
        except BaseException:
            self._close()
            raise
        if not batch:
            self._pending = None
            self._close()
            raise StopAsyncIteration
        self._pending = self._slot.submit(self._step)
        self._ready.extend(batch)
        return self._ready.popleft()

    async def aclose(self) -> None:
        self._close()

    def _close(self) -> None:
        """Close the store iterator after any read in flight; never blocks the loop."""
        if self._closed:
            return
        self._closed = True
        self._ready.clear()
        pending, self._pending = self._pending, None

        def close_now(_: object = None) -> None:
            try:
                job = self._slot.submit(self._close_iterator)
            except RuntimeError:  # the pool is shut down: the process is ending
                self._slot.release()
                return
            job.add_done_callback(lambda _: self._slot.release())

        if pending is None or pending.done():
            close_now()
        else:
            pending.add_done_callback(close_now)

    def _close_iterator(self) -> None:
        closer = getattr(self._iterator, "close", None)
        if closer is not None:
            closer()

    def __del__(self) -> None:
        self._close()


def read_on_loop(body: AsyncBody, slot: Slot) -> AsyncIterator[bytes | memoryview]:
    """A body the event loop reads itself (`SupportsAsyncRead`): each piece marks the
    slot's progress; closed at its end, on a store error, or when the request ends (a
    client gone mid-download), which gives back the store connection and then the slot."""
    body.on_close(slot.release)
    body.on_piece(slot.touch)
    close_at_request_end(body.close)
    return body
