"""ADR 23 reassembly: chunks in any order and duplicated in, whole verified messages out.

Pure: no paho, no clock (callers pass `now`). Bytes live in an injected :class:`ChunkStore`;
the default keeps them in memory, :class:`client._chunkstore.SpoolingChunkStore` moves large
messages to temporary files so that reassembling a multi-gigabyte message needs no RAM for it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from ._chunk import CHUNK_PROPERTY, MAX_U32, ChunkHeader, chunk_header
from ._chunkstores import (
    ChunkStore,
    Joined,
    JoiningChunkStore,
    MemoryChunkStore,
    PartialKey,
)
from ._errors import (
    ChecksumMismatchError,
    ChunkBufferOverflow,
    ChunkError,
    ChunkTimeoutError,
    MalformedChunk,
)
from ._props import PublishProperties

__all__ = [
    "CHUNK_ENTRY_COST",
    "ChunkMessage",
    "ChunkStore",
    "Complete",
    "Error",
    "Joined",
    "JoiningChunkStore",
    "MemoryChunkStore",
    "Outcome",
    "PartialKey",
    "Pending",
    "Reassembler",
    "chunk_bounds",
]


class ChunkMessage(Protocol):
    """What :meth:`Reassembler.feed` reads from a received message."""

    @property
    def topic(self) -> str: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def properties(self) -> PublishProperties: ...
    @property
    def qos(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Complete:
    """All chunks arrived and the checksum matched: the original message."""

    topic: str
    payload: bytes | Path
    """The bytes, or the file a spooling store assembled them in (the caller owns it)."""
    properties: PublishProperties
    """Chunk 0's properties without `__chunk`."""
    message_id: str
    qos: int
    dropped: tuple[Error, ...] = ()
    """Other partial messages evicted to make room for this chunk."""
    sha256: str = ""
    """SHA-256 of the payload, lower-case hex (verified)."""
    size: int = 0
    """Payload length in bytes."""


@dataclass(frozen=True, slots=True)
class Pending:
    """The chunk was kept (or ignored as a duplicate); the message is not complete yet."""

    topic: str
    message_id: str
    index: int
    received: int
    """Distinct chunks of this message buffered so far (0 for a late duplicate)."""
    total: int | None
    """None until chunk 0 has arrived."""
    duplicate: bool = False
    """True when the chunk was already buffered or its message already finished."""
    dropped: tuple[Error, ...] = ()


@dataclass(frozen=True, slots=True)
class Error:
    """A chunked message failed; its buffers are gone and its later chunks will be ignored."""

    topic: str
    message_id: str | None
    """None when the `__chunk` value itself was unreadable."""
    error: ChunkError | MalformedChunk
    dropped: tuple[Error, ...] = ()


Outcome = Complete | Pending | Error

#: Smallest chunk payload assumed of a sender when bounding chunks per message: brokers that
#: need chunking state limits of 64 KiB and more, and ADR 23 fills every chunk but the last.
CHUNK_SIZE_FLOOR = 64 * 1024
#: Headroom for a chunk's own PUBLISH header and properties within the packet limit.
CHUNK_HEADROOM = 1024
#: RAM charged per tracked chunk entry (index set, store slot, spool span) when deriving
#: how many entries the RAM budget allows.
CHUNK_ENTRY_COST = 256


def chunk_bounds(*, max_buffered_bytes: int, packet_limit: int, ram_budget: int) -> tuple[int, int]:
    """Chunks per message and chunk entries in all, derived from the limits in force.

    A message larger than `max_buffered_bytes` is dropped anyway, and a sender filling its
    chunks to the packet limit (or at least to :data:`CHUNK_SIZE_FLOOR`) needs no more than
    `max_buffered_bytes / chunk size + 1` of them. Chunk bookkeeping lives in RAM whatever
    the store does with the bytes, so entries across all partial messages are bounded by the
    RAM budget at :data:`CHUNK_ENTRY_COST` bytes each, and one message can never have more
    chunks than that either (a tiny packet limit then needs a larger RAM budget).

    Args:
        max_buffered_bytes: the reassembly byte bound.
        packet_limit: the Maximum Packet Size in force.
        ram_budget: bytes of RAM reassembly may use (the client's `spool_threshold`).

    Returns:
        `(max_chunks_per_message, max_tracked_chunks)`.
    """
    chunk = max(min(packet_limit, CHUNK_SIZE_FLOOR) - CHUNK_HEADROOM, 1)
    tracked = max(ram_budget // CHUNK_ENTRY_COST, 1)
    per_message = min(-(-max_buffered_bytes // chunk) + 1, tracked, MAX_U32)
    return per_message, tracked


@dataclass(slots=True)
class _Partial:
    topic: str
    message_id: str
    started: float
    deadline: float | None
    indices: set[int] = field(default_factory=set)
    nbytes: int = 0
    first: ChunkHeader | None = None
    first_properties: PublishProperties | None = None
    qos: int = 0


class Reassembler:
    """Collects ADR 23 chunks and hands back whole messages (sans-I/O; the caller owns time).

    Chunks are buffered per (topic, messageId) and index, in any arrival order; duplicates
    (QoS 1 redelivery) are ignored. A message is complete when chunk 0 has told the total and
    every index below it arrived; its SHA-256 must match or the payload is never returned.

    Timeout: counted from the first chunk seen for a message. Until chunk 0 arrives, and when
    chunk 0 has no Message Expiry Interval, it is `default_timeout`; once chunk 0 arrives with
    an interval, it is that interval (ADR 23). A message whose deadline has passed fails on its
    next chunk or at the next :meth:`expire` sweep, whichever comes first, so results do not
    depend on how often the caller sweeps.

    Bounds: every structure that a sender can grow is bounded, not only payload bytes (a
    chunk 0 declaring 2**32-1 chunks followed by empty chunks costs no payload but one entry
    per chunk):

    * at most `max_partial_messages` incomplete messages;
    * at most `max_buffered_bytes` of buffered payload;
    * at most `max_chunks_per_message` chunks in one message: a chunk 0 declaring more, or a
      chunk whose index is beyond it, fails that message at once;
    * at most `max_tracked_chunks` chunk entries across all partial messages;
    * a chunk 0's Message Expiry Interval counts for at most `max_timeout` seconds;
    * the last `remember_finished` finished ids.

    Making room evicts the oldest *other* partial messages first; a message that cannot fit
    even alone is dropped itself. Every eviction is reported as a ChunkBufferOverflow.

    Messages that completed or failed are remembered (the last `remember_finished` of them) so
    their late chunks are ignored instead of opening a partial that would time out.

    Not thread-safe: the adapter feeds it from one thread (paho's network loop, or a queue).
    """

    def __init__(
        self,
        *,
        default_timeout: float | None = 300.0,
        max_partial_messages: int = 64,
        max_buffered_bytes: int = 64 * 1024 * 1024,
        remember_finished: int = 1024,
        store: ChunkStore | None = None,
        max_chunks_per_message: int | None = None,
        max_tracked_chunks: int | None = None,
        max_timeout: float | None = None,
    ) -> None:
        """Make an empty reassembler.

        Args:
            default_timeout: seconds allowed for a message whose chunk 0 has not arrived or has
                no Message Expiry Interval; None waits forever (ADR 23's "forever message",
                bounded only by the buffer limits).
            max_partial_messages: incomplete messages kept at once.
            max_buffered_bytes: chunk payload bytes kept at once.
            remember_finished: how many finished message ids to remember for ignoring late
                duplicates.
            store: where chunk bytes are kept; in memory by default.
            max_chunks_per_message: most chunks one message may have (None: 2**32-1, as
                ADR 23 allows); see :func:`chunk_bounds` for a value derived from the limits.
            max_tracked_chunks: most chunk entries kept across all partial messages (None:
                `max_buffered_bytes`, i.e. one byte per entry at least).
            max_timeout: most seconds a chunk 0's Message Expiry Interval may extend a
                message's deadline to (None: no cap).
        """
        if default_timeout is not None and default_timeout < 0:
            raise ValueError("default_timeout must not be negative")
        if max_partial_messages < 1 or max_buffered_bytes < 1 or remember_finished < 0:
            raise ValueError("reassembly bounds must be positive")
        if (max_chunks_per_message is not None and max_chunks_per_message < 1) or (
            max_tracked_chunks is not None and max_tracked_chunks < 1
        ):
            raise ValueError("chunk count bounds must be positive")
        if max_timeout is not None and max_timeout < 0:
            raise ValueError("max_timeout must not be negative")
        self.max_chunks_per_message = max_chunks_per_message or MAX_U32
        self.max_tracked_chunks = max_tracked_chunks or max_buffered_bytes
        self._max_timeout = max_timeout
        self._default_timeout = default_timeout
        self._max_partials = max_partial_messages
        self._max_bytes = max_buffered_bytes
        self._remember = remember_finished
        self._store: ChunkStore = store if store is not None else MemoryChunkStore()
        self._partials: OrderedDict[PartialKey, _Partial] = OrderedDict()  # oldest first
        self._finished: OrderedDict[PartialKey, None] = OrderedDict()
        self._bytes = 0
        self._tracked = 0

    @property
    def partial_messages(self) -> int:
        """Incomplete messages currently buffered."""
        return len(self._partials)

    @property
    def buffered_bytes(self) -> int:
        """Chunk payload bytes currently buffered."""
        return self._bytes

    @property
    def tracked_chunks(self) -> int:
        """Chunk entries currently kept across all partial messages."""
        return self._tracked

    @property
    def next_deadline(self) -> float | None:
        """The earliest time at which :meth:`expire` has something to do, or None."""
        deadlines = [p.deadline for p in self._partials.values() if p.deadline is not None]
        return min(deadlines, default=None)

    def feed(self, message: ChunkMessage, now: float) -> Outcome:
        """Take one received chunk.

        Args:
            message: the received PUBLISH; its user properties must include `__chunk`.
            now: the current time in seconds, from a monotonic clock.

        Raises:
            ValueError: the message carries no `__chunk` property (check with
                :func:`chunk_header` first).
        """
        topic = message.topic
        try:
            header = chunk_header(message.properties)
        except MalformedChunk as exc:
            return Error(topic, None, exc)
        if header is None:
            raise ValueError(f"message on {topic!r} has no {CHUNK_PROPERTY} user property")
        key = (topic, header.message_id)
        if key in self._finished:
            return Pending(topic, header.message_id, header.index, 0, None, duplicate=True)

        dropped: list[Error] = []
        partial = self._partials.get(key)
        bound = self.max_chunks_per_message
        declared = header.total if header.total is not None else header.index + 1
        if declared > bound:
            reason = f"{declared} chunks or more, beyond the bound of {bound} per message"
            if partial is not None:
                return self._overflow(key, reason, dropped)
            self._remember_finished(key)
            error = ChunkBufferOverflow(header.message_id, reason)
            return Error(topic, header.message_id, error)
        if partial is None:
            if len(self._partials) >= self._max_partials:
                dropped.append(
                    self._evict_oldest(f"more than {self._max_partials} partial messages")
                )
            deadline = None if self._default_timeout is None else now + self._default_timeout
            partial = _Partial(topic, header.message_id, now, deadline)
            self._partials[key] = partial
        elif self._overdue(partial, now):
            return self._timeout(key, partial, dropped)

        if header.index in partial.indices:
            if header.is_first and header != partial.first:
                return self._malformed(key, "conflicting first chunks", dropped)
            return self._pending(partial, header.index, dropped, duplicate=True)

        if header.is_first:
            partial.first = header
            partial.first_properties = message.properties.without_user_properties(CHUNK_PROPERTY)
            partial.qos = message.qos
            expiry = message.properties.message_expiry_interval
            if expiry is not None:
                cap = self._max_timeout
                partial.deadline = partial.started + (expiry if cap is None else min(expiry, cap))
            if self._overdue(partial, now):
                return self._timeout(key, partial, dropped)
        first = partial.first
        total = first.total if first is not None else None
        # Indices buffered before chunk 0 are checked once, when it tells the total.
        if total is not None and (
            header.index >= total or (header.is_first and max(partial.indices, default=0) >= total)
        ):
            return self._malformed(key, f"chunk index beyond totalChunks {total}", dropped)

        data = bytes(message.payload)
        while self._bytes + len(data) > self._max_bytes:
            victim = next((k for k in self._partials if k != key), None)
            if victim is None:
                reason = f"{partial.nbytes + len(data)} bytes exceed {self._max_bytes}"
                return self._overflow(key, reason, dropped)
            dropped.append(self._evict(victim, f"buffer limit of {self._max_bytes} bytes"))
        while self._tracked >= self.max_tracked_chunks:
            victim = next((k for k in self._partials if k != key), None)
            reason = f"more than {self.max_tracked_chunks} chunks tracked"
            if victim is None:
                return self._overflow(key, reason, dropped)
            dropped.append(self._evict(victim, reason))
        self._store.put(key, header.index, data)
        partial.indices.add(header.index)
        partial.nbytes += len(data)
        self._bytes += len(data)
        self._tracked += 1

        if first is not None and len(partial.indices) == first.total:
            return self._assemble(key, partial, first, dropped)
        return self._pending(partial, header.index, dropped, duplicate=False)

    def expire(self, now: float) -> list[Error]:
        """Drop every partial message whose deadline has passed.

        Args:
            now: the current time, same clock as :meth:`feed`.

        Returns:
            One ChunkTimeoutError per dropped message, oldest first.
        """
        overdue = [k for k, p in self._partials.items() if self._overdue(p, now)]
        return [self._timeout(k, self._partials[k], []) for k in overdue]

    # -- internals

    @staticmethod
    def _overdue(partial: _Partial, now: float) -> bool:
        return partial.deadline is not None and now > partial.deadline

    def _pending(
        self, partial: _Partial, index: int, dropped: list[Error], *, duplicate: bool
    ) -> Pending:
        total = partial.first.total if partial.first is not None else None
        return Pending(
            partial.topic,
            partial.message_id,
            index,
            len(partial.indices),
            total,
            duplicate=duplicate,
            dropped=tuple(dropped),
        )

    def _forget(self, key: PartialKey) -> _Partial:
        partial = self._partials.pop(key)
        self._store.discard(key)
        self._bytes -= partial.nbytes
        self._tracked -= len(partial.indices)
        self._remember_finished(key)
        return partial

    def _remember_finished(self, key: PartialKey) -> None:
        if self._remember:
            self._finished[key] = None
            while len(self._finished) > self._remember:
                self._finished.popitem(last=False)

    def _evict(self, key: PartialKey, reason: str) -> Error:
        partial = self._forget(key)
        return Error(
            partial.topic, partial.message_id, ChunkBufferOverflow(partial.message_id, reason)
        )

    def _evict_oldest(self, reason: str) -> Error:
        return self._evict(next(iter(self._partials)), reason)

    def _timeout(self, key: PartialKey, partial: _Partial, dropped: list[Error]) -> Error:
        total = partial.first.total if partial.first is not None else None
        self._forget(key)
        error = ChunkTimeoutError(partial.message_id, len(partial.indices), total)
        return Error(partial.topic, partial.message_id, error, tuple(dropped))

    def _overflow(self, key: PartialKey, reason: str, dropped: list[Error]) -> Error:
        error = self._evict(key, reason)
        return replace(error, dropped=tuple(dropped))

    def _malformed(self, key: PartialKey, reason: str, dropped: list[Error]) -> Error:
        partial = self._forget(key)
        error = MalformedChunk(f"chunked message {partial.message_id}: {reason}")
        return Error(partial.topic, partial.message_id, error, tuple(dropped))

    def _assemble(
        self, key: PartialKey, partial: _Partial, first: ChunkHeader, dropped: list[Error]
    ) -> Outcome:
        expected = str(first.checksum)
        count = len(partial.indices)
        if isinstance(self._store, JoiningChunkStore):
            joined = self._store.join(key, count, expected)
        else:
            data = b"".join(list(self._store.take(key, count)))
            actual = hashlib.sha256(data).hexdigest()
            joined = Joined(actual, len(data), data if actual == expected else None)
        self._forget(key)
        if joined.sha256 != expected:
            error = ChecksumMismatchError(partial.message_id, expected, joined.sha256)
            return Error(partial.topic, partial.message_id, error, tuple(dropped))
        payload: bytes | Path
        if joined.path is not None:
            payload = joined.path
        else:
            assert joined.data is not None, "a ChunkStore returned a match without bytes"
            payload = joined.data
        return Complete(
            partial.topic,
            payload,
            partial.first_properties or PublishProperties(),
            partial.message_id,
            partial.qos,
            tuple(dropped),
            joined.sha256,
            joined.size,
        )
