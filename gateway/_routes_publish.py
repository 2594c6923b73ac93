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

from dataclasses import replace
from typing import Annotated, Any
from urllib.parse import unquote

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from client.protocol import Manifest, MessageId, mqtt_text_problem

from ._context import Context, get_context
from ._errors import COMMON_RESPONSES, BadRequest
from ._ingest import (
    PublishOptions,
    announce,
    commit_or_discard,
    placeholder_user_properties,
    receive_envelope,
    receive_raw,
    require_broker,
    user_property_headers,
)
from ._media import essence, parse_content_type
from ._routes import check_declared_length, message_url, parse_ascii_int
from ._service import parse_topic

router = APIRouter()

Ctx = Annotated[Context, Depends(get_context)]

BSON_TYPE = "application/bson"
MAX_FILENAME_BYTES = 255

_ERRORS: dict[int | str, dict[str, Any]] = {
    **COMMON_RESPONSES,
    400: {"description": "malformed request or option (reason in `detail`)"},
    401: {"description": "authentication required"},
    403: {"description": "not allowed to write this topic"},
    409: {"description": "id already stored with other content (BSON body)"},
    413: {"description": "body larger than the configured maximum"},
    503: {"description": "broker or object store unavailable; nothing was kept"},
}


def _parse_bool(raw: str, name: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise BadRequest(f"{name} must be true or false, not {raw!r}")


def _parse_int(raw: str, name: str) -> int:
    return parse_ascii_int(raw, name)


def _parse_property(raw: str) -> tuple[str, str]:
    name, colon, value = raw.partition(":")
    if not colon:
        raise BadRequest(f"user property must be NAME:VALUE, not {raw!r:.80}")
    # Checked again, with everything else that reaches the PUBLISH, by PublishOptions.
    for part, what in ((name, "name"), (value, "value")):
        problem = mqtt_text_problem(part, f"user property {what}")
        if problem is not None:  # the broker would drop our connection for it
            raise BadRequest(problem)
    return name.strip(), value


def _one(request: Request, query: str, header: str) -> str | None:
    value = request.query_params.get(query)
    return value if value is not None else request.headers.get(header)


def publish_options(request: Request) -> PublishOptions:
    """The placeholder options from query parameters, else `X-Offload-*` headers.

    Args:
        request: the incoming request.

    Raises:
        BadRequest: an option is malformed.
    """
    qos = _one(request, "qos", "x-offload-qos")
    retain = _one(request, "retain", "x-offload-retain")
    expiry = _one(request, "expiry", "x-offload-expiry")
    props = request.query_params.getlist("prop") or request.headers.getlist("x-offload-property")
    return PublishOptions(
        qos=1 if qos is None else _parse_int(qos, "qos"),
        retain=False if retain is None else _parse_bool(retain, "retain"),
        expiry=None if expiry is None else _parse_int(expiry, "expiry"),
        user_properties=tuple(_parse_property(p) for p in props),
    )


def filename_from_disposition(header: str | None) -> str | None:
    """The file name of a Content-Disposition header (RFC 6266: `filename*` wins)."""
    if not header:
        return None
    plain: str | None = None
    for part in header.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        key = key.strip().lower()
        value = value.strip()
        if key == "filename*":
            charset, _, rest = value.partition("'")
            _lang, _, encoded = rest.partition("'")
            try:
                return unquote(encoded, encoding=charset or "utf-8", errors="strict")
            except (LookupError, UnicodeDecodeError) as exc:
                raise BadRequest(f"undecodable Content-Disposition filename*: {exc}") from exc
        if key == "filename":
            plain = value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value
    return plain


def check_filename(name: str | None) -> str | None:
    """A file name safe to store and send back in a header; None when absent."""
    if name is None:
        return None
    # Only the last path component: a name is a label for the download, never a path.
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    if not name or name in (".", ".."):
        return None
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise BadRequest("filename must not contain control characters")
    if len(name.encode("utf-8")) > MAX_FILENAME_BYTES:
        raise BadRequest(f"filename longer than {MAX_FILENAME_BYTES} bytes")
    return name


def _media_type(request: Request) -> str | None:
    raw = request.headers.get("content-type")
    # `curl --data-binary @f` sends this by default: it says nothing about the payload, so it
    # counts as no content type rather than being stored as the message's.
    if raw and raw.split(";")[0].strip().lower() == "application/x-www-form-urlencoded":
        return None
    return parse_content_type(raw, source="Content-Type")


# One decorator per method: a multi-method route repeats its operationId in the OpenAPI.
@router.post("/publish/{topic:path}", status_code=201, responses=_ERRORS, tags=["publish"])
@router.put("/publish/{topic:path}", status_code=201, responses=_ERRORS, tags=["publish"])
async def publish(topic: str, request: Request, ctx: Ctx) -> Response:
    """Store the body and publish its placeholder on `topic` (see the module docstring)."""
    parsed_topic = parse_topic(topic, max_bytes=ctx.settings.max_topic_bytes)
    await ctx.authorize_write(request, parsed_topic)
    options = publish_options(request)
    filename = check_filename(
        request.query_params.get("filename")
        or filename_from_disposition(request.headers.get("content-disposition"))
    )
    declared = check_declared_length(request, ctx.settings.max_body_bytes)
    # Refuse before the body arrives: a several-GiB upload that cannot be announced is waste.
    require_broker(ctx)
    content_type = _media_type(request)
    if content_type is not None and essence(content_type) == BSON_TYPE:
        received = await receive_envelope(
            ctx, parsed_topic, request.stream(), check_headers=placeholder_user_properties
        )
        extra = user_property_headers(options)
        options = PublishOptions(
            qos=options.qos,
            retain=options.retain,
            expiry=options.expiry,
            user_properties=placeholder_user_properties(received.headers) + options.user_properties,
        )
        manifest = replace(
            received,
            headers=received.headers + extra,
            filename=filename,
            expires=ctx.service.expiry_for(received.timestamp, options.expiry),
        )
    else:
        key, sha256, size, stamp = await receive_raw(
            ctx,
            parsed_topic,
            request.stream(),
            length=-1 if declared is None else declared,
            content_type=content_type,
        )
        message_id = MessageId.new()
        manifest = Manifest(
            id=message_id,
            topic=parsed_topic,
            timestamp=stamp,
            size=size,
            sha256=sha256,
            data_key=key,
            headers=(("_id", message_id.bytes), *user_property_headers(options)),
            content_type=content_type,
            filename=filename,
            expires=ctx.service.expiry_for(stamp, options.expiry),
        )
    stored = await commit_or_discard(ctx, manifest, kind="publish")
    url = message_url(ctx, request, stored.manifest.id)
    await announce(ctx, stored.manifest, url, options, created=stored.created)
    body = {
        "id": str(stored.manifest.id),
        "url": url,
        "size": stored.manifest.size,
        "sha256": stored.manifest.sha256,
        "topic": stored.manifest.topic.value,
        "created": stored.created,
    }
    return JSONResponse(
        body, status_code=201, headers={"Location": f"{ctx.base_path}/msg/{stored.manifest.id}"}
    )
