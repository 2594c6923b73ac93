"""Resumable uploads (tus 1.0 and its extensions, see `gateway.http._routes_tus`): the state.

Design - everything lives in the object store, nothing on local disk, so any replica can
continue any upload and the gateway's memory stays bounded:

    uploads/<id>.json                 UploadState (topic, length, offset, segments, expiry)
    uploads/<id>/<offset:020d>-<tok>  one staged object per acknowledged PATCH segment

* A PATCH body streams into its own segment object while its SHA-256 is taken; with an
  `Upload-Checksum` (sha1, md5, crc32 or sha256, see `_tus`) that does not match, the
  segment is deleted and the offset stays (460): only that segment is rejected. A PATCH
  cut off midway stores nothing, so a client resumes from the last acknowledged offset
  (HEAD) and resends that segment.
* On the last byte the segments become the payload object with `ObjectStore.concat`:
  server-side UploadPartCopy (S3 multipart, no bytes through the gateway) when every
  segment but the last is at least 5 MiB, else one streamed copy through the gateway.
  Trade-off: clients that PATCH in small pieces cost a second pass over the bytes at the
  end; clients that PATCH >= 5 MiB (the `offload upload` CLI sends 8 MiB) cost nothing.
  Staging each PATCH as its own object, rather than an S3 multipart upload whose parts
  must be >= 5 MiB, keeps PATCH sizes the client's choice and works on the file store.
* The whole payload's SHA-256 (and CRC-32C, see `_pipe`) is taken while the segments arrive,
  in a per-replica cache (hashlib state cannot be stored); when another replica or a
  restart took part, both are computed by reading the assembled object back once.
* An upload belongs to the principal that created it (`owner`, the authenticated user name);
  HEAD, PATCH and DELETE by anyone else answer 404, as for an unknown id. Anonymous uploads
  (no user) belong to whoever holds the id: a 128-bit random capability, never listed.
* Concatenation: a partial upload is an upload that is never published; a final upload's
  segments are its parts' segments (no bytes copied until assembly), and once it is
  published the parts are removed, states and segments.
* Abandoned uploads expire (`Upload-Expires`, extended by each PATCH); the gateway's
  sweeper calls :func:`cleanup_expired_uploads`, which removes them and orphaned segments.

* One request at a time per upload on a replica (`_locks`, as tusd does): a HEAD or
  PATCH that arrives while an earlier PATCH is under way waits for it, or stops it when its
  body has stalled, so a client that resumes after a lost connection is told the offset
  that holds.

Known limits: two PATCHes racing on one upload at two replicas are detected only loosely
(the offset is re-read before the state is saved; the loser gets 409). Two
final uploads naming the same parts at once may both publish, or the slower one fail when
the faster one removed the parts; tus clients send one final upload.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import replace
from typing import Any

from client.protocol import MessageId, Topic, data_key

from ..core import (
    BadRequest,
    ChecksumMismatch,
    Conflict,
    Gone,
    NotFound,
    PayloadTooLarge,
    Transfers,
    WorkerPool,
)
from ..ingest import (
    MAX_KEY_BYTES,
    PublishOptions,
    Quotas,
    StreamingUpload,
    crc32c_text,
    crc32c_update,
    now_ms,
)
from ..retention import Hold, Retention
from ..storage import ObjectInfo, ObjectStore, StoreError
from ._locks import UploadLocks
from ._protocol import Checksum, check_upload_id
from ._state import UPLOADS_PREFIX, Segment, UploadState, segments_prefix, state_key

log = logging.getLogger("gateway.uploads")

_HASH_CACHE = 256  # uploads whose running SHA-256 this replica remembers


class _Digests:
    """A payload's SHA-256 and CRC-32C so far, behind hashlib's update/copy interface."""

    __slots__ = ("crc32c", "sha256")

    def __init__(self, sha256: Any = None, crc32c: int = 0) -> None:
        self.sha256 = hashlib.sha256() if sha256 is None else sha256
        self.crc32c = crc32c

    def update(self, data: bytes) -> None:
        self.sha256.update(data)
        self.crc32c = crc32c_update(self.crc32c, data)

    def copy(self) -> _Digests:
        return _Digests(self.sha256.copy(), self.crc32c)


class ResumableUploads:
    """Create, append to, assemble and terminate resumable uploads in an object store.

    Args:
        store: where the state and the segments live.
        expiry: seconds an upload may stay idle before it is abandoned.
        transfers: the transfer pool segment uploads are admitted to.
        calls: the pool short store calls (state, deletes, assembly) run in, so that
            /healthz sees them wait (the gateway's `Workers.store`).
        locks: which request holds each upload on this replica (`_locks`).
        quotas: where each unfinished upload is counted against its owner's caps (the
            creation route checks them first); None: not counted.
        retention: holds each upload's `Upload-Length` on its owner's ledger from its
            creation (gateway/retention: refused with 413 past the stored-bytes quota)
            until it is committed or removed; None: no holds.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        expiry: int,
        transfers: Transfers,
        calls: WorkerPool,
        locks: UploadLocks | None = None,
        quotas: Quotas | None = None,
        retention: Retention | None = None,
    ) -> None:
        self.store = store
        self.quotas = quotas
        self.retention = retention
        self.locks = UploadLocks() if locks is None else locks
        self.transfers = transfers
        self.calls = calls
        self.expiry = expiry
        # upload id -> (offset the hash has seen, running hash); per replica, best effort.
        self._hashes: OrderedDict[str, tuple[int, Any]] = OrderedDict()

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await self.calls.run(fn, *args)

    async def create(
        self,
        topic: Topic,
        length: int,
        *,
        filename: str | None,
        content_type: str | None,
        sha256: str | None,
        options: PublishOptions,
        owner: str | None = None,
        partial: bool = False,
    ) -> UploadState:
        """A new, empty upload of `length` bytes, saved before it is returned.

        Args:
            topic: the topic the placeholder goes to.
            length: the payload's total size.
            filename: served back as Content-Disposition.
            content_type: the message's content type.
            sha256: the whole payload's expected SHA-256 (hex), checked at the end.
            options: placeholder options (qos, retain, expiry, user properties).
            owner: the authenticated user creating it; only they may continue it.
            partial: a tus concatenation part: complete, it waits for a final upload.
        """
        now = time.time()
        state = UploadState(
            id=uuid.uuid4().hex,
            topic=topic,
            length=length,
            message_id=MessageId.new(),
            created=now,
            expires=now + self.expiry,
            filename=filename,
            content_type=content_type,
            sha256=sha256,
            options=options,
            owner=owner,
            partial=partial,
        )
        if self.retention is not None:  # before anything is stored: 413 past the quota
            hold = self.retention.hold(owner, hold_ident(state.id))
            await hold.reserve(length, until=int(state.expires * 1000))
        await self.save(state)
        if self.quotas is not None:
            ident = f"t-{state.id}"
            await self.quotas.record(owner, ident, expires=int(state.expires), size=length)
        self._remember(state.id, 0, _Digests())
        return state

    async def create_final(self, template: UploadState, parts: list[UploadState]) -> UploadState:
        """A final upload (tus concatenation): the parts' segments, in order, as its own.

        It is complete at once; the caller assembles and publishes it like any other.

        Args:
            template: the final's own settings, as :meth:`create` would take them (its
                `length` and `segments` are replaced by the parts').
            parts: the completed partial uploads, in the order the client named them.
        """
        segments: list[Segment] = []
        at = 0
        for part in parts:
            for seg in part.segments:
                segments.append(Segment(seg.key, at, seg.size))
                at += seg.size
        now = time.time()
        state = replace(
            template,
            id=uuid.uuid4().hex,
            length=at,
            message_id=MessageId.new(),
            created=now,
            expires=now + self.expiry,
            segments=tuple(segments),
            parts=tuple(p.id for p in parts),
        )
        await self.save(state)
        return state

    async def save(self, state: UploadState) -> None:
        await self._call(self.store.put_bytes, state_key(state.id), state.to_json())

    async def load(self, upload_id: str, *, now: float | None = None) -> UploadState:
        """The upload's state; 404 when unknown, 410 when it expired.

        Whose it is (`owner`) is the caller's check (`load_own`): internal re-reads skip it.
        """
        return self._unexpired(await self._read(upload_id), now)

    async def load_own(self, upload_id: str, owner: str | None) -> UploadState:
        """`owner`'s upload; another principal's is 404 as for an unknown id, even expired.

        Ownership is checked before expiry: a 410 would confirm that the id exists.

        Args:
            upload_id: from the URL.
            owner: the authenticated caller, None for anonymous.
        """
        state = await self._read(upload_id)
        if state.owner != owner:
            raise NotFound(f"no upload {upload_id}")
        return self._unexpired(state, None)

    async def _read(self, upload_id: str) -> UploadState:
        raw = await self._call(self.store.get_bytes, state_key(check_upload_id(upload_id)))
        if raw is None:
            raise NotFound(f"no upload {upload_id}")
        return UploadState.from_json(raw)

    @staticmethod
    def _unexpired(state: UploadState, now: float | None) -> UploadState:
        if state.expires <= (time.time() if now is None else now):
            raise Gone(f"upload {state.id} expired")
        return state

    def _remember(self, upload_id: str, offset: int, digest: Any) -> None:
        self._hashes[upload_id] = (offset, digest)
        self._hashes.move_to_end(upload_id)
        while len(self._hashes) > _HASH_CACHE:
            self._hashes.popitem(last=False)

    async def append(
        self,
        state: UploadState,
        offset: int,
        chunks: AsyncIterator[bytes],
        *,
        declared: int | None,
        checksum: Checksum | None,
        interruptible: AbstractAsyncContextManager[None] | None = None,
    ) -> UploadState:
        """Stage one PATCH segment at `offset`; the saved state with the new offset.

        Args:
            state: the upload as loaded for this request.
            offset: the client's `Upload-Offset`; must equal the stored offset.
            chunks: the request body.
            declared: its Content-Length, None when chunked.
            checksum: the segment's expected digest (`Upload-Checksum`), if any.
            interruptible: entered while the segment is received and stored (the request's
                `Hold.interruptible()`): a newer request for the upload may stop it there.

        Raises:
            Conflict: the offset is not the upload's current offset.
            PayloadTooLarge: the segment would pass `Upload-Length`.
            ChecksumMismatch: the segment does not match `checksum` (nothing is kept).
        """
        if offset != state.offset:
            raise Conflict(f"Upload-Offset is {offset} but the upload is at {state.offset}")
        room = state.length - offset
        if declared is not None and declared > room:
            raise PayloadTooLarge(f"segment of {declared} bytes passes Upload-Length by more")
        cached = self._hashes.get(state.id)
        running = cached[1].copy() if cached is not None and cached[0] == offset else None
        key, size = await self._stage(
            state.id, offset, chunks, room, declared, checksum, interruptible, running
        )
        if size == 0:
            return state
        # Re-read: a racing PATCH on another replica may have moved the upload on.
        latest = await self.load(state.id)
        if latest.offset != offset:
            await self._call(self.store.delete, key)
            raise Conflict(f"upload {state.id} moved on to {latest.offset} meanwhile")
        updated = replace(
            latest,
            segments=(*latest.segments, Segment(key, offset, size)),
            expires=time.time() + self.expiry,
        )
        await self.save(updated)
        if self.retention is not None:  # the hold lasts as long as the upload
            await self.hold_of(updated).refresh(int(updated.expires * 1000))
        if running is not None:
            self._remember(state.id, updated.offset, running)
        else:
            self._hashes.pop(state.id, None)
        return updated

    async def _stage(
        self,
        upload_id: str,
        offset: int,
        chunks: AsyncIterator[bytes],
        room: int,
        declared: int | None,
        checksum: Checksum | None,
        interruptible: AbstractAsyncContextManager[None] | None,
        running: Any,
    ) -> tuple[str, int]:
        """Store one segment under a key of its own, at most `room` bytes, checked against
        `checksum` (deleted when it does not match); its key and size. `running`, the
        upload's SHA-256 so far when known, is fed the segment's bytes too."""
        # The store hashes with SHA-256 anyway; another algorithm costs a second hash.
        check = None if checksum is None or checksum.algorithm == "sha256" else checksum.new()
        key = f"{segments_prefix(upload_id)}{offset:020d}-{uuid.uuid4().hex[:8]}"
        upload = StreamingUpload(
            self.store, key, -1 if declared is None else declared, None, transfers=self.transfers
        )
        total = 0
        try:
            async with interruptible or nullcontext():
                async for chunk in chunks:
                    total += len(chunk)
                    if total > room:
                        raise PayloadTooLarge("segment passes Upload-Length")
                    if running is not None:
                        running.update(chunk)
                    if check is not None:
                        check.update(chunk)
                    await upload.write(chunk)
                sha256, size = await upload.finish()
        except BaseException as exc:
            await upload.abort(exc)
            raise
        if checksum is not None:
            got = bytes.fromhex(sha256) if check is None else check.digest()
            if got != checksum.digest:
                await self._call(self.store.delete, key)
                raise ChecksumMismatch(
                    f"segment at offset {offset} is {checksum.describe(got)}, Upload-Checksum "
                    f"said {checksum.describe(checksum.digest)}; the segment was discarded, "
                    f"the upload stays at offset {offset}"
                )
        return key, size

    async def assemble(self, state: UploadState) -> tuple[str, str, int, str | None]:
        """Concatenate the segments into a new payload object.

        Returns:
            (data key, SHA-256 hex of the whole payload, timestamp ms, its CRC-32C hex).
        """
        stamp = now_ms()
        key = data_key(state.topic, stamp, uuid.uuid4().hex)
        if len(key.encode("utf-8")) + 16 > MAX_KEY_BYTES:
            raise BadRequest("topic too long: its object key would exceed 1024 bytes")
        sources = [ObjectInfo(s.key, s.size) for s in state.segments]
        await self._call(self.store.concat, key, sources, state.content_type)
        cached = self._hashes.get(state.id)
        if cached is not None and cached[0] == state.length:
            digests: _Digests = cached[1]
        else:  # another replica (or a restart) saw some segments: one read-back pass instead
            try:
                digests = await self._call(_hash_object, self.store, key)
            except BaseException:
                await self._call(self.store.delete, key)
                raise
        return key, digests.sha256.hexdigest(), stamp, crc32c_text(digests.crc32c)

    async def remove_segments(self, state: UploadState) -> None:
        """Delete the staged segments (after assembly or on termination).

        A final upload's segments are its partial uploads': those go whole, state and all,
        since nothing may be appended to a part once a final consumed it.
        """
        await self._call(_delete_prefix, self.store, segments_prefix(state.id))
        self._hashes.pop(state.id, None)
        for part in state.parts:
            await self._call(_delete_prefix, self.store, segments_prefix(part))
            await self._call(self.store.delete, state_key(part))
            self._hashes.pop(part, None)
        if self.quotas is not None:  # finished or terminated: it counts no more
            for upload_id in (state.id, *state.parts):
                await self.quotas.release(state.owner, f"t-{upload_id}")
        if self.retention is not None:  # a commit has turned the upload's own into bytes
            for upload_id in (state.id, *state.parts):
                await self.retention.hold(state.owner, hold_ident(upload_id), 1).release()

    def hold_of(self, state: UploadState) -> Hold:
        """The upload's hold on its owner's ledger (made at creation; a final upload's
        bytes are its parts' holds until its commit)."""
        assert self.retention is not None
        reserved = 0 if state.parts else state.length
        return self.retention.hold(state.owner, hold_ident(state.id), reserved)

    async def terminate(self, state: UploadState) -> None:
        """tus termination: segments first, then the state (so no segment is orphaned)."""
        await self.remove_segments(state)
        await self._call(self.store.delete, state_key(state.id))


def hold_ident(upload_id: str) -> str:
    """The name of a resumable upload's hold (gateway/retention)."""
    return f"t-{upload_id}"


def _hash_object(store: ObjectStore, key: str) -> _Digests:
    digest = _Digests()
    pieces: Iterator[bytes] = store.open_range(key)
    try:
        for piece in pieces:
            digest.update(piece)
    finally:
        close = getattr(pieces, "close", None)
        if close is not None:
            close()
    return digest


def _delete_prefix(store: ObjectStore, prefix: str) -> None:
    for info in list(store.list(prefix)):
        store.delete(info.key)


def cleanup_expired_uploads(store: ObjectStore, now: float) -> int:
    """Remove abandoned (expired) uploads and orphaned segments; for the sweeper.

    Completed uploads keep their small state until it expires too, so a client whose last
    PATCH answer was lost can still learn the message URL with HEAD.

    Args:
        store: the gateway's object store.
        now: the current time, seconds since the epoch.

    Returns:
        How many uploads were removed.
    """
    states: dict[str, str] = {}
    segment_ids: set[str] = set()
    for info in store.list(UPLOADS_PREFIX):
        rest = info.key[len(UPLOADS_PREFIX) :]
        if "/" in rest:
            segment_ids.add(rest.split("/", 1)[0])
        elif rest.endswith(".json"):
            states[rest[: -len(".json")]] = info.key
    removed = 0
    for upload_id, key in states.items():
        raw = store.get_bytes(key)
        if raw is None:
            continue
        try:
            expires = UploadState.from_json(raw).expires
        except StoreError:
            expires = 0.0  # unreadable state: nobody can continue this upload
        if expires <= now:
            _delete_prefix(store, segments_prefix(upload_id))
            store.delete(key)
            removed += 1
            log.info("removed abandoned upload %s", upload_id)
    for upload_id in segment_ids - set(states):
        # Segments whose state is gone (terminated while a PATCH was in flight); look
        # again first, since an upload created during the listing is not an orphan.
        if store.get_bytes(state_key(upload_id)) is None:
            _delete_prefix(store, segments_prefix(upload_id))
    return removed
