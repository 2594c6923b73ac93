"""ADR 23 reassembly: chunks in any order and duplicated in, whole verified messages out.

Pure: no paho, no clock (callers pass `now`). Bytes live in an injected :class:`ChunkStore`;
the default keeps them in memory, :class:`client.receive._chunkstore.SpoolingChunkStore` moves large
messages to temporary files so that reassembling a multi-gigabyte message needs no RAM for it.

This module holds the state machine; its values (`_reassembly_outcomes`) and the derivation of
its chunk-count bounds (`_reassembly_bounds`) have modules of their own, re-exported here.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path

from ._chunk_header import CHUNK_PROPERTY, MAX_U32, ChunkHeader, chunk_header
from ._chunkstores import ChunkStore, Joined, JoiningChunkStore, MemoryChunkStore, PartialKey
from ._errors import ChecksumMismatchError, ChunkBufferOverflow, ChunkTimeoutError, MalformedChunk
from ._props import PublishProperties
from ._reassembly_bounds import CHUNK_ENTRY_COST, chunk_bounds
from ._reassembly_outcomes import ChunkMessage, Complete, Error, Outcome, Pending

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


@dataclass(slots=True)
class _Partial:
    topic: str
    message_id: str
    started: float
    expires: float | None = None  # from chunk 0's Message Expiry Interval, a wall-clock time
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

    Timeout: until chunk 0 arrives, and when chunk 0 has no Message Expiry Interval, a message
    fails after `default_timeout` seconds without progress: counted from its first chunk, or
    from the latest :meth:`keep_waiting` call when that is later (up to `max_timeout` from the
    first chunk). A caller whose source is still delivering, or cannot deliver for now (an
    MQTT session with a backlog in front of the next chunk, or disconnected), says so with
    :meth:`keep_waiting`; one that never calls it gets a plain timeout from the first chunk.
    Once chunk 0 arrives with an interval, the
    deadline is that interval from the first chunk, whatever :meth:`keep_waiting` says (ADR 23:
    the broker discards the message's other chunks once it passed, so waiting longer is
    pointless). A message whose deadline has passed fails on its next chunk or at the next
    :meth:`expire` sweep, whichever comes first, so results do not depend on how often the
    caller sweeps.

    Bounds: every structure that a sender can grow is bounded, not only payload bytes (a
    chunk 0 declaring 2**32-1 chunks followed by empty chunks costs no payload but one entry
    per chunk):

    * at most `max_partial_messages` incomplete messages;
    * at most `max_buffered_bytes` of buffered payload;
    * at most `max_chunks_per_message` chunks in one message: a chunk 0 declaring more, or a
      chunk whose index is beyond it, fails that message at once;
    * at most `max_tracked_chunks` chunk entries across all partial messages;
    * a chunk 0's Message Expiry Interval, and :meth:`keep_waiting`, keep a message for at
      most `max_timeout` seconds from its first chunk (a shorter `default_timeout` stays);
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
            max_timeout: most seconds a chunk 0's Message Expiry Interval, or
                :meth:`keep_waiting`, may extend a message's deadline to, counted from its
                first chunk (None: no cap).
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
        self._kept_waiting = -math.inf

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
        deadlines = [self._deadline(p) for p in self._partials.values()]
        return min((d for d in deadlines if d is not None), default=None)

    def keep_waiting(self, now: float) -> None:
        """The source is still delivering, or cannot deliver for now: restart the clock.

        Every partial message on `default_timeout` (no chunk 0 yet, or one without a Message
        Expiry Interval) gets that long again, counted from `now`, but no more than
        `max_timeout` from its first chunk in all: a sender that died mid-message on a topic
        that never goes quiet still gets its error. Bounded memory does not depend on it:
        the byte, count and chunk bounds evict the oldest partial messages whatever the
        clock says.

        Args:
            now: the current time, same clock as :meth:`feed`.
        """
        self._kept_waiting = max(self._kept_waiting, now)

    def feed(self, message: ChunkMessage, now: float) -> Outcome:
        """Take one received chunk.

        Args:
            message: the received PUBLISH; its user properties must include `__chunk`.
            now: the current time in seconds, from a monotonic clock.

        Raises:
            ValueError: the message carries no `__chunk` property (check with
                :func:`chunk_header` first).
        """
        try:
            header = chunk_header(message.properties)
        except MalformedChunk as exc:
            return Error(message.topic, None, exc)
        if header is None:
            raise ValueError(f"message on {message.topic!r} has no {CHUNK_PROPERTY} user property")
        key = (message.topic, header.message_id)
        if key in self._finished:
            return Pending(key[0], header.message_id, header.index, 0, None, duplicate=True)
        dropped: list[Error] = []
        partial = self._admit(key, header, now, dropped)
        if isinstance(partial, Error):
            return partial
        if header.index in partial.indices:
            if header.is_first and header != partial.first:
                return self._malformed(key, "conflicting first chunks", dropped)
            return self._pending(partial, header.index, dropped, duplicate=True)
        if header.is_first:
            self._take_first(partial, header, message)
            if self._overdue(partial, now):
                return self._timeout(key, partial, dropped)
        refused = self._check_index(key, partial, header, dropped)
        if refused is None:
            refused = self._store_chunk(key, partial, header.index, message.payload, dropped)
        if refused is not None:
            return refused
        first = partial.first
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

    def _admit(
        self, key: PartialKey, header: ChunkHeader, now: float, dropped: list[Error]
    ) -> _Partial | Error:
        """The partial message this chunk belongs to, opened if new, or why it fails.

        A chunk whose index or declared total is beyond `max_chunks_per_message` fails its
        message before anything is buffered; opening a partial past `max_partial_messages`
        evicts the oldest; a partial whose deadline passed fails now, not at the next sweep.
        """
        partial = self._partials.get(key)
        bound = self.max_chunks_per_message
        declared = header.total if header.total is not None else header.index + 1
        if declared > bound:
            reason = f"{declared} chunks or more, beyond the bound of {bound} per message"
            if partial is not None:
                return self._overflow(key, reason, dropped)
            self._remember_finished(key)
            error = ChunkBufferOverflow(header.message_id, reason)
            return Error(key[0], header.message_id, error)
        if partial is None:
            if len(self._partials) >= self._max_partials:
                dropped.append(
                    self._evict_oldest(f"more than {self._max_partials} partial messages")
                )
            partial = _Partial(key[0], header.message_id, now)
            self._partials[key] = partial
        elif self._overdue(partial, now):
            return self._timeout(key, partial, dropped)
        return partial

    def _take_first(self, partial: _Partial, header: ChunkHeader, message: ChunkMessage) -> None:
        """Keep what only chunk 0 carries: the total, the properties, the QoS and the expiry.

        Its Message Expiry Interval (capped by `max_timeout`) replaces the default timeout,
        counted from the message's first chunk (ADR 23), :meth:`keep_waiting` or not.
        """
        partial.first = header
        partial.first_properties = message.properties.without_user_properties(CHUNK_PROPERTY)
        partial.qos = message.qos
        expiry = message.properties.message_expiry_interval
        if expiry is not None:
            cap = self._max_timeout
            partial.expires = partial.started + (expiry if cap is None else min(expiry, cap))

    def _check_index(
        self, key: PartialKey, partial: _Partial, header: ChunkHeader, dropped: list[Error]
    ) -> Error | None:
        """Fail the message if this chunk (or one buffered before chunk 0) is past the total."""
        first = partial.first
        total = first.total if first is not None else None
        # Indices buffered before chunk 0 are checked once, when it tells the total.
        if total is not None and (
            header.index >= total or (header.is_first and max(partial.indices, default=0) >= total)
        ):
            return self._malformed(key, f"chunk index beyond totalChunks {total}", dropped)
        return None

    def _store_chunk(
        self, key: PartialKey, partial: _Partial, index: int, payload: bytes, dropped: list[Error]
    ) -> Error | None:
        """Buffer one chunk within the byte and entry bounds, evicting older messages first.

        Returns the message's own failure when it cannot fit even alone.
        """
        data = bytes(payload)
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
        self._store.put(key, index, data)
        partial.indices.add(index)
        partial.nbytes += len(data)
        self._bytes += len(data)
        self._tracked += 1
        return None

    def _deadline(self, partial: _Partial) -> float | None:
        if partial.expires is not None:
            return partial.expires
        if self._default_timeout is None:
            return None
        deadline = partial.started + self._default_timeout
        if self._kept_waiting > partial.started:  # extended, up to max_timeout in all
            extended = self._kept_waiting + self._default_timeout
            if self._max_timeout is not None:
                extended = min(extended, partial.started + self._max_timeout)
            deadline = max(deadline, extended)
        return deadline

    def _overdue(self, partial: _Partial, now: float) -> bool:
        deadline = self._deadline(partial)
        return deadline is not None and now > deadline

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
