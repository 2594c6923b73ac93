"""Direct-transfer routes: upload grants and their commit (redirects: `Direct.redirect_url`).

    POST /direct/grant/{topic}   {"size", "sha256", "part_size", "parts": [hex...],
                                  "id"?, "ttl"?, "content_type"?}
        -> 201 {"grant", "expires", "part_size", "urls": [...]}
    POST /direct/commit          {"grant", "etags": [...], "headers"?: [[name, value]...]}
        -> 201 {"id", "url", "topic", "size", "sha256", "created"}
    POST /direct/commit          {"grant", "abandon": true}
        -> 200 {"detail"}: what was uploaded is removed (201 when already committed)

Both need write access to the topic (checked again at commit: a grant is not a credential).
404 when the gateway has no `OFFLOAD_S3_PUBLIC_URL` (clients fall back to the proxied
upload, as with an older gateway that has no such route). See gateway/direct/_transfers.py for
what is verified and what is trusted.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from client.protocol import MessageId, Topic, data_key, loads_object

from ..core import (
    COMMON_RESPONSES,
    BadRequest,
    Conflict,
    Forbidden,
    JSONAnswer,
    PayloadTooLarge,
)
from ..direct import (
    MAX_REQUEST_BYTES,
    Grant,
    GrantRequest,
    b64_of_hex,
    parse_commit_request,
    parse_grant_request,
)
from ..ingest import MAX_KEY_BYTES, grant_record_body, now_ms, parse_content_type, parse_topic
from ..storage import DirectStore
from . import _responses
from ._context import Context, Ctx
from ._direct_commit import claimed, commit, committed, discard_grant, grant_hold
from ._routes import created_response

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
    429: {
        "description": "too many open uploads or reserved bytes for this user "
        "(OFFLOAD_MAX_OPEN_UPLOADS, OFFLOAD_MAX_RESERVED_BYTES), or failed logins; "
        "`Retry-After` says when to ask again"
    },
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
                        "abandon": {"type": "boolean"},
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


async def _open(
    ctx: Context,
    store: DirectStore,
    topic: Topic,
    req: GrantRequest,
    content_type: str | None,
    owner: str | None,
) -> Grant:
    """A new grant: its key, its multipart upload (several parts) and its quota record."""
    stamp = now_ms()
    key = data_key(topic, stamp, uuid.uuid4().hex)
    if len(key.encode("utf-8")) + 16 > MAX_KEY_BYTES:
        raise BadRequest("topic too long: its object key would exceed 1024 bytes")
    upload_id = ""
    if not req.single:
        upload_id = await ctx.service.workers.store.run(
            store.start_multipart, key, content_type or "application/octet-stream"
        )
    grant = Grant(
        topic,
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
        int(time.time()) + ctx.direct.grant_ttl,
        owner,
    )
    # Counted until its commit or abandon; the sweeper aborts the upload of one never ended.
    record = grant_record_body(key, upload_id)
    await ctx.quotas.record(
        owner, grant.quota_ident, expires=grant.expires, size=req.size, body=record
    )
    return grant


@router.post(
    "/direct/grant/{topic:path}",
    status_code=201,
    response_model=_responses.UploadGrant,
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
    # Per-user caps (429 with Retry-After), checked and recorded as one step per user.
    async with ctx.quotas.admitting(owner, req.size):
        grant = await _open(ctx, store, parsed_topic, req, content_type, owner)
    try:  # the stored-bytes quota (413), held before any URL exists: grants commit later
        await grant_hold(ctx, grant).reserve(req.size, until=grant.expires * 1000)
    except BaseException:
        await discard_grant(ctx, store, grant)
        raise
    seconds = ctx.direct.grant_ttl
    # Off the event loop: 10,000 SigV4 signatures take seconds of CPU.
    urls = await ctx.service.workers.hashing.run(_urls, store, grant, req, seconds)
    body = {
        "grant": ctx.signer.seal(grant.claims()),
        "expires": grant.expires,
        "part_size": req.part_size,
        "urls": urls,
    }
    return JSONAnswer(body, status_code=201, headers={"Cache-Control": "no-store"})


@router.post(
    "/direct/commit",
    status_code=201,
    response_model=_responses.Stored,
    responses={
        **_ERRORS,
        200: {
            "description": 'abandoned (`{"abandon": true}`): what was uploaded for the '
            "grant is removed",
            "model": _responses.Abandoned,
        },
    },
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
    async with claimed(ctx, grant) as held:
        # Committed before (its answer lost, say), or by the holder before us.
        done = await committed(ctx, grant)
        if done is not None:
            return created_response(ctx, request, done, False)
        if not held:
            raise Conflict(
                "another commit or abandon of this grant is under way; nothing changed "
                "(ask again for its outcome)"
            )
        return await commit(ctx, request, store, grant, req)
