"""`PUT /msg/{id}?topic=T`: store a raw payload under a client-chosen id, of any size.

The native client's upload. The hop-client route (`POST /topic/{topic}+oversized`) takes a
BSON document, which the format caps at 2 GiB (a signed 32-bit length); this one takes the
payload bytes as they are, so the only limit is `OFFLOAD_MAX_BODY_BYTES`. Why a new path
rather than a second body type on the hop route: the two can never be confused (hop-client
sends no Content-Type at all), and a gateway that predates this route answers 405 (a `GET`
and `HEAD` route exists at the path), which tells the client to fall back to BSON.

It is the BSON route with a different framing, nothing else: the same write check on the
topic, the same ingest (`receive_raw`: streamed to the store while it arrives, hashed in the
same pass, memory bounded by the multipart part size), the same manifest and commit. So the
id rules are the same too: the same id and content again is 201 with `created: false`; the
same id with other content or topic is 409. Nothing is published: the client publishes its
own placeholder.

    curl -T payload.bin "$GW/msg/$(uuidgen)?topic=sensors/cam1&ttl=3600"

Headers stored beside the payload (the hop document's `headers`; the client sends the
message's user properties) travel as `X-Offload-Header: NAME=VALUE`, both sides
percent-encoded, repeatable, in order. `X-Offload-Sha256` (optional, hex) is checked
against the bytes received: a body damaged on the way is refused and nothing is kept.
`OPTIONS /msg/{id}` lists `PUT` in `Allow`, so a client can tell this gateway from an older
one before it sends a large body.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any
from urllib.parse import unquote, unquote_to_bytes

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from client.protocol import MessageId

from ..core import COMMON_RESPONSES, BadRequest
from ..ingest import parse_content_type, parse_topic
from ._context import Ctx
from ._ingest import ID_HEADER, build_manifest, commit_or_discard
from ._receive import receive_raw
from ._responses import Stored, headers_only
from ._routes import Ttl, check_declared_length, created_response

router = APIRouter()

HEADER_FIELD = "x-offload-header"
SHA256_FIELD = "x-offload-sha256"
#: Stored headers one request may carry; their bytes are bounded by OFFLOAD_MAX_HEADER_BYTES.
MAX_HEADERS = 1000
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
ALLOW = "GET, HEAD, OPTIONS, PUT"

_ERRORS: dict[int | str, dict[str, Any]] = {
    **COMMON_RESPONSES,
    400: {"description": "malformed id, topic, header or checksum (reason in `detail`)"},
    401: {"description": "authentication required"},
    403: {"description": "not allowed to write this topic"},
    409: {"description": "id already stored with other content or topic"},
    413: {"description": "body larger than the configured maximum"},
    503: {"description": "object store unavailable; nothing was kept"},
}

TopicParam = Annotated[str, Query(min_length=1, description="the MQTT topic the message is for")]


def parse_stored_headers(fields: list[str], *, max_bytes: int) -> tuple[tuple[str, bytes], ...]:
    """`X-Offload-Header: NAME=VALUE` fields as (name, value bytes), in order.

    Both sides are percent-encoded (a value may be any bytes, as in a hop document); a name
    must be UTF-8 and not `_id` (the id is the path's). Bounded in count and in bytes before
    anything is stored.

    Raises:
        BadRequest: a field is malformed, or there are too many or too large.
    """
    if len(fields) > MAX_HEADERS:
        raise BadRequest(f"more than {MAX_HEADERS} {HEADER_FIELD} fields")
    out: list[tuple[str, bytes]] = []
    total = 0
    for number, field in enumerate(fields, 1):
        raw_name, equals, raw_value = field.strip(" \t").partition("=")
        if not equals or not raw_name:
            raise BadRequest(f"{HEADER_FIELD} {number} must be NAME=VALUE, percent-encoded")
        try:
            name = unquote(raw_name, errors="strict")
        except UnicodeDecodeError as exc:
            raise BadRequest(f"{HEADER_FIELD} {number}: the name is not UTF-8") from exc
        if name == ID_HEADER:
            raise BadRequest(f"{HEADER_FIELD} {number}: {ID_HEADER!r} is the id in the path")
        value = unquote_to_bytes(raw_value)
        total += len(name.encode("utf-8")) + len(value)
        if total > max_bytes:
            raise BadRequest(f"{HEADER_FIELD} fields exceed {max_bytes} bytes")
        out.append((name, value))
    return tuple(out)


def parse_sha256(raw: str | None) -> str | None:
    """The optional `X-Offload-Sha256`, lowercase; 400 unless it is 64 hex digits."""
    if raw is None:
        return None
    value = raw.strip(" \t")
    if _HEX64.fullmatch(value) is None:
        raise BadRequest(f"{SHA256_FIELD} must be 64 hex digits, not {raw!r:.80}")
    return value.lower()


@router.options(
    "/msg/{message_id}",
    status_code=204,
    responses=headers_only(204, "the methods this path takes (`PUT` included)", "Allow"),
    tags=["offload"],
)
async def raw_upload_options(message_id: str) -> Response:
    """The methods `/msg/{id}` takes (`Allow`); no credentials needed, nothing looked up.

    A client asks before it streams a large body: a gateway without `PUT` (405 here too)
    then costs it one round trip instead of the body sent for nothing.
    """
    return Response(status_code=204, headers={"Allow": ALLOW})


@router.put(
    "/msg/{message_id}",
    status_code=201,
    response_model=Stored,
    responses=_ERRORS,
    tags=["offload"],
)
async def upload_raw(
    message_id: str, request: Request, ctx: Ctx, topic: TopicParam, ttl: Ttl = None
) -> Response:
    """Store the body as the payload of message `message_id` on `topic` (no publish).

    The body streams to storage as it arrives; `Content-Length` or chunked. `ttl`
    (seconds, capped by the gateway's maximum) sets when it expires. Stored headers:
    `X-Offload-Header: NAME=VALUE` (percent-encoded, repeatable). `X-Offload-Sha256`:
    the payload's SHA-256, checked before anything is kept. Answers as the hop route:
    201 `{id, url, topic, size, sha256, created}`.
    """
    parsed_id = MessageId.parse(message_id)
    parsed_topic = parse_topic(topic, max_bytes=ctx.settings.max_topic_bytes)
    await ctx.authorize_write(request, parsed_topic)
    user = await ctx.authenticate(request)  # decided by authorize_write: not asked again
    declared = check_declared_length(request, ctx.settings.max_body_bytes)
    # Every header is checked before the body is read: a refusal costs the client nothing.
    headers = parse_stored_headers(
        request.headers.getlist(HEADER_FIELD), max_bytes=ctx.settings.max_header_bytes
    )
    expected = parse_sha256(request.headers.get(SHA256_FIELD))
    content_type = parse_content_type(request.headers.get("content-type"), source="Content-Type")
    async with ctx.retention.holding(user) as hold:
        received = await receive_raw(
            ctx,
            parsed_topic,
            request.stream(),
            length=-1 if declared is None else declared,
            content_type=content_type,
            hold=hold,
        )
        if expected is not None and received.sha256 != expected:
            await ctx.service.discard(received.data_key)
            raise BadRequest(
                f"body hashes to {received.sha256}, not the {SHA256_FIELD} {expected}; "
                "nothing was kept"
            )
        # The id first, as the client library puts it in a hop document: both routes store
        # the same headers for the same message.
        received = dataclasses.replace(
            received, message_id=parsed_id, headers=((ID_HEADER, parsed_id.bytes), *headers)
        )
        manifest = build_manifest(ctx, received, ttl=ttl, content_type=content_type)
        stored = await commit_or_discard(ctx, manifest, kind="raw", user=user, hold=hold)
    return created_response(ctx, request, stored.manifest, stored.created)
