"""Committing a direct upload: one commit or abandon per grant, checked, stamped, stored.

The `/direct/commit` route (gateway/http/_routes_direct.py) authenticates, parses and checks the
grant, then hands over here: `claimed` makes the request the grant's one running commit or
abandon (across replicas), `committed` finds what an earlier one stored, and `commit`
assembles the parts, checks the object against the grant, moves it to its commit's hour
when needed and commits manifest and index. See gateway/direct/_transfers.py for what is verified.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Generator
from contextlib import asynccontextmanager

from fastapi import Request
from fastapi.responses import Response

from client.protocol import Manifest, data_key, parse_data_key

from ..core import BadRequest, Forbidden, JSONAnswer, StorageUnavailable
from ..direct import CommitRequest, Grant
from ..ingest import now_ms
from ..retention import Hold
from ..storage import DirectStore, ObjectInfo, ObjectStore, StoreError
from ._context import Context
from ._ingest import build_manifest, commit_or_discard
from ._receive import Received
from ._routes import created_response

log = logging.getLogger("gateway")


def grant_hold(ctx: Context, grant: Grant) -> Hold:
    """The grant's hold on its owner's ledger (gateway/retention), made at the grant."""
    return ctx.retention.hold(grant.owner, grant.quota_ident, grant.size)


async def discard_grant(ctx: Context, store: DirectStore, grant: Grant) -> None:
    """Remove whatever the grant's uploader placed (best effort: the sweeper is the backstop)."""
    if grant.upload_id:
        try:
            await ctx.service.workers.store.run(store.abort_multipart, grant.key, grant.upload_id)
        except StoreError as exc:  # the parts stay until the bucket's lifecycle rule
            log.warning("could not abort upload %s of %s: %s", grant.upload_id, grant.key, exc)
    await ctx.service.discard(grant.key)
    await ctx.quotas.release(grant.owner, grant.quota_ident)
    await grant_hold(ctx, grant).release()


async def _assemble(ctx: Context, store: DirectStore, grant: Grant, req: CommitRequest) -> None:
    """Join the parts and check the object against the grant; refuse and remove on mismatch."""
    run = ctx.service.workers.store.run
    if grant.upload_id:
        if len(req.etags) != grant.parts:
            await discard_grant(ctx, store, grant)
            raise BadRequest(f"{len(req.etags)} ETags for {grant.parts} parts; nothing kept")
        problem = await run(store.complete_multipart, grant.key, grant.upload_id, req.etags)
        # NoSuchUpload: completed by an earlier commit whose answer was lost; the object decides.
        if problem is not None and not problem.startswith("NoSuchUpload"):
            await discard_grant(ctx, store, grant)
            raise BadRequest(f"the store refused the parts ({problem}); nothing kept")
    size = await run(store.size, grant.key)
    if size is None:
        await discard_grant(ctx, store, grant)
        raise BadRequest("no object was uploaded for this grant; nothing kept")
    if size != grant.size:
        await discard_grant(ctx, store, grant)
        raise BadRequest(f"object has {size} bytes, the grant {grant.size}; nothing kept")
    if grant.upload_id and ctx.settings.direct_verify_sha256:
        actual = await _read_back(ctx, grant.key)
        if actual != grant.sha256:
            await discard_grant(ctx, store, grant)
            raise BadRequest(
                f"object hashes to {actual}, the grant says {grant.sha256}; nothing kept"
            )


def _sha256_of(store: ObjectStore, key: str, touch: Callable[[], None]) -> str:
    digest = hashlib.sha256()
    pieces = store.open_range(key)
    try:
        for piece in pieces:
            digest.update(piece)
            touch()
    finally:
        if isinstance(pieces, Generator):
            pieces.close()
    return digest.hexdigest()


async def _read_back(ctx: Context, key: str) -> str:
    """The stored object's SHA-256, read on a transfer thread (`OFFLOAD_DIRECT_VERIFY_SHA256`)."""
    slot = ctx.service.workers.transfers.admit()
    job = slot.submit(_sha256_of, ctx.service.store, key, slot.touch)
    try:
        return await asyncio.wrap_future(job)
    except StoreError as exc:
        raise StorageUnavailable(f"object store unavailable: {exc}") from exc
    finally:
        if job.done():
            slot.release()
        else:  # cancelled while hashing: the thread is busy until it ends
            job.add_done_callback(lambda _: slot.release())


async def committed(ctx: Context, grant: Grant) -> Manifest | None:
    """The message this grant committed, None when it has not (yet)."""
    if grant.message_id is None:
        return None
    done = await ctx.service.find(grant.message_id)
    if done is None:
        return None
    # The same object, perhaps moved to its commit's hour (`_restamp`): the same token, at
    # the message's own key (`home`: its payload may be the account's earlier copy).
    mine, theirs = parse_data_key(grant.key), parse_data_key(done.home)
    same = mine is not None and theirs is not None and mine.token == theirs.token
    return done if same and done.topic == grant.topic else None


async def _restamp(ctx: Context, grant: Grant) -> tuple[int, str]:
    """The message's time and key: its commit's, not its grant's.

    A Spark stream orders messages by this time and gives up on those more than its
    lateness (600 s by default) behind the newest; a grant lives up to
    `OFFLOAD_DIRECT_GRANT_TTL` (an hour), so a grant-time stamp lost slow uploads. Batch
    reads prune by the key's hour, so the time must lie in it: a commit in another hour
    than its grant moves the object there first (a server-side copy in the store).
    """
    stamp = now_ms()
    token = grant.key.rsplit("/", 1)[-1]
    key = data_key(grant.topic, stamp, token)
    if key != grant.key:
        source = [ObjectInfo(grant.key, grant.size)]
        try:
            await ctx.service.workers.store.run(
                ctx.service.store.concat, key, source, grant.content_type
            )
        except StoreError as exc:  # the object stays where it is: the commit may be repeated
            raise StorageUnavailable(f"object store unavailable: {exc}") from exc
        await ctx.service.discard(grant.key)
    return stamp, key


@asynccontextmanager
async def claimed(ctx: Context, grant: Grant) -> AsyncIterator[bool]:
    """Hold the grant as its one running commit or abandon; False when another holds it.

    A conditional create in the store, so it holds across replicas: without it a commit
    and a concurrent abandon (`{"etags": []}`) of one grant could both run, the abandon
    deleting the object the commit then indexed. Released when the holder is done; a
    holder that won after an earlier one finished looks for its message again, since the
    index is written before the claim is released. A claim a crash left behind is removed
    by the sweeper once the grant has expired.
    """
    store = ctx.service.store
    body = json.dumps({"expires": grant.expires}).encode("ascii")
    try:
        held = await ctx.service.workers.store.run(store.create_bytes, grant.claim_key, body)
    except StoreError as exc:
        raise StorageUnavailable(f"object store unavailable: {exc}") from exc
    try:
        yield held
    finally:
        if held:
            try:
                await ctx.service.workers.store.run(store.delete, grant.claim_key)
            except StoreError as exc:  # the sweeper removes it after the grant expires
                log.warning("could not release the claim on %s: %s", grant.key, exc)


async def commit(
    ctx: Context, request: Request, store: DirectStore, grant: Grant, req: CommitRequest
) -> Response:
    """The grant's one commit (or abandon): refuse and remove, or store manifest and index."""
    if req.abandon:
        await discard_grant(ctx, store, grant)
        return JSONAnswer({"detail": "upload abandoned; what was uploaded is removed"})
    if grant.expired():
        await discard_grant(ctx, store, grant)
        raise Forbidden("upload grant expired; what was uploaded is removed, nothing kept")
    await _assemble(ctx, store, grant, req)
    stamp, key = await _restamp(ctx, grant)
    received = Received(
        grant.topic,
        key,
        grant.sha256,
        grant.size,
        stamp,
        headers=req.headers,
        message_id=grant.message_id,
    )
    manifest = build_manifest(ctx, received, ttl=grant.ttl, content_type=grant.content_type)
    # A multipart object's whole SHA-256 is the producer's word unless read back (_assemble).
    verified = not grant.upload_id or ctx.settings.direct_verify_sha256
    stored = await commit_or_discard(
        ctx,
        manifest,
        kind="direct",
        user=grant.owner,
        hold=grant_hold(ctx, grant),
        verified=verified,
    )
    await ctx.quotas.release(grant.owner, grant.quota_ident)
    return created_response(ctx, request, stored.manifest, stored.created)
