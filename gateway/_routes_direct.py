"""Direct-transfer routes: upload grants and their commit (redirects: `Direct.redirect_url`).

    POST /direct/grant/{topic}   {"size", "sha256", "part_size", "parts": [hex...],
                                  "id"?, "ttl"?, "content_type"?}
        -> 201 {"grant", "expires", "part_size", "urls": [...]}
    POST /direct/commit          {"grant", "etags": [...], "headers"?: [[name, value]...]}
        -> 201 {"id", "url", "topic", "size", "sha256", "created"}

Both need write access to the topic (checked again at commit: a grant is not a credential).
404 when the gateway has no `OFFLOAD_S3_PUBLIC_URL` (clients fall back to the proxied
upload, as with an older gateway that has no such route). See gateway/_direct.py for
what is verified and what is trusted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Generator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from client.protocol import Manifest, MessageId, data_key, loads_object, parse_data_key

from ._context import Context, Ctx
from ._direct import (
    MAX_REQUEST_BYTES,
    CommitRequest,
    Grant,
    GrantRequest,
    b64_of_hex,
    parse_commit_request,
    parse_grant_request,
)
from ._errors import (
    COMMON_RESPONSES,
    BadRequest,
    Conflict,
    Forbidden,
    PayloadTooLarge,
    StorageUnavailable,
)
from ._ingest import Received, build_manifest, commit_or_discard
from ._media import parse_content_type
from ._quotas import grant_record_body
from ._routes import created_response
from ._service import MAX_KEY_BYTES, now_ms, parse_topic
from .storage import DirectStore, ObjectInfo, ObjectStore, StoreError

log = logging.getLogger("gateway")

router = APIRouter()

_ERRORS: dict[int | str, dict[str, Any]] = {
    **COMMON_RESPONSES,
    400: {"description": "malformed request, or an object that does not match its grant"},
    403: {"description": "not allowed to write this topic, or a grant expired or altered"},
    409: {
        "description": "id already stored with other content, or another commit or abandon "
        "of this grant came first"
    },
    404: {"description": "direct transfers are off on this gateway"},
    413: {"description": "size larger than the configured maximum"},
}


_HEX = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
_GRANT_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["size", "sha256", "part_size", "parts"],
                    "properties": {
                        "size": {"type": "integer", "minimum": 0},
                        "sha256": _HEX,
                        "part_size": {"type": "integer", "minimum": 1},
                        "parts": {"type": "array", "items": _HEX, "maxItems": 10000},
                        "id": {"type": "string", "format": "uuid"},
                        "ttl": {"type": "integer", "minimum": 1},
                        "content_type": {"type": "string"},
                    },
                }
            }
        },
    }
}
_COMMIT_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["grant"],
                    "properties": {
                        "grant": {"type": "string"},
                        "etags": {"type": "array", "items": {"type": "string"}},
                        "headers": {
                            "type": "array",
                            "items": {
                                "type": "array",
                                "items": {"type": "string"},
                                "minItems": 2,
                                "maxItems": 2,
                            },
                        },
                    },
                }
            }
        },
    }
}


async def _json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object, read with a bound (never more than MAX_REQUEST_BYTES)."""
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_REQUEST_BYTES:
                raise PayloadTooLarge(f"request body exceeds {MAX_REQUEST_BYTES} bytes")
    except ClientDisconnect as exc:
        raise BadRequest("client disconnected before the body was complete") from exc
    try:
        return loads_object(bytes(body), max_bytes=MAX_REQUEST_BYTES)
    except ValueError as exc:
        raise BadRequest(f"request body: {exc}") from exc


def _urls(store: DirectStore, grant: Grant, req: GrantRequest, seconds: int) -> list[str]:
    """One presigned PUT per part; pure signing, no network call per URL."""
    if req.single:
        return [store.presign_put(grant.key, sha256_b64=b64_of_hex(req.sha256), seconds=seconds)]
    return [
        store.presign_put(
            grant.key,
            sha256_b64=b64_of_hex(digest),
            seconds=seconds,
            upload_id=grant.upload_id,
            part_number=number,
        )
        for number, digest in enumerate(req.parts, 1)
    ]


@router.post(
    "/direct/grant/{topic:path}",
    status_code=201,
    responses=_ERRORS,
    tags=["direct"],
    openapi_extra=_GRANT_BODY,
)
async def grant_upload(topic: str, request: Request, ctx: Ctx) -> Response:
    """Presigned store URLs for one payload's parts, and the grant to commit it with."""
    store = ctx.direct.require()
    parsed_topic = parse_topic(topic, max_bytes=ctx.settings.max_topic_bytes)
    await ctx.authorize_write(request, parsed_topic)
    owner = await ctx.authenticate(request)  # decided by authorize_write: not asked again
    req = parse_grant_request(await _json_body(request), max_size=ctx.settings.max_body_bytes)
    content_type = parse_content_type(req.content_type, source="content_type")
    await ctx.quotas.check(owner, req.size)  # per-user caps: 429 with Retry-After
    stamp = now_ms()
    key = data_key(parsed_topic, stamp, uuid.uuid4().hex)
    if len(key.encode("utf-8")) + 16 > MAX_KEY_BYTES:
        raise BadRequest("topic too long: its object key would exceed 1024 bytes")
    upload_id = ""
    if not req.single:
        upload_id = await ctx.service.workers.store.run(
            store.start_multipart, key, content_type or "application/octet-stream"
        )
    seconds = ctx.direct.grant_ttl
    grant = Grant(
        parsed_topic,
        key,
        upload_id,
        req.size,
        req.sha256,
        len(req.parts),
        # Always an id: a commit repeated (its answer lost) must find the same message.
        req.message_id or MessageId.new(),
        req.ttl,
        content_type,
        stamp,
        int(time.time()) + seconds,
        owner,
    )
    # Counted until its commit or abandon; the sweeper aborts the upload of one never ended.
    record = grant_record_body(key, upload_id)
    await ctx.quotas.record(
        owner, grant.quota_ident, expires=grant.expires, size=req.size, body=record
    )
    # Off the event loop: 10,000 SigV4 signatures take seconds of CPU.
    urls = await ctx.service.workers.hashing.run(_urls, store, grant, req, seconds)
    body = {
        "grant": ctx.signer.seal(grant.claims()),
        "expires": grant.expires,
        "part_size": req.part_size,
        "urls": urls,
    }
    return JSONResponse(body, status_code=201, headers={"Cache-Control": "no-store"})


async def _discard(ctx: Context, store: DirectStore, grant: Grant) -> None:
    """Remove whatever the grant's uploader placed (best effort: the sweeper is the backstop)."""
    if grant.upload_id:
        try:
            await ctx.service.workers.store.run(store.abort_multipart, grant.key, grant.upload_id)
        except StoreError as exc:  # the parts stay until the bucket's lifecycle rule
            log.warning("could not abort upload %s of %s: %s", grant.upload_id, grant.key, exc)
    await ctx.service.discard(grant.key)
    await ctx.quotas.release(grant.owner, grant.quota_ident)


async def _assemble(ctx: Context, store: DirectStore, grant: Grant, req: CommitRequest) -> None:
    """Join the parts and check the object against the grant; refuse and remove on mismatch."""
    run = ctx.service.workers.store.run
    if grant.upload_id:
        if len(req.etags) != grant.parts:
            await _discard(ctx, store, grant)
            raise BadRequest(f"{len(req.etags)} ETags for {grant.parts} parts; nothing kept")
        problem = await run(store.complete_multipart, grant.key, grant.upload_id, req.etags)
        # NoSuchUpload: completed by an earlier commit whose answer was lost; the object decides.
        if problem is not None and not problem.startswith("NoSuchUpload"):
            await _discard(ctx, store, grant)
            raise BadRequest(f"the store refused the parts ({problem}); nothing kept")
    size = await run(store.size, grant.key)
    if size is None:
        await _discard(ctx, store, grant)
        raise BadRequest("no object was uploaded for this grant; nothing kept")
    if size != grant.size:
        await _discard(ctx, store, grant)
        raise BadRequest(f"object has {size} bytes, the grant {grant.size}; nothing kept")
    if grant.upload_id and ctx.settings.direct_verify_sha256:
        actual = await _read_back(ctx, grant.key)
        if actual != grant.sha256:
            await _discard(ctx, store, grant)
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


async def _committed(ctx: Context, grant: Grant) -> Manifest | None:
    """The message this grant committed, None when it has not (yet)."""
    if grant.message_id is None:
        return None
    done = await ctx.service.find(grant.message_id)
    if done is None:
        return None
    # The same object, perhaps moved to its commit's hour (`_restamp`): the same token.
    mine, theirs = parse_data_key(grant.key), parse_data_key(done.data_key)
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
async def _claimed(ctx: Context, grant: Grant) -> AsyncIterator[bool]:
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


@router.post(
    "/direct/commit",
    status_code=201,
    responses=_ERRORS,
    tags=["direct"],
    openapi_extra=_COMMIT_BODY,
)
async def commit_upload(request: Request, ctx: Ctx) -> Response:
    """Check the uploaded object against its grant, then store manifest and index."""
    store = ctx.direct.require()
    # Before the body: SCRAM's first round trip has none, and must get its challenge.
    await ctx.authenticate(request)
    req = parse_commit_request(
        await _json_body(request), max_header_bytes=ctx.settings.max_header_bytes
    )
    claims = ctx.signer.unseal(req.token)
    if isinstance(claims, str):
        raise Forbidden(claims)
    grant = Grant.from_claims(claims)
    await ctx.authorize_write(request, grant.topic)
    async with _claimed(ctx, grant) as held:
        # Committed before (its answer lost, say), or by the holder before us.
        done = await _committed(ctx, grant)
        if done is not None:
            return created_response(ctx, request, done, False)
        if not held:
            raise Conflict(
                "another commit or abandon of this grant is under way; nothing changed "
                "(ask again for its outcome)"
            )
        return await _commit(ctx, request, store, grant, req)


async def _commit(
    ctx: Context, request: Request, store: DirectStore, grant: Grant, req: CommitRequest
) -> Response:
    """The grant's one commit (or abandon): refuse and remove, or store manifest and index."""
    if grant.expired():
        await _discard(ctx, store, grant)
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
    stored = await commit_or_discard(ctx, manifest, kind="direct")
    await ctx.quotas.release(grant.owner, grant.quota_ident)
    return created_response(ctx, request, stored.manifest, stored.created)
