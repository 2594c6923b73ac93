"""A chunk store for the reassembler that moves large messages to temporary files.

The reassembler (:mod:`client.protocol._reassembly`) is pure and keeps chunk bytes in an
injected store. This one keeps them in memory while the total stays under `memory_limit`;
past it, the partial message holding the most bytes is written to a temporary file and its
later chunks are appended there, so RAM stays bounded whatever the message sizes.

Chunks from one publisher arrive in order, so a spool file usually *is* the reassembled
payload: it is hashed while it grows and handed to the application without a copy. Chunks
that arrived out of order are copied once into a new file in index order.

Not thread-safe, like the reassembler it serves (the client's worker thread owns both).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..protocol._reassembly import Joined, PartialKey

_COPY = 1 << 20


@dataclass(slots=True)
class _Spool:
    path: Path
    file: BinaryIO
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> offset, length
    end: int = 0
    in_order: bool = True  # written as chunks 0, 1, 2, ... so far
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)

    def append(self, index: int, data: bytes) -> None:
        self.file.seek(self.end)
        self.file.write(data)
        self.spans[index] = (self.end, len(data))
        self.end += len(data)
        self.in_order = self.in_order and index == len(self.spans) - 1
        if self.in_order:
            self.digest.update(data)

    def read(self, index: int) -> bytes:
        offset, length = self.spans[index]
        self.file.seek(offset)
        return self.file.read(length)

    def remove(self) -> None:
        self.file.close()
        self.path.unlink(missing_ok=True)


class SpoolingChunkStore:
    """Chunk bytes in memory up to `memory_limit` in total, in temporary files beyond.

    Args:
        memory_limit: bytes of chunk payload kept in RAM across all partial messages.
        directory: where spool files are made (default: the system temp directory).
    """

    def __init__(
        self, *, memory_limit: int, directory: str | os.PathLike[str] | None = None
    ) -> None:
        if memory_limit < 0:
            raise ValueError("memory_limit must not be negative")
        self._limit = memory_limit
        self._dir = directory
        self._memory: dict[PartialKey, dict[int, bytes]] = {}
        self._sizes: dict[PartialKey, int] = {}
        self._in_memory = 0
        self._spools: dict[PartialKey, _Spool] = {}

    @property
    def memory_bytes(self) -> int:
        """Chunk bytes currently held in RAM."""
        return self._in_memory

    @property
    def spooled_messages(self) -> int:
        """Partial messages currently kept in files."""
        return len(self._spools)

    def put(self, key: PartialKey, index: int, data: bytes) -> None:
        spool = self._spools.get(key)
        if spool is not None:
            spool.append(index, data)
            return
        self._memory.setdefault(key, {})[index] = data
        self._sizes[key] = self._sizes.get(key, 0) + len(data)
        self._in_memory += len(data)
        while self._in_memory > self._limit and self._sizes:
            # The biggest message goes to disk: it frees the most RAM per file.
            self._spool(max(self._sizes, key=self._sizes.__getitem__))

    def _spool(self, key: PartialKey) -> None:
        fd, name = tempfile.mkstemp(prefix="offload-chunks-", suffix=".payload", dir=self._dir)
        spool = _Spool(Path(name), os.fdopen(fd, "w+b"))
        try:
            for index, data in sorted(self._memory.pop(key).items()):
                spool.append(index, data)
        except BaseException:
            spool.remove()
            raise
        self._in_memory -= self._sizes.pop(key)
        self._spools[key] = spool

    def take(self, key: PartialKey, count: int) -> Iterator[bytes]:
        spool = self._spools.get(key)
        if spool is not None:
            for index in range(count):
                yield spool.read(index)
            self.discard(key)
            return
        chunks = self._memory.get(key, {})
        for index in range(count):
            data = chunks.pop(index)
            self._sizes[key] -= len(data)
            self._in_memory -= len(data)
            yield data
        self.discard(key)

    def join(self, key: PartialKey, count: int, expected_sha256: str) -> Joined:
        spool = self._spools.pop(key, None)
        if spool is None:
            chunks = self._memory.pop(key, {})
            self._in_memory -= self._sizes.pop(key, 0)
            data = b"".join([chunks[i] for i in range(count)])
            actual = hashlib.sha256(data).hexdigest()
            return Joined(actual, len(data), data if actual == expected_sha256 else None)
        if not (spool.in_order and len(spool.spans) == count):
            spool = self._reorder(spool, count)
        spool.file.close()
        actual = spool.digest.hexdigest()
        if actual != expected_sha256:
            spool.remove()
            return Joined(actual, spool.end)
        return Joined(actual, spool.end, path=spool.path)

    def _reorder(self, spool: _Spool, count: int) -> _Spool:
        fd, name = tempfile.mkstemp(prefix="offload-chunks-", suffix=".payload", dir=self._dir)
        ordered = _Spool(Path(name), os.fdopen(fd, "w+b"))
        try:
            for index in range(count):
                ordered.append(index, spool.read(index))
        except BaseException:
            ordered.remove()
            raise
        finally:
            spool.remove()
        return ordered

    def discard(self, key: PartialKey) -> None:
        spool = self._spools.pop(key, None)
        if spool is not None:
            spool.remove()
        self._memory.pop(key, None)
        self._in_memory -= self._sizes.pop(key, 0)

    def close(self) -> None:
        """Delete every spool file of partial messages (the client is closing)."""
        for key in list(self._spools):
            self.discard(key)
