"""The offload service: store a streamed payload and its manifest, find and serve them.

Writes go payload -> sidecar manifest -> id index, so a message is visible by id only once
everything is durable; a crash in between leaves an unreferenced payload that the sweeper
removes, never a half-visible message.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import ParamSpec, TypeVar

from client.protocol import (
    Manifest,
    MessageId,
    ProtocolError,
    Topic,
    data_key,
    index_key,
    meta_key,
)
from client.tracing import message_attributes

from ..core import (
    UPLOADED_BYTES,
    UPLOADS,
    BadRequest,
    Conflict,
    NotFound,
    Slot,
    StorageUnavailable,
    Workers,
    child,
)
from ..retention import Hold, Retention
from ..storage import ObjectStore, StoreError, SupportsAsyncRead, SupportsAsyncWrite
from ._cache import ManifestCache
from ._manifests import ManifestRepository
from ._payload_stream import PayloadStream, abandon, read_on_loop
from ._pipe import StreamingUpload
from ._small import SMALL_PAYLOAD, SmallUpload
from ._topics import MAX_KEY_BYTES

#: What `begin_upload` hands back: both take the body with `write`, then `finish` or `abort`.
Upload = StreamingUpload | SmallUpload

log = logging.getLogger("gateway")

P = ParamSpec("P")
T = TypeVar("T")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def message_id_from_headers(headers: Sequence[tuple[str, bytes]]) -> MessageId | None:
    for name, value in headers:
        if name == "_id":
            return MessageId.parse(value)
    return None


@dataclass(frozen=True, slots=True)
class Stored:
    manifest: Manifest
    created: bool  # False: an identical earlier upload was found (idempotent retry)


class OffloadService:
    """Everything the routes do with storage, as async methods.

    Args:
        store: where payloads and manifests live.
        default_ttl: seconds a payload is kept when the upload names no expiry (0: forever).
        max_ttl: cap on any payload's lifetime in seconds, named or default (0: no cap).
        min_ttl: floor under a named or default lifetime in seconds (0: none); the cap wins.
        delete_after_fetch: delete a message once its payload was sent whole to a client.
        workers: the thread pools (store calls, transfers); default: a set with the
            default sizes, for a service built outside the gateway's lifespan.
        retention: groups, one object per payload per account and quotas
            (gateway/retention); None: none of them (each message its own object).
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        default_ttl: int = 0,
        max_ttl: int = 0,
        min_ttl: int = 0,
        delete_after_fetch: bool = False,
        workers: Workers | None = None,
        retention: Retention | None = None,
    ) -> None:
        self.workers = workers or Workers.defaults()
        self.store = store
        self.default_ttl = default_ttl
        self.max_ttl = max_ttl
        self.min_ttl = min_ttl
        self.delete_after_fetch = delete_after_fetch
        self.retention = retention
        self.manifests = ManifestCache()
        # shared with the sweeper's rules
        self.repository = ManifestRepository(store, retention.keeper if retention else None)

    async def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await self.workers.store.run(fn, *args, **kwargs)
        except StoreError as exc:
            raise StorageUnavailable(f"object store unavailable: {exc}") from exc

    async def _write(self, key: str, data: bytes, *, only_new: bool = False) -> bool:
        """`put_bytes` (True) or `create_bytes`: on the event loop where the store can
        (`SupportsAsyncWrite`: two per upload, no thread hop), else in a store thread."""
        store = self.store
        if isinstance(store, SupportsAsyncWrite) and store.writes_now():
            try:
                return await store.write(key, data, only_new=only_new)
            except StoreError as exc:
                raise StorageUnavailable(f"object store unavailable: {exc}") from exc
        if only_new:
            return await self._call(store.create_bytes, key, data)
        await self._call(store.put_bytes, key, data)
        return True

    def begin_upload(
        self, topic: Topic, length: int, *, content_type: str | None = None
    ) -> tuple[Upload, str, int]:
        """Start storing a payload of `length` bytes (-1: unknown): taken whole on the
        event loop when it is known to be small and the store can take it from there
        (`SmallUpload`), else streamed through a transfer thread as it arrives."""
        stamp = now_ms()
        key = data_key(topic, stamp, uuid.uuid4().hex)
        if len(key.encode("utf-8")) + 16 > MAX_KEY_BYTES:
            raise BadRequest("topic too long: its object key would exceed 1024 bytes")
        store, transfers = self.store, self.workers.transfers
        upload: Upload
        small = 0 <= length <= SMALL_PAYLOAD
        if small and isinstance(store, SupportsAsyncWrite) and store.writes_now():
            upload = SmallUpload(store, key, length, content_type, transfers=transfers)
        else:
            upload = StreamingUpload(store, key, length, content_type, transfers=transfers)
        return upload, key, stamp

    async def commit(
        self,
        manifest: Manifest,
        *,
        kind: str = "envelope",
        user: str | None = None,
        hold: Hold | None = None,
        verified: bool = True,
    ) -> Stored:
        """Make an uploaded payload visible by id, or resolve a retry of the same id.

        The id index is the commit point and is created only where none exists
        (`ObjectStore.create_bytes`: `If-None-Match: *` on S3, `link(2)` on disk), so of
        uploads racing for one id exactly one commits. A loser whose content is the same
        (SHA-256, size and topic) gets the winner's message and `created=False`; any
        other loser gets 409. Either way the loser's own objects are removed and the
        winner's are never touched.

        Two store requests for a new id (sidecar, then the conditional index create):
        the id is not looked up in the store first. Nearly every commit is of a new id
        (clients make a fresh one per message), so that lookup was one request in four
        of every small upload (bench/RESULTS.md, "Commit"); a retry of a committed id
        learns the same from the create's 412 and removes its own sidecar and payload.
        Only this gateway's manifest cache is consulted first, which costs nothing.

        With retention (gateway/retention) the message first gets its groups and its
        place in its account's record of this content (`Retention.adopt`): when the
        account stores the payload already, the message is linked to that object and the
        bytes just written are deleted once the index is in; `hold` (the upload's
        reservation on `user`'s ledger) becomes stored bytes, or is released. `verified`
        False: the SHA-256 is the uploader's word only (a multipart direct upload), and the
        payload never becomes the copy other messages are linked to.

        Raises:
            Conflict: the id is taken by a message with other content or topic.
        """
        try:
            return await self._commit(manifest, kind, user, hold, verified)
        finally:
            if hold is not None:
                await hold.release()  # a no-op once adopted; else never left to lapse

    async def _commit(
        self, manifest: Manifest, kind: str, user: str | None, hold: Hold | None, verified: bool
    ) -> Stored:
        cached = self.manifests.get(manifest.id)
        if cached is not None and (cached.expires is None or cached.expires > now_ms()):
            return await self._lost(manifest, cached, meta_written=False)
        if manifest.expires is None:
            manifest = replace(manifest, expires=self.expiry_for(manifest.timestamp))
        elif self.max_ttl:  # whoever set it, no payload outlives the cap
            cap = manifest.timestamp + self.max_ttl * 1000
            manifest = replace(manifest, expires=min(manifest.expires, cap))
        redundant = None
        if self.retention is not None and manifest.blob is None:  # else linked already
            try:
                adoption = await self.retention.adopt(manifest, user, hold, verified=verified)
            except BaseException:
                await self._remove_quietly(manifest, meta_written=False)
                raise
            manifest, redundant = adoption.manifest, adoption.redundant
        try:
            return await self._index(manifest, kind, redundant)
        except Conflict:
            raise  # `_lost` removed ours
        except BaseException:
            await self._remove_quietly(manifest, meta_written=True)
            raise

    async def _index(self, manifest: Manifest, kind: str, redundant: str | None) -> Stored:
        """Sidecar, then the conditional index create: the commit point."""
        body = manifest.to_json()
        await self._write(meta_key(manifest.home), body)
        for _attempt in range(3):
            if await self._write(index_key(manifest.id), body, only_new=True):
                self.manifests.put(manifest)
                UPLOADS.labels(kind).inc()
                UPLOADED_BYTES.inc(manifest.size)
                if redundant is not None:  # the account's copy serves it: ours goes
                    await self.discard(redundant)
                return Stored(manifest, created=True)
            raw = await self._call(self.store.get_bytes, index_key(manifest.id))
            if raw is None:
                continue  # removed meanwhile (expired and swept): try again
            try:
                current = Manifest.from_json(raw)
            except ProtocolError as exc:
                await self._remove_ours(manifest, meta_written=True)
                raise Conflict(f"message id {manifest.id} is taken (unreadable index)") from exc
            if current.home == manifest.home:
                # Our own create succeeded and its answer was lost (a retried request).
                self.manifests.put(manifest)
                if redundant is not None:
                    await self.discard(redundant)
                return Stored(manifest, created=True)
            if current.expires is not None and current.expires <= now_ms():
                await self.forget(current)  # an expired message frees its id
                continue
            return await self._lost(manifest, current, meta_written=True)
        await self._remove_ours(manifest, meta_written=True)
        raise Conflict(f"message id {manifest.id} is contended; retry later")

    async def _lost(self, ours: Manifest, winner: Manifest, *, meta_written: bool) -> Stored:
        """The id is `winner`'s: drop our objects; same content is an idempotent retry."""
        await self._remove_ours(ours, meta_written=meta_written)
        if winner.sha256 == ours.sha256 and winner.size == ours.size and winner.topic == ours.topic:
            return Stored(winner, created=False)
        raise Conflict(f"message id {ours.id} already exists with different content or topic")

    async def _remove_ours(self, manifest: Manifest, *, meta_written: bool) -> None:
        """Our sidecar, our place in the record (`Retention.unadopt`: the record's object
        goes with its last message), and the bytes we wrote when no record holds them
        (`home`: never an object a record holds, which others may be linked to)."""
        if meta_written:
            await self._call(self.store.delete, meta_key(manifest.home))
        if self.retention is not None:
            await self.retention.unadopt(manifest)
        if manifest.blob is None or manifest.filed_at is not None:
            await self._call(self.store.delete, manifest.home)

    async def drop(self, manifest: Manifest) -> None:
        """Remove an uncommitted message's own objects (never an object it was linked to)."""
        await self._remove_quietly(manifest, meta_written=False)

    async def _remove_quietly(self, manifest: Manifest, *, meta_written: bool) -> None:
        """`_remove_ours` after a failure: what it cannot remove the sweeper does later."""
        try:
            await self._remove_ours(manifest, meta_written=meta_written)
        except StorageUnavailable as exc:
            log.warning("could not remove the objects of uncommitted %s: %s", manifest.id, exc)

    async def discard(self, key: str) -> None:
        try:
            await self.workers.store.run(self.store.delete, key)
        except StoreError as exc:
            log.warning("could not remove abandoned payload %s: %s", key, exc)

    async def find(self, message_id: MessageId) -> Manifest | None:
        """The manifest of a live message, None when unknown or expired."""
        manifest = self.manifests.get(message_id)
        if manifest is None:
            raw = await self._call(self.store.get_bytes, index_key(message_id))
            manifest = None if raw is None else Manifest.from_json(raw)
            if manifest is not None:
                self.manifests.put(manifest)
        if manifest is not None and manifest.expires is not None and manifest.expires <= now_ms():
            return None  # expired: never served, whatever the sweeper has done yet
        return manifest

    async def load(self, message_id: MessageId) -> Manifest:
        """The manifest of a live message; 404 when unknown or expired."""
        manifest = await self.find(message_id)
        if manifest is None:
            raise NotFound(f"no message with id {message_id}")
        return manifest

    async def open_payload(
        self, manifest: Manifest, start: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes | memoryview]:
        """The payload bytes (or a range) as an async stream; 404 when the object is gone.

        Takes a transfer slot (503 `Saturated` when none is free), held until the stream
        is closed, finished or dropped. The request's `store read` span times the opening
        (the store's first answer), not the body that streams after it.
        """
        attributes = message_attributes(
            manifest.topic.value, manifest.size, "store read", "receive", str(manifest.id)
        )
        with child("store read", "client", attributes):
            return await self._open_payload(manifest, start, length)

    async def _open_payload(
        self, manifest: Manifest, start: int, length: int | None
    ) -> AsyncIterator[bytes | memoryview]:
        slot = self.workers.transfers.admit()
        if isinstance(self.store, SupportsAsyncRead):
            return await self._read_on_loop(self.store, manifest, slot, start, length)
        job = slot.submit(self.store.open_range, manifest.data_key, start, length)
        try:
            pieces = await asyncio.wrap_future(job)
        except BaseException as exc:
            if job.done():
                slot.release()
            else:  # cancelled while the store call runs: close what it opens, then release
                job.add_done_callback(lambda done: abandon(done, slot))
            if isinstance(exc, FileNotFoundError):
                raise NotFound(f"payload of message {manifest.id} is gone") from exc
            if isinstance(exc, StoreError):
                raise StorageUnavailable(f"object store unavailable: {exc}") from exc
            raise
        return PayloadStream(pieces, slot)

    async def _read_on_loop(
        self,
        store: SupportsAsyncRead,
        manifest: Manifest,
        slot: Slot,
        start: int,
        length: int | None,
    ) -> AsyncIterator[bytes | memoryview]:
        """`open_payload` on a store the event loop reads (S3): no transfer thread."""
        try:
            url = store.read_url_now(manifest.data_key)  # signing alone: no thread hop
            if url is None:
                url = await self._call(store.read_url, manifest.data_key)
            body = await store.read(url, start, length)
        except FileNotFoundError as exc:
            slot.release()
            raise NotFound(f"payload of message {manifest.id} is gone") from exc
        except StoreError as exc:
            slot.release()
            raise StorageUnavailable(f"object store unavailable: {exc}") from exc
        except BaseException:
            slot.release()
            raise
        return read_on_loop(body, slot)

    # -- retention (docs/reliability.md) ---------------------------------------------------

    def expiry_for(self, timestamp_ms: int, ttl: int | None = None) -> int | None:
        """When a payload stored at `timestamp_ms` expires (ms), None when kept forever.

        Args:
            timestamp_ms: the upload's time, milliseconds since the epoch.
            ttl: seconds the uploader asked for (the placeholder's Message Expiry
                Interval); None or 0 takes the default. Raised to `min_ttl` (a consumer's
                persistent session may get the placeholder later than the uploader
                thought), then clamped to `max_ttl`, not refused:
                an uploader cannot know the cap, and a shorter life is the safe side.
        """
        seconds = ttl or self.default_ttl
        if seconds and self.min_ttl:
            seconds = max(seconds, self.min_ttl)
        if self.max_ttl:
            seconds = min(seconds, self.max_ttl) if seconds else self.max_ttl
        return timestamp_ms + seconds * 1000 if seconds else None

    async def forget(self, manifest: Manifest) -> None:
        """Delete a message: index first, so it is never visible half-deleted.

        Idempotent (a missing object is no error), so replicas and sweepers may race.
        The index is only removed while it still names this payload: a later upload that
        reused the id after expiry keeps its own.
        """
        self.manifests.evict(manifest.id)
        await self._call(self.repository.forget, manifest)

    async def then_forget(
        self,
        manifest: Manifest,
        body: AsyncIterator[bytes | memoryview],
        *,
        handed_topic: str | None,
        disconnected: Callable[[], Awaitable[bool]],
    ) -> AsyncIterator[bytes | memoryview]:
        """`body`, then (with delete_after_fetch) delete the message once it was sent whole.

        The response streamer asks for the next piece only after the previous one was
        sent, but a send does not prove the bytes went out: uvicorn (ASGI spec 2.3) turns
        every send after a disconnect into a no-op, and the disconnect does not always
        cancel the stream in time (a store that keeps the stream fed lets it run to the
        end). So the end of `body` deletes nothing if `disconnected()` holds once the
        transport's buffer has drained: the connection only ever goes from up to down, so
        while it is up every piece was written to it.

        Only a fetch for the message's own topic deletes it: `handed_topic` is the topic
        the subscriber received the placeholder on (`X-Offload-Placeholder-Topic`). A
        placeholder is
        any publisher's claim, and may name another topic's message the subscriber can
        read: that fetch is served, and deletes nothing.
        """
        async for piece in body:
            yield piece
        if not (self.delete_after_fetch and handed_topic == manifest.topic.value):
            return
        # The last piece was handed to the transport, not sent: up to a whole piece (1
        # MiB) may still wait in its buffer for a client that never takes it. An empty
        # send waits until that buffer drains (uvicorn's flow control), or the client
        # leaves (which `disconnected` then tells).
        yield b""
        if await disconnected():
            log.info("%s: the client left before the whole payload; kept", manifest.id)
            return
        try:
            await self.forget(manifest)
        except StorageUnavailable as exc:  # the sweeper removes it at expiry instead
            log.warning("delete after fetch of %s failed: %s", manifest.id, exc)
