"""Hand a streamed request body from the event loop to a blocking store upload.

The store (MinIO SDK) pulls with `read(n)` in a worker thread; the route pushes body pieces
from the event loop. Pieces are batched to about 1 MiB before crossing threads so the
per-byte cost stays small, the queue is bounded so memory is too, and the SHA-256 is taken
in the worker thread as the bytes go by: one pass, off the event loop.

Copies cost as much as hashing here (bench/RESULTS.md): immutable pieces (uvicorn's body
`bytes` and the envelope parser's views of them) cross as they are, and the only copy is
the join into the block `read(n)` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import queue
from typing import BinaryIO, cast

from .storage import ObjectStore, StoreError

PIECE = 1024 * 1024
_EOF: list[bytes | memoryview] = []  # an empty batch ends the stream

Buffer = bytes | bytearray | memoryview


class _Aborted(Exception):
    pass


def _frozen(data: Buffer) -> bytes | memoryview:
    """`data` itself when nobody can change it later, else a private copy."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, memoryview) and isinstance(data.obj, bytes):
        return data
    return bytes(data)


class PipeReader:
    """The worker-thread end: a minimal binary file for `ObjectStore.put_stream`."""

    def __init__(self, depth: int = 4) -> None:
        self._queue: queue.Queue[list[bytes | memoryview] | BaseException] = queue.Queue(
            maxsize=depth
        )
        self._pieces: list[bytes | memoryview] = []
        self._eof = False
        self.sha256 = hashlib.sha256()
        self.count = 0
        self.closed_by_reader = False

    def read(self, n: int = -1) -> bytes:
        out: list[bytes | memoryview] = []
        wanted = n if n is not None and n >= 0 else None
        got = 0
        while (wanted is None or got < wanted) and not self._eof:
            if not self._pieces:
                item = self._queue.get()
                if isinstance(item, BaseException):
                    self._eof = True
                    raise _Aborted(str(item)) from item
                if not item:
                    self._eof = True
                    break
                self._pieces = item
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
        self.count += len(data)
        return data

    def offer(self, item: list[bytes | memoryview] | BaseException) -> bool:
        """Non-blocking put from the event loop; False when the queue is full."""
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            return False
        return True

    def put(self, item: list[bytes | memoryview] | BaseException) -> None:
        """Blocking put from a helper thread; gives up when the reader has stopped."""
        while True:
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                if self.closed_by_reader:
                    return


class StreamingUpload:
    """One payload being written to the store while its bytes arrive."""

    def __init__(self, store: ObjectStore, key: str, length: int, content_type: str | None) -> None:
        self.key = key
        self.length = length
        self._reader = PipeReader()
        self._batch: list[bytes | memoryview] = []
        self._batched = 0
        self._task = asyncio.ensure_future(asyncio.to_thread(self._run, store, content_type))

    def _run(self, store: ObjectStore, content_type: str | None) -> None:
        try:
            store.put_stream(self.key, cast(BinaryIO, self._reader), self.length, content_type)
        finally:
            self._reader.closed_by_reader = True

    async def write(self, data: Buffer) -> None:
        if not data:
            return
        self._batch.append(_frozen(data))
        self._batched += len(data)
        if self._batched >= PIECE:
            await self._hand_over()

    async def _hand_over(self) -> None:
        batch, self._batch, self._batched = self._batch, [], 0
        if self._task.done():
            await self._task  # raises the store's error
            raise StoreError(f"upload of {self.key!r} stopped early")
        await self._put(batch)

    async def _put(self, item: list[bytes | memoryview] | BaseException) -> None:
        # A thread hop only when the queue is full (the store is the slow side).
        if not self._reader.offer(item):
            await asyncio.to_thread(self._reader.put, item)

    async def finish(self) -> tuple[str, int]:
        """Flush, wait for the store; the payload's SHA-256 hex and size."""
        if self._batch:
            await self._hand_over()
        await self._put(_EOF)
        await self._task
        return self._reader.sha256.hexdigest(), self._reader.count

    async def abort(self, reason: BaseException) -> None:
        """Stop the upload; the store discards what it had (no partial object appears)."""
        if not self._task.done():
            await self._put(reason)
        # The abort we asked for, or the store's own error: either way nothing was stored.
        with contextlib.suppress(Exception):
            await self._task
