"""Retention's routes: link instead of upload, confirm for a group, read one's usage.

    POST /msg/{id}/link?topic=T[&ttl=N]   the account's stored copy, linked (201), or 404
    POST /msg/{id}/confirm?group=G        a group's confirmation, after a verified fetch
    GET  /usage                           the caller's stored and held bytes

`link` is the question a client asks before it uploads (as git-lfs's batch API and OCI's
blob mount do): `X-Offload-Sha256` and `X-Offload-Size` name the payload, the rest is what
`PUT /msg/{id}` takes without the body (`X-Offload-Header`, `Content-Type`, `ttl`). When the
caller's account stores that payload the message is committed at once, linked to it, and
the answer is the upload's (201); otherwise 404 and nothing is kept: upload it. Only the
caller's own account is looked at, so the answer for a payload another account stores is
the same 404 as for one nobody stores.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from client.protocol import Manifest, MessageId, check_group, data_key

from ..core import COMMON_RESPONSES, BadRequest, JSONAnswer, NotFound
from ..ingest import MAX_KEY_BYTES, now_ms, parse_ascii_int, parse_content_type, parse_topic
from ..retention import CONFIRMATIONS, DELETED
from ._context import Ctx
from ._deps import Access, Service
from ._ingest import ID_HEADER, build_manifest, commit_or_discard
from ._receive import Received
from ._responses import AccountUsage, Confirmed, Stored
from ._routes import Ttl, created_response
from ._routes_raw import HEADER_FIELD, SHA256_FIELD, TopicParam, parse_sha256, parse_stored_headers

router = APIRouter()

SIZE_FIELD = "x-offload-size"

_ERRORS: dict[int | str, dict[str, Any]] = {
    **COMMON_RESPONSES,
    400: {"description": "malformed id, topic, group or header (reason in `detail`)"},
    401: {"description": "authentication required"},
    403: {"description": "not allowed for this topic, or not a member of the group"},
    404: {"description": "unknown message; for `link`: not stored by this account"},
    409: {"description": "id already stored with other content or topic"},
    503: {"description": "object store unavailable"},
}

GroupParam = Annotated[str, Query(min_length=1, max_length=64, description="the group")]


@router.post(
    "/msg/{message_id}/link",
    status_code=201,
    response_model=Stored,
    responses=_ERRORS,
    tags=["retention"],
)
async def link(
    message_id: str, request: Request, ctx: Ctx, topic: TopicParam, ttl: Ttl = None
) -> Response:
    """Commit message `message_id` with a payload the caller's account already stores
    (named by `X-Offload-Sha256` and `X-Offload-Size`); 404 when it stores none."""
    parsed_id = MessageId.parse(message_id)
    parsed_topic = parse_topic(topic, max_bytes=ctx.settings.max_topic_bytes)
    await ctx.authorize_write(request, parsed_topic)
    user = await ctx.authenticate(request)
    sha256 = parse_sha256(request.headers.get(SHA256_FIELD))
    raw_size = request.headers.get(SIZE_FIELD)
    if sha256 is None or raw_size is None:
        raise BadRequest(f"link needs {SHA256_FIELD} and {SIZE_FIELD}")
    size = parse_ascii_int(raw_size, SIZE_FIELD)
    headers = parse_stored_headers(
        request.headers.getlist(HEADER_FIELD), max_bytes=ctx.settings.max_header_bytes
    )
    content_type = parse_content_type(request.headers.get("content-type"), source="Content-Type")
    stamp = now_ms()
    home = data_key(parsed_topic, stamp, uuid.uuid4().hex)  # its own key: no object there
    if len(home.encode("utf-8")) + 16 > MAX_KEY_BYTES:
        raise BadRequest("topic too long: its object key would exceed 1024 bytes")
    received = Received(
        parsed_topic,
        home,
        sha256,
        size,
        stamp,
        headers=((ID_HEADER, parsed_id.bytes), *headers),
        message_id=parsed_id,
    )
    template: Manifest = build_manifest(ctx, received, ttl=ttl, content_type=content_type)
    linked = await ctx.retention.link(template, user)
    if linked is None:
        raise NotFound(
            "no payload with this SHA-256 and size is stored for this account: upload it"
        )
    stored = await commit_or_discard(ctx, linked, kind="link", user=user)
    return created_response(ctx, request, stored.manifest, stored.created)


@router.post(
    "/msg/{message_id}/confirm",
    response_model=Confirmed,
    responses=_ERRORS,
    tags=["retention"],
)
async def confirm(
    message_id: str, group: GroupParam, service: Service, access: Access, ctx: Ctx
) -> Response:
    """Confirm, for `group`, that its consumer has the message's payload, verified. Once
    every group the message waits for has confirmed, it is deleted."""
    parsed_id = MessageId.parse(message_id)
    check_group(group)
    await access.authenticate()  # before the lookup: no 401/404 oracle for unknown callers
    manifest = await service.load(parsed_id)
    user = await access.read(manifest.topic)
    done = await ctx.retention.confirm(manifest, group, user)
    CONFIRMATIONS.labels("new" if done.new else "again" if done.counted else "ignored").inc()
    if done.complete:
        await service.forget(manifest)
        DELETED.labels("confirmed").inc()
    body = {
        "id": str(manifest.id),
        "group": group,
        "counted": done.counted,
        "remaining": list(done.remaining),
        "deleted": done.complete,
        "detail": done.reason,
    }
    return JSONAnswer(body)


@router.get("/usage", response_model=AccountUsage, responses=COMMON_RESPONSES, tags=["retention"])
async def usage(request: Request, ctx: Ctx) -> Response:
    """The caller's account: payload bytes stored (a shared payload once), bytes held by
    uploads in flight, and the quota."""
    user = await ctx.authenticate(request)
    found = await ctx.retention.usage(user)
    body = {
        "user": user,
        "counted": found is not None,
        "stored_bytes": None if found is None else found.stored,
        "held_bytes": None if found is None else found.held,
        "limit_bytes": None if found is None else found.limit,
    }
    return JSONAnswer(body, headers={"Cache-Control": "no-store"})
