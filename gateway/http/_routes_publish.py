"""`POST|PUT /publish/{topic}`: put a message of any size on a topic with nothing but HTTP.

    curl --data-binary @photo.jpg -H 'Content-Type: image/jpeg' "$GW/publish/cams/1?qos=1"
    curl -T photo.jpg "$GW/publish/cams/1"                                    (PUT)

The body is the raw payload (its `Content-Type` becomes the message's content type) or, with
`Content-Type: application/bson`, a hop-client upload document. The gateway stores it while
it arrives, then publishes the `_format=external` placeholder itself and answers 201 with
`{"id", "url", "size", "sha256", "topic", "created"}` (`created` is false when the BSON
body named an `_id` already stored with the same content: an idempotent retry).

Placeholder options, as query parameters or headers (the query wins):

    qos=0|1|2          X-Offload-Qos          default 1
    retain=true|false  X-Offload-Retain       default false
    expiry=SECONDS     X-Offload-Expiry       Message Expiry Interval; also the payload's TTL
    prop=NAME:VALUE    X-Offload-Property     user property, repeatable
    filename=NAME      Content-Disposition    served back by /msg/{id}/payload
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from client.protocol import Manifest, Topic

from ..core import COMMON_RESPONSES, JSONAnswer
from ..ingest import (
    PublishOptions,
    check_filename,
    essence,
    filename_from_disposition,
    parse_content_type,
    parse_topic,
)
from ..retention import Hold
from ._announce import placeholder_user_properties, require_broker
from ._context import Context, Ctx
from ._deps import Access
from ._ingest import build_manifest
from ._ingest import publish as publish_message
from ._receive import receive_envelope, receive_raw
from ._responses import Published
from ._routes import check_declared_length

router = APIRouter()


BSON_TYPE = "application/bson"

_ERRORS: dict[int | str, dict[str, Any]] = {
    **COMMON_RESPONSES,
    400: {"description": "malformed request or option (reason in `detail`)"},
    401: {"description": "authentication required"},
    403: {"description": "not allowed to write this topic"},
    409: {"description": "id already stored with other content (BSON body)"},
    413: {"description": "body larger than the configured maximum"},
    503: {"description": "broker or object store unavailable; nothing was kept"},
}


def _media_type(request: Request) -> str | None:
    raw = request.headers.get("content-type")
    # `curl --data-binary @f` sends this by default: it says nothing about the payload, so it
    # counts as no content type rather than being stored as the message's.
    if raw and raw.split(";")[0].strip().lower() == "application/x-www-form-urlencoded":
        return None
    return parse_content_type(raw, source="Content-Type")


# One decorator per method: a multi-method route repeats its operationId in the OpenAPI.
@router.post(
    "/publish/{topic:path}",
    status_code=201,
    response_model=Published,
    responses=_ERRORS,
    tags=["publish"],
)
@router.put(
    "/publish/{topic:path}",
    status_code=201,
    response_model=Published,
    responses=_ERRORS,
    tags=["publish"],
)
async def publish(topic: str, request: Request, ctx: Ctx, access: Access) -> Response:
    """Store the body and publish its placeholder on `topic` (see the module docstring)."""
    parsed_topic = parse_topic(topic, max_bytes=ctx.settings.max_topic_bytes)
    user = await access.write(parsed_topic)
    options = PublishOptions.from_request(request)
    filename = check_filename(
        request.query_params.get("filename")
        or filename_from_disposition(request.headers.get("content-disposition"))
    )
    declared = check_declared_length(request, ctx.settings.max_body_bytes)
    # Refuse before the body arrives: a several-GiB upload that cannot be announced is waste.
    require_broker(ctx)
    content_type = _media_type(request)
    async with ctx.retention.holding(user) as hold:
        manifest, options = await _received(
            ctx, request, parsed_topic, options, filename, declared, content_type, hold
        )
        published = await publish_message(
            ctx, request, manifest, options, kind="publish", user=user, hold=hold
        )
    message = published.manifest
    body = {
        "id": str(message.id),
        "url": published.url,
        "size": message.size,
        "sha256": message.sha256,
        "topic": message.topic.value,
        "created": published.created,
    }
    return JSONAnswer(
        body, status_code=201, headers={"Location": f"{ctx.base_path}/msg/{message.id}"}
    )


async def _received(
    ctx: Context,
    request: Request,
    topic: Topic,
    options: PublishOptions,
    filename: str | None,
    declared: int | None,
    content_type: str | None,
    hold: Hold,
) -> tuple[Manifest, PublishOptions]:
    """The body stored (a BSON document, or the raw payload), as its message and the
    placeholder's options (a document's headers travel as user properties too)."""
    if content_type is not None and essence(content_type) == BSON_TYPE:
        received = await receive_envelope(
            ctx, topic, request.stream(), check_headers=placeholder_user_properties, hold=hold
        )
        # The document's headers travel as user properties too, ahead of the options'.
        manifest = build_manifest(
            ctx, received, ttl=options.expiry, filename=filename, extra_headers=options.headers()
        )
        return manifest, options.with_leading(placeholder_user_properties(received.headers))
    length = -1 if declared is None else declared
    received = await receive_raw(
        ctx, topic, request.stream(), length=length, content_type=content_type, hold=hold
    )
    manifest = build_manifest(
        ctx,
        received,
        ttl=options.expiry,
        content_type=content_type,
        filename=filename,
        extra_headers=options.headers(),
    )
    return manifest, options
