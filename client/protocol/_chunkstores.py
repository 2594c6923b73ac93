"""Where the reassembler keeps chunk bytes: the store interface and the in-memory store. Pure.

The reassembler (:mod:`client.protocol._reassembly`) keeps all bookkeeping itself and uses a
store only for bytes, so a store that spools to disk (:mod:`client.receive._chunkstore`) can replace
the memory one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

PartialKey = tuple[str, str]
"""(topic, message id): chunks of one message share both."""


@dataclass(frozen=True, slots=True)
class Joined:
    """A message's chunks joined in order, as :meth:`ChunkStore.join` returns them.

    Exactly one of `data` (in memory) and `path` (a file the caller now owns) is set when the
    checksum matched; neither when it did not (the store has already deleted what it built).
    """

    sha256: str
    """The actual SHA-256 of the joined bytes, lower-case hex."""
    size: int
    data: bytes | None = None
    path: Path | None = None


class ChunkStore(Protocol):
    """Where buffered chunk payloads live until their message is complete.

    The reassembler keeps all bookkeeping (which indices arrived, byte counts, deadlines) and
    uses the store only for bytes, so a store that spools to disk can replace the memory one.
    """

    def put(self, key: PartialKey, index: int, data: bytes) -> None:
        """Keep chunk `index` of message `key` (never called twice for the same index)."""

    def take(self, key: PartialKey, count: int) -> Iterator[bytes]:
        """Yield chunks 0..count-1 of `key` in order, forgetting each once yielded."""

    def discard(self, key: PartialKey) -> None:
        """Forget everything about `key` (no error if unknown)."""


@runtime_checkable
class JoiningChunkStore(ChunkStore, Protocol):
    """A :class:`ChunkStore` that also joins a finished message itself (e.g. in a file).

    A store without :meth:`join` is joined through :meth:`ChunkStore.take`, in memory.
    """

    def join(self, key: PartialKey, count: int, expected_sha256: str) -> Joined:
        """Join chunks 0..count-1 of `key` in order, hash them and forget `key`.

        Args:
            key: the message.
            count: how many chunks it has (all present).
            expected_sha256: the checksum chunk 0 announced; on a mismatch the store keeps
                nothing and returns a :class:`Joined` with neither data nor path.
        """


class MemoryChunkStore:
    """The default :class:`ChunkStore`: a dict of dicts."""

    def __init__(self) -> None:
        self._chunks: dict[PartialKey, dict[int, bytes]] = {}

    def put(self, key: PartialKey, index: int, data: bytes) -> None:
        self._chunks.setdefault(key, {})[index] = data

    def take(self, key: PartialKey, count: int) -> Iterator[bytes]:
        chunks = self._chunks.get(key, {})
        for index in range(count):
            yield chunks.pop(index)

    def join(self, key: PartialKey, count: int, expected_sha256: str) -> Joined:
        chunks = self._chunks.pop(key, {})
        data = b"".join([chunks[i] for i in range(count)])
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected_sha256:
            return Joined(actual, len(data))
        return Joined(actual, len(data), data=data)

    def discard(self, key: PartialKey) -> None:
        self._chunks.pop(key, None)
