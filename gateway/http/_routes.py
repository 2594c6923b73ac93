"""The hop-client offload API and raw payload reads.

POST /topic/{topic}+oversized   BSON upload document -> 201
GET|HEAD /msg/{id}              BSON download document (hop-client's nested shape)
GET|HEAD /msg/{id}/payload      raw payload bytes, Range, ETag
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any
from urllib.parse import quote, unquote

from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse

from client.protocol import Manifest, MessageId, encode_download

from ..core import (
    COMMON_RESPONSES,
    DOWNLOADS_ABANDONED,
    BadRequest,
    JSONAnswer,
    PayloadTooLarge,
    RequestEnd,
    current_request,
)
from ..ingest import (
    OVERSIZED_SUFFIX,
    PAYLOAD_SECURITY_HEADERS,
    is_inline,
    parse_ascii_int,
    parse_topic,
    served_type,
)
from ._context import Context, Ctx
from ._deps import Access, DirectTransfers, Service
from ._ingest import build_manifest, commit_or_discard, message_url
from ._ranges import parse_range
from ._receive import receive_envelope
from ._responses import BSON_DOCUMENT, PAYLOAD, Stored, headers_only

router = APIRouter()
log = logging.getLogger("gateway")

#: The hop route as clients call it (and as /openapi.json documents it).
HOP_PATH = f"/topic/{{topic}}{OVERSIZED_SUFFIX}"

Ttl = Annotated[
    int | None,
    Query(ge=1, le=2**32 - 1, description="seconds until the payload expires (MQTT expiry)"),
]

_ERRORS: dict[int | str, dict[str, Any]] = {
    **COMMON_RESPONSES,
    400: {"description": "malformed request (reason in `detail`)"},
    401: {"description": "authentication required"},
    403: {"description": "not allowed for this topic"},
    404: {"description": "unknown or expired message"},
    409: {"description": "id already stored with other content"},
    413: {"description": "body larger than the configured maximum"},
    503: {"description": "object store or broker unavailable"},
}


_HEAD_DOCUMENT = headers_only(
    200, "what GET would answer, without the body", "Content-Length", "ETag", "X-Offload-Sha256"
)
_HEAD_PAYLOAD = headers_only(
    200,
    "what GET would answer, without the body",
    "Content-Length",
    "ETag",
    "X-Offload-Sha256",
    "X-Offload-Topic",
    "Accept-Ranges",
)


def check_declared_length(request: Request, limit: int) -> int | None:
    """Reject a too-large body before reading it; the declared length, if any."""
    declared = request.headers.get("content-length")
    if declared is None:
        return None
    length = parse_ascii_int(declared, "Content-Length")
    if length > limit:
        raise PayloadTooLarge(f"body of {length} bytes exceeds the limit of {limit} bytes")
    return length


def created_response(ctx: Context, request: Request, manifest: Manifest, created: bool) -> Response:
    url = message_url(ctx, request, manifest.id)
    body = {
        "id": str(manifest.id),
        "url": url,
        "topic": manifest.topic.value,
        "size": manifest.size,
        "sha256": manifest.sha256,
        "created": created,
    }
    return JSONAnswer(
        body, status_code=201, headers={"Location": f"{ctx.base_path}/msg/{manifest.id}"}
    )


@router.post(
    "/topic/{topic:path}",  # documented as called: /topic/{topic}+oversized (gateway._app)
    status_code=201,
    response_model=Stored,
    responses=_ERRORS,
    tags=["offload"],
)
async def upload_envelope(
    topic: str, request: Request, ctx: Ctx, access: Access, ttl: Ttl = None
) -> Response:
    """Store a hop-client BSON upload document `{message, headers, key?}`.

    The message id is the `_id` header (16 raw UUID bytes or 36-character text); without
    one the gateway assigns an id. The payload streams to storage as it arrives. `ttl`
    (seconds, capped by the gateway's maximum) sets when it expires; default: the gateway's.
    """
    if not topic.endswith(OVERSIZED_SUFFIX):
        raise BadRequest(f"upload path must be /topic/<topic>{OVERSIZED_SUFFIX}")
    parsed_topic = parse_topic(
        topic[: -len(OVERSIZED_SUFFIX)], max_bytes=ctx.settings.max_topic_bytes
    )
    user = await access.write(parsed_topic)
    check_declared_length(request, ctx.settings.max_body_bytes)
    async with ctx.retention.holding(user) as hold:
        received = await receive_envelope(ctx, parsed_topic, request.stream(), hold=hold)
        manifest = build_manifest(ctx, received, ttl=ttl)
        stored = await commit_or_discard(ctx, manifest, kind="envelope", user=user, hold=hold)
    return created_response(ctx, request, stored.manifest, stored.created)


async def _stream(
    request: Request, head: bytes, body: AsyncIterator[bytes | memoryview], tail: bytes
) -> AsyncIterator[bytes | memoryview]:
    """`head`, the object's `body` from the store, `tail`; stopped once the client has gone.

    uvicorn (ASGI spec 2.3) turns every send after a disconnect into a no-op, and the
    disconnect does not always cancel the response (a store that keeps the stream fed
    never lets it wait): left alone, a download its client dropped at once reads the whole
    object from the store (tests/test_abandoned_downloads.py). So after each piece the
    stream looks at whether the request's `receive` has handed out the disconnect
    (`RequestEnd.gone`: Starlette's response listens for it; an attribute read, no
    await); once it has, the stream ends there, and the request's end closes the store
    read and gives back its transfer slot (`close_at_request_end`). The end of a stream
    cut short is never a whole fetch: `then_forget` looks at the same connection.
    Counted in `offload_downloads_abandoned_total`, as is a stream the disconnect
    cancelled (the listener notes `gone` before it cancels; a shutdown's cancellation is
    not counted).
    """
    end = current_request() or RequestEnd()  # outside the middleware: never gone
    if head:
        yield head
    try:
        async for piece in body:
            yield piece
            if end.gone:
                DOWNLOADS_ABANDONED.inc()
                log.info("%s: the client has gone; download stopped", request.url.path)
                return
    except asyncio.CancelledError:
        if end.gone:  # Starlette's listener saw the disconnect and cancelled us (not shutdown)
            DOWNLOADS_ABANDONED.inc()
        raise
    if tail:
        yield tail


def _payload_headers(manifest: Manifest, media_type: str) -> dict[str, str]:
    """Headers of a payload answer; the payload can never act as a page of our origin."""
    headers = {
        "ETag": f'"{manifest.sha256}"',
        "Accept-Ranges": "bytes",
        "X-Offload-Sha256": manifest.sha256,
        "X-Offload-Topic": manifest.topic.value.encode("utf-8").decode("latin-1"),
        "Cache-Control": "private, max-age=0, must-revalidate",
        **PAYLOAD_SECURITY_HEADERS,
    }
    if manifest.filename:
        headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{quote(manifest.filename)}"
    elif not is_inline(media_type):
        headers["Content-Disposition"] = "attachment"
    return headers


#: The topic a fetching subscriber got the placeholder on, percent-encoded UTF-8 (the
#: client library sends it). Not `X-Offload-Topic`: that answer header is raw UTF-8.
HANDED_TOPIC_FIELD = "X-Offload-Placeholder-Topic"


def handed_topic(request: Request) -> str | None:
    """`X-Offload-Placeholder-Topic`, decoded; None when absent, repeated or not UTF-8.

    See `OffloadService.then_forget`: only a fetch for the message's own topic deletes it.
    """
    values = request.headers.getlist(HANDED_TOPIC_FIELD)
    if len(values) != 1:
        return None
    try:
        return unquote(values[0], errors="strict")
    except UnicodeDecodeError:
        return None


def _etag_matches(request: Request, manifest: Manifest) -> bool:
    header = request.headers.get("if-none-match")
    if not header:
        return False
    tags = {t.strip().removeprefix("W/") for t in header.split(",")}
    return "*" in tags or f'"{manifest.sha256}"' in tags


# One decorator per method: a multi-method route gets one operationId for both, which
# FastAPI reports as a duplicate (and OpenAPI tools reject).
@router.get(
    "/msg/{message_id}",
    response_class=Response,
    responses={**_ERRORS, **BSON_DOCUMENT},
    tags=["offload"],
)
@router.head(
    "/msg/{message_id}",
    response_class=Response,
    responses={**_ERRORS, **_HEAD_DOCUMENT},
    tags=["offload"],
)
async def download_envelope(
    message_id: str, request: Request, service: Service, access: Access
) -> Response:
    """The stored message as hop-client expects it: BSON `{message, metadata}`."""
    message = MessageId.parse(message_id)
    await access.authenticate()  # before the lookup: no 401/404 oracle for unknown callers
    manifest = await service.load(message)
    await access.read(manifest.topic)
    head, tail = encode_download(
        manifest.size,
        timestamp_ms=manifest.timestamp,
        headers=manifest.headers,
        key=manifest.key,
        topic=manifest.topic.value,
    )
    headers = {
        "Content-Length": str(len(head) + manifest.size + len(tail)),
        "ETag": f'"bson-{manifest.sha256}"',
        "X-Offload-Sha256": manifest.sha256,
        **PAYLOAD_SECURITY_HEADERS,
    }
    if request.method == "HEAD":
        return Response(status_code=200, headers=headers, media_type="application/bson")
    body = await service.open_payload(manifest)
    return StreamingResponse(
        service.then_forget(
            manifest,
            _stream(request, head, body, tail),
            handed_topic=handed_topic(request),
            disconnected=request.is_disconnected,
        ),
        headers=headers,
        media_type="application/bson",
    )


@router.get(
    "/msg/{message_id}/payload",
    response_class=Response,
    responses={
        **_ERRORS,
        **PAYLOAD,
        307: {
            "description": "direct transfers: the payload at a presigned store URL",
            "headers": {"Location": {"schema": {"type": "string"}}},
        },
    },
    tags=["offload"],
)
@router.head(
    "/msg/{message_id}/payload",
    response_class=Response,
    responses={**_ERRORS, **_HEAD_PAYLOAD, 304: PAYLOAD[304]},
    tags=["offload"],
)
async def download_payload(
    message_id: str,
    request: Request,
    service: Service,
    access: Access,
    direct: DirectTransfers,
) -> Response:
    """The raw payload bytes, with Range (206), ETag (SHA-256) and If-None-Match (304)."""
    message = MessageId.parse(message_id)
    await access.authenticate()  # before the lookup: no 401/404 oracle for unknown callers
    manifest = await service.load(message)
    await access.read(manifest.topic)
    media_type = served_type(manifest.content_type)
    headers = _payload_headers(manifest, media_type)
    if _etag_matches(request, manifest):
        return Response(status_code=304, headers=headers)
    if request.method == "GET":  # direct transfers: the store sends the bytes (HEAD stays here)
        url = direct.redirect_url(manifest, delete_after_fetch=service.delete_after_fetch)
        if url is not None:
            return RedirectResponse(url, status_code=307, headers={"Cache-Control": "no-store"})
    byte_range = parse_range(request.headers.get("range"), manifest.size)
    status = 200
    start, length = 0, manifest.size
    if byte_range is not None:
        status = 206
        start, length = byte_range.start, byte_range.length
        headers["Content-Range"] = f"bytes {byte_range.start}-{byte_range.end}/{manifest.size}"
    headers["Content-Length"] = str(length)
    if request.method == "HEAD" or length == 0:
        return Response(status_code=status, headers=headers, media_type=media_type)
    body = await service.open_payload(manifest, start, length if byte_range else None)
    stream = _stream(request, b"", body, b"")
    if byte_range is None:  # only a whole payload counts as fetched (delete-after-fetch)
        stream = service.then_forget(
            manifest,
            stream,
            handed_topic=handed_topic(request),
            disconnected=request.is_disconnected,
        )
    return StreamingResponse(stream, status_code=status, headers=headers, media_type=media_type)
