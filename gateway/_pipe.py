"""Hand a streamed request body from the event loop to a blocking store upload.

The store (MinIO SDK) pulls with `read(n)` in a worker thread; the route pushes body pieces
from the event loop. Pieces are coalesced to about 1 MiB before crossing threads so the
per-byte cost stays small, the queue is bounded so memory is too, and the SHA-256 is taken
in the worker thread as the bytes go by: one pass, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import queue
from typing import BinaryIO, cast

from .storage import ObjectStore, StoreError

PIECE = 1024 * 1024
_EOF = b""


class _Aborted(Exception):
    pass


class PipeReader:
    """The worker-thread end: a minimal binary file for `ObjectStore.put_stream`."""

    def __init__(self, depth: int = 4) -> None:
        self._queue: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=depth)
        self._current = memoryview(b"")
        self._eof = False
        self.sha256 = hashlib.sha256()
        self.count = 0
        self.closed_by_reader = False

    def read(self, n: int = -1) -> bytes:
        out: list[bytes | memoryview] = []
        wanted = n if n is not None and n >= 0 else None
        got = 0
        while (wanted is None or got < wanted) and not self._eof:
            if not self._current:
                item = self._queue.get()
                if isinstance(item, BaseException):
                    self._eof = True
                    raise _Aborted(str(item)) from item
                if not item:
                    self._eof = True
                    break
                self._current = memoryview(item)
            take = len(self._current) if wanted is None else min(wanted - got, len(self._current))
            out.append(self._current[:take])
            self._current = self._current[take:]
            got += take
        data = bytes(out[0]) if len(out) == 1 else b"".join(out)
        self.sha256.update(data)
        self.count += len(data)
        return data

    def put(self, item: bytes | BaseException) -> None:
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
        self._buffer = bytearray()
        self._task = asyncio.ensure_future(asyncio.to_thread(self._run, store, content_type))

    def _run(self, store: ObjectStore, content_type: str | None) -> None:
        try:
            store.put_stream(self.key, cast(BinaryIO, self._reader), self.length, content_type)
        finally:
            self._reader.closed_by_reader = True

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data
        if len(self._buffer) >= PIECE:
            await self._hand_over()

    async def _hand_over(self) -> None:
        piece = bytes(self._buffer)
        self._buffer.clear()
        if self._task.done():
            await self._task  # raises the store's error
            raise StoreError(f"upload of {self.key!r} stopped early")
        await asyncio.to_thread(self._reader.put, piece)

    async def finish(self) -> tuple[str, int]:
        """Flush, wait for the store; the payload's SHA-256 hex and size."""
        if self._buffer:
            await self._hand_over()
        await asyncio.to_thread(self._reader.put, _EOF)
        await self._task
        return self._reader.sha256.hexdigest(), self._reader.count

    async def abort(self, reason: BaseException) -> None:
        """Stop the upload; the store discards what it had (no partial object appears)."""
        if not self._task.done():
            await asyncio.to_thread(self._reader.put, reason)
        # The abort we asked for, or the store's own error: either way nothing was stored.
        with contextlib.suppress(Exception):
            await self._task
