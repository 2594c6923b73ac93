"""Hand a streamed request body from the event loop to a blocking store upload.

The store (MinIO SDK) pulls with `read(n)` in a transfer thread (`gateway.core._executors`);
the route pushes body pieces from the event loop. Pieces are batched to about 1 MiB before
crossing threads so the per-byte cost stays small, the hand-over is bounded so memory is
too, and the SHA-256 and the CRC-32C are taken in the transfer thread as the bytes go by: one
pass, off the event loop. The CRC-32C (`google_crc32c`, hardware accelerated, ~10 GiB/s
against SHA-256's ~1.7) goes into the manifest so readers that trust the store, such as the
Spark source, can check a payload for corruption at a sixth of the cost; it releases the GIL
for `bytes` of 1 MiB or more, which is what `read(n)` hands the SDK.

The feeding side never needs a thread: when the hand-over is full the event loop waits on
an asyncio future that the transfer thread resolves once it has taken a batch. (It used
to hop to a thread of the same pool the consumer held, which is how a few concurrent
uploads wedged the gateway.) Every wait is bounded: the loop waits at most
`store_timeout` for the store to take a batch or finish, the transfer thread waits at most
the body idle timeout (plus slack) for the next batch, and an abort never blocks.

Copies cost as much as hashing here (bench/RESULTS.md): immutable pieces (uvicorn's body
`bytes` and the envelope parser's views of them) cross as they are, and the only copy is
the join into the block `read(n)` returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import BinaryIO, cast

from ..core import StorageUnavailable, Transfers
from ..middleware import RequestTimeout
from ..storage import (
    ObjectStore,
    StoreError,
    crc32c_available,
    crc32c_combine,
    crc32c_extend,
)

#: Bytes that make a batch: one body piece as the gateway reads it (up to 1 MiB - 4 KiB,
#: `gateway.middleware.READ_SIZE`) or several smaller ones, about 1 MiB in all, never two
#: whole reads (a pipe's `depth` counts batches).
BATCH = 960 * 1024
FLUSH_INTERVAL = 1.0  # seconds: a slow body still reaches the store at least this often
QUIET_TRANSFERS = 4  # at most this many in flight: an upload's pipe holds 4 batches, else 2
_EOF: list[bytes | memoryview] = []  # an empty batch ends the stream
_SLACK = 5.0  # seconds the transfer thread waits beyond the body idle timeout
# Without its C extension google_crc32c falls back to pure Python at a few MB/s: the gateway
# then records no CRC-32C (the manifest field is optional) rather than crawl.
_CRC_IN_C = crc32c_available


def crc32c_update(crc: int, data: bytes | bytearray | memoryview) -> int:
    """`crc` extended by `data` (a no-op without the C extension, see `crc32c_text`)."""
    return crc32c_extend(crc, data)


def crc32c_text(crc: int) -> str | None:
    """The manifest's form of a CRC-32C: 8 lowercase hex digits; None when none was taken."""
    return f"{crc:08x}" if _CRC_IN_C else None


Buffer = bytes | bytearray | memoryview
Batch = list[bytes | memoryview]


class _Aborted(Exception):
    pass


class _Idle(_Aborted):
    """The transfer thread waited longer than any body may stall."""


class _StoreStalled(Exception):
    pass


def _frozen(data: Buffer) -> bytes | memoryview:
    """`data` itself when nobody can change it later, else a private copy."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, memoryview) and isinstance(data.obj, bytes):
        return data
    return bytes(data)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class PipeReader:
    """The transfer-thread end: a minimal binary file for `ObjectStore.put_stream`.

    Args:
        loop: the event loop that feeds it.
        idle_timeout: seconds `read` waits for the next batch before giving up.
        on_progress: called (in the transfer thread) whenever a batch is taken.
        depth: batches held at most (about `depth` MiB).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        idle_timeout: float,
        on_progress: Callable[[], None] = lambda: None,
        depth: int = 4,
    ) -> None:
        self._loop = loop
        self._idle_timeout = idle_timeout
        self._on_progress = on_progress
        self._depth = depth
        self._cond = threading.Condition()
        self._batches: deque[Batch] = deque()
        self._error: BaseException | None = None
        self._space: asyncio.Future[None] | None = None  # the loop waits for room
        self._pieces: Batch = []
        self._eof = False
        self.sha256 = hashlib.sha256()
        self.crc32c = 0
        self.count = 0
        self.closed_by_reader = False

    # -- transfer thread ------------------------------------------------------------------

    def read(self, n: int = -1) -> bytes:
        out: Batch = []
        wanted = n if n is not None and n >= 0 else None
        got = 0
        while (wanted is None or got < wanted) and not self._eof:
            if not self._pieces:
                batch = self._next_batch()
                if not batch:
                    self._eof = True
                    break
                self._pieces = batch
                self._pieces.reverse()  # pop() from the end is O(1)
            piece = self._pieces.pop()
            take = len(piece) if wanted is None else min(wanted - got, len(piece))
            if take < len(piece):
                self._pieces.append(memoryview(piece)[take:])
                piece = memoryview(piece)[:take]
            out.append(piece)
            got += take
        # The MinIO SDK insists on `bytes`: one join, or the piece itself when it is one.
        data = out[0] if len(out) == 1 and isinstance(out[0], bytes) else b"".join(out)
        self.sha256.update(data)
        self.crc32c = crc32c_update(self.crc32c, data)
        self.count += len(data)
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:
        """Fill `buffer` (blocking until it is full or the body ends); the bytes written."""
        return self.readinto_crc32c(buffer)[0]

    def readinto_crc32c(self, buffer: bytearray | memoryview) -> tuple[int, int | None]:
        """Fill `buffer` (blocking until it is full or the body ends); the bytes written and
        their CRC-32C (None without the C implementation).

        The store's part buffers are filled here without the join `read` makes. The digests
        are taken over the filled block, one pass each: the block's CRC-32C extends the
        object's by `crc32c_combine` and goes on as the part's own (its request header), so
        no byte is checksummed twice.
        """
        target = memoryview(buffer).cast("B")
        wanted = len(target)
        got = 0
        while got < wanted and not self._eof:
            if not self._pieces:
                batch = self._next_batch()
                if not batch:
                    self._eof = True
                    break
                self._pieces = batch
                self._pieces.reverse()  # pop() from the end is O(1)
            piece = self._pieces.pop()
            take = min(wanted - got, len(piece))
            if take < len(piece):
                self._pieces.append(memoryview(piece)[take:])
                piece = memoryview(piece)[:take]
            target[got : got + take] = piece
            got += take
        filled = target[:got]
        self.sha256.update(filled)
        self.count += got
        if not _CRC_IN_C:
            return got, None
        crc = crc32c_update(0, filled)
        self.crc32c = crc32c_combine(self.crc32c, crc, got)
        return got, crc

    def _next_batch(self) -> Batch:
        deadline = time.monotonic() + self._idle_timeout
        with self._cond:
            while not self._batches and self._error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._eof = True
                    raise _Idle(f"no body bytes for {self._idle_timeout:g} seconds")
                self._cond.wait(remaining)
            if self._error is not None:  # an abort wins over batches still queued
                self._eof = True
                # Not chained: the reason's traceback would tie this thread's frames
                # (and the parts they hold) to the request's.
                raise _Aborted(str(self._error)) from None
            batch = self._batches.popleft()
            waiter, self._space = self._space, None
        self._wake(waiter)
        self._on_progress()
        return batch

    def close(self) -> None:
        """The store stopped reading (done or failed): release a waiting feeder at once.

        Drops what is still queued and the abort reason too: the reason's traceback
        reaches the request's frames, which reach this reader, and such a cycle would keep
        megabytes of body alive until the garbage collector happened to look.
        """
        with self._cond:
            self.closed_by_reader = True
            waiter, self._space = self._space, None
            self._batches.clear()
            self._pieces = []
            self._error = None if self._error is None else _Aborted("aborted")
        self._wake(waiter)

    def _wake(self, waiter: asyncio.Future[None] | None) -> None:
        if waiter is not None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                self._loop.call_soon_threadsafe(_resolve, waiter)

    # -- event loop ------------------------------------------------------------------------

    async def put(self, batch: Batch, timeout: float) -> None:
        """Queue a batch, waiting (on the loop, no thread) up to `timeout` for room.

        Returns at once when the reader has stopped: its error surfaces elsewhere.
        """
        deadline = self._loop.time() + timeout
        while True:
            with self._cond:
                if self.closed_by_reader or self._error is not None:
                    return
                if len(self._batches) < self._depth:
                    self._batches.append(batch)
                    self._cond.notify()
                    return
                waiter: asyncio.Future[None] = self._loop.create_future()
                self._space = waiter
            remaining = deadline - self._loop.time()
            try:
                if remaining <= 0:
                    raise TimeoutError
                await asyncio.wait_for(waiter, remaining)
            except TimeoutError:
                raise _StoreStalled from None

    def fail(self, reason: BaseException) -> None:
        """Stop the transfer thread at its next read; never blocks."""
        with self._cond:
            if self._error is None and not self.closed_by_reader:
                self._error = reason
            self._cond.notify_all()


class StreamingUpload:
    """One payload being written to the store while its bytes arrive.

    Takes a transfer slot at once (503 `Saturated` when none is free) and gives it back
    when the transfer thread is done, whatever happened.

    Args:
        store: where the payload goes.
        key: its object key.
        length: bytes expected, -1 when unknown.
        content_type: stored with the object.
        transfers: the admission-controlled transfer pool.
    """

    def __init__(
        self,
        store: ObjectStore,
        key: str,
        length: int,
        content_type: str | None,
        *,
        transfers: Transfers,
    ) -> None:
        self.key = key
        self.length = length
        self._store_timeout = transfers.store_timeout
        slot = transfers.admit()
        loop = asyncio.get_running_loop()
        # Alone, 4 batches keep the body flowing while a part is sent; under load the
        # store sets the pace and the client waits in TCP, not in our memory (issue 31).
        quiet = transfers.active <= QUIET_TRANSFERS
        self._reader = PipeReader(
            loop,
            idle_timeout=transfers.idle_timeout + _SLACK,
            on_progress=slot.touch,
            depth=4 if quiet else 2,
        )
        self._batch: Batch = []
        self._batched = 0
        self._handed = loop.time()
        job = slot.submit(_transfer, store, key, self._reader, length, content_type)
        job.add_done_callback(lambda _: slot.release())  # from the thread: no loop needed
        self._task: asyncio.Future[None] = asyncio.wrap_future(job)
        self._task.add_done_callback(_retrieve)

    async def write(self, data: Buffer) -> None:
        if not data:
            return
        self._batch.append(_frozen(data))
        self._batched += len(data)
        if self._batched >= BATCH or self._task.get_loop().time() - self._handed > FLUSH_INTERVAL:
            await self._hand_over()

    async def _hand_over(self) -> None:
        batch, self._batch, self._batched = self._batch, [], 0
        if self._task.done():
            self._raise_outcome()
            raise StoreError(f"upload of {self.key!r} stopped early")
        await self._put(batch)
        self._handed = self._task.get_loop().time()

    async def _done_within(self, timeout: float) -> bool:
        """Wait for the transfer thread without raising its error (see `_raise_outcome`)."""
        done, _ = await asyncio.wait({self._task}, timeout=timeout)
        return bool(done)

    def _raise_outcome(self) -> None:
        """Raise a fresh error for how the finished transfer thread failed, if it did.

        Never the stored exception itself: raising it here would add this frame (which
        holds `self`, which holds the future, which holds the exception) to its traceback,
        a cycle that keeps the upload's buffers alive until the garbage collector runs.
        """
        exc = self._task.exception()
        if exc is None:
            return
        if isinstance(exc, _Idle):
            raise RequestTimeout(f"request body stalled: {exc}")
        if isinstance(exc, _Aborted):
            raise StorageUnavailable(f"upload of {self.key!r} stopped: {exc}")
        if isinstance(exc, StoreError):
            raise StoreError(str(exc))
        raise StorageUnavailable(f"upload of {self.key!r} failed: {exc!r}")

    async def _put(self, item: Batch) -> None:
        try:
            await self._reader.put(item, self._store_timeout)
        except _StoreStalled:
            self._reader.fail(TimeoutError("object store stalled"))
            raise StorageUnavailable(
                f"object store took no data for {self._store_timeout:g} seconds"
            ) from None

    async def finish(self) -> tuple[str, int]:
        """Flush, wait (bounded) for the store; the payload's SHA-256 hex and size."""
        if self._batch:
            await self._hand_over()
        await self._put(_EOF)
        if not await self._done_within(self._store_timeout):
            self._reader.fail(TimeoutError("object store stalled"))
            raise StorageUnavailable(
                f"object store did not finish the upload within {self._store_timeout:g} seconds"
            )
        self._raise_outcome()
        return self._reader.sha256.hexdigest(), self._reader.count

    @property
    def crc32c(self) -> str | None:
        """The payload's CRC-32C (8 hex digits) once `finish` returned; None without C."""
        return crc32c_text(self._reader.crc32c)

    async def abort(self, reason: BaseException) -> None:
        """Stop the upload; the store discards what it had (no partial object appears).

        Waits for the transfer thread at most the store timeout: a store that hangs
        keeps its slot until its own timeouts end the call, but never this request.
        Either way nothing was stored (the abort asked for, or the store's own error).
        """
        self._reader.fail(reason)
        await self._done_within(self._store_timeout)


def _transfer(
    store: ObjectStore, key: str, reader: PipeReader, length: int, content_type: str | None
) -> None:
    """The transfer thread's job; a function, so its frames never reach the upload."""
    try:
        store.put_stream(key, cast(BinaryIO, reader), length, content_type)
    finally:
        reader.close()


def _retrieve(future: asyncio.Future[None] | concurrent.futures.Future[None]) -> None:
    """Mark a transfer's error as seen (an abandoned one must not log 'never retrieved')
    and drop its traceback: the transfer thread's frames hold whole parts."""
    if not future.cancelled():
        exc = future.exception()
        if exc is not None:
            exc.__traceback__ = None
