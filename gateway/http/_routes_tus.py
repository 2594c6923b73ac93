"""Resumable uploads over HTTP: tus 1.0 (core, creation, creation-with-upload, checksum,
expiration, termination, concatenation).

    OPTIONS /uploads/        capabilities (Tus-Version, Tus-Extension, Tus-Max-Size, ...)
    POST    /uploads/        create: Upload-Length, Upload-Metadata -> 201 Location; with
                             Content-Type: application/offset+octet-stream the body is the
                             first segment (creation-with-upload, Upload-Checksum applies);
                             Upload-Concat: partial | final;<part URLs> (concatenation)
    HEAD    /uploads/{id}    Upload-Offset, Upload-Length, Upload-Expires
    PATCH   /uploads/{id}    append at Upload-Offset (application/offset+octet-stream),
                             optional Upload-Checksum: sha1|md5|crc32|sha256 <base64>
                             -> 204 | 460
    DELETE  /uploads/{id}    terminate -> 204

`Upload-Metadata` keys (values base64, as tus wants): `topic` (required, partial uploads
too: every upload is authorized against its topic), `filename` (or `name`), `content_type`
(or `filetype`, `type`), `sha256` (whole payload, hex), `qos`, `retain`, `expiry`,
`prop.<name>` (user properties of the placeholder) and, for bytes the uploader compressed
or encrypted, the placeholder's `cmp`, `enc` and `kid` (key ids joined by commas), checked
as a consumer's placeholder parser checks them and copied into the placeholder.

Concatenation (tus-js-client's `parallelUploads`): partial uploads are never published;
the final upload names them, must share their topic and owner, takes its length from
theirs, and is assembled and published at once like the last PATCH of a single upload; the
parts are then removed.

When the last byte is acknowledged the payload is assembled, its SHA-256 checked against
`sha256`, the message committed and its placeholder published; the final PATCH (and any later
HEAD) answers `X-Offload-Id`, `X-Offload-Url` and `X-Offload-Sha256`. If the broker is down
at that moment the answer is 503 and the upload stays complete-but-unannounced: an empty PATCH
at the final offset tries again.

HEAD, PATCH and DELETE hold the upload one at a time (`gateway.tus._locks`): a newer request
waits for the one before it (423 Locked past the wait), and stops an earlier PATCH whose
body has stalled (that PATCH answers 400, its segment discarded); a DELETE stops it at once.

An upload belongs to the principal that created it: HEAD, PATCH and DELETE by another
user answer 404, as for an unknown id. Anonymous uploads (no user) are capabilities: whoever
holds the 128-bit random id may continue them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from client.protocol import MessageId, Topic

from ..core import (
    COMMON_RESPONSES,
    BadRequest,
    ChecksumMismatch,
    Forbidden,
    GatewayError,
    NotFound,
    PayloadTooLarge,
    PreconditionFailed,
    UnsupportedMediaType,
)
from ..ingest import (
    PublishOptions,
    check_filename,
    parse_ascii_int,
    parse_content_type,
    parse_topic,
)
from ..tus import (
    CHECKSUM_ALGORITHMS,
    TUS_EXTENSIONS,
    TUS_VERSION,
    Hold,
    ResumableUploads,
    UploadState,
    http_date,
    parse_checksum,
    parse_concat,
    parse_metadata,
)
from ._context import Context, Ctx
from ._deps import Access, AppSettings, Uploads
from ._ingest import build_manifest, publish
from ._receive import Received
from ._responses import headers_only

router = APIRouter(prefix="/uploads", tags=["resumable uploads (tus 1.0)"])


OFFSET_TYPE = "application/offset+octet-stream"

_ERRORS: dict[int | str, dict[str, Any]] = {
    **COMMON_RESPONSES,
    400: {"description": "malformed tus header or metadata"},
    403: {"description": "not allowed to write the upload's topic"},
    404: {"description": "no such upload, or another principal's"},
    409: {"description": "Upload-Offset is not the upload's offset"},
    410: {"description": "the upload expired"},
    412: {"description": "unsupported Tus-Resumable version"},
    413: {"description": "Upload-Length above the limit, or a segment past it"},
    415: {"description": "PATCH without Content-Type: application/offset+octet-stream"},
    423: {"description": "another request for the upload is still in progress (retry)"},
    460: {"description": "checksum mismatch: the segment was discarded"},
    503: {"description": "object store or broker unavailable"},
}


# The headers that carry each answer (tus has no bodies on success).
_CAPABILITIES = ("Tus-Resumable", "Tus-Version", "Tus-Extension", "Tus-Max-Size",
                 "Tus-Checksum-Algorithm")  # fmt: skip
_STATE = ("Tus-Resumable", "Upload-Offset", "Upload-Length", "Upload-Expires", "Upload-Concat",
          "X-Offload-Id", "X-Offload-Url", "X-Offload-Sha256")  # fmt: skip
_CREATED = ("Location", *_STATE)


async def _tus(call: Callable[[], Awaitable[Response]]) -> Response:
    """Run a handler; every answer, errors included, carries `Tus-Resumable` (tus core)."""
    try:
        response = await call()
    except GatewayError as exc:
        exc.headers.setdefault("Tus-Resumable", TUS_VERSION)
        raise
    response.headers["Tus-Resumable"] = TUS_VERSION
    return response


def _check_version(request: Request) -> None:
    if request.headers.get("tus-resumable") != TUS_VERSION:
        raise PreconditionFailed(
            f"Tus-Resumable {TUS_VERSION} required", {"Tus-Version": TUS_VERSION}
        )


def _nonnegative(request: Request, name: str) -> int:
    raw = request.headers.get(name)
    if raw is None:
        raise BadRequest(f"{name} header required")
    return parse_ascii_int(raw, name.title())


async def _load_own(uploads: ResumableUploads, access: Access, upload_id: str) -> UploadState:
    """The caller's own upload: 404 for another principal's, as for an unknown id.

    The caller is authenticated first (401 alike for every id), then the owner checked, and
    only then write access to the topic: a 403 naming the topic, or a 410, for someone
    else's upload would tell whoever holds its id that it exists, and what it is about.
    """
    state = await uploads.load_own(upload_id, await access.authenticate())
    await access.write(state.topic)  # the owner may have lost the topic since
    return state


@asynccontextmanager
async def _held(
    uploads: ResumableUploads, access: Access, upload_id: str, *, take_over: bool = False
) -> AsyncIterator[tuple[Hold, UploadState]]:
    """The caller's own upload, held for this request (`gateway.tus._locks`).

    Ownership is checked before the hold, so only the owner can stop the owner's PATCH;
    the state is read again when an earlier request held the upload first.
    """
    state = await _load_own(uploads, access, upload_id)
    async with uploads.locks.hold(upload_id, take_over=take_over) as hold:
        if hold.took_over:
            state = await uploads.load(upload_id)
        yield hold, state


def _content_type(meta: dict[str, str]) -> str | None:
    for key in ("content_type", "filetype", "type"):
        if meta.get(key):
            return parse_content_type(meta[key], source=f"Upload-Metadata {key}")
    return None


def _state_headers(ctx: Context, state: UploadState) -> dict[str, str]:
    headers = {
        "Upload-Offset": str(state.offset if not state.completed else state.length),
        "Upload-Length": str(state.length),
        "Upload-Expires": http_date(state.expires),
        "Cache-Control": "no-store",
    }
    if state.partial:
        headers["Upload-Concat"] = "partial"
    elif state.parts:
        urls = " ".join(f"{ctx.base_path}/uploads/{p}" for p in state.parts)
        headers["Upload-Concat"] = f"final;{urls}"
    if state.completed:
        assert state.url is not None
        headers["X-Offload-Id"] = str(state.message_id)
        headers["X-Offload-Url"] = state.url
        if state.sha256 is not None:
            headers["X-Offload-Sha256"] = state.sha256
    return headers


def _segment_type(request: Request) -> bool:
    """Whether the body is upload data (`application/offset+octet-stream`)."""
    content_type = (request.headers.get("content-type") or "").split(";")[0].strip()
    return content_type.lower() == OFFSET_TYPE


def _content_length(request: Request) -> int | None:
    declared = request.headers.get("content-length")
    return None if declared is None else parse_ascii_int(declared, "Content-Length")


async def _load_part(
    ctx: Context, request: Request, part_id: str, topic: Topic, owner: str | None
) -> UploadState:
    """A partial upload a final one may consume: the caller's, same topic, complete."""
    try:  # another principal's part, expired or not, is unknown to this caller
        part = await ctx.uploads.load_own(part_id, owner)
    except NotFound as exc:
        raise BadRequest(f"Upload-Concat: no partial upload {part_id}") from exc
    if not part.partial:
        raise BadRequest(f"Upload-Concat: upload {part_id} is not a partial upload")
    if part.topic != topic:
        raise BadRequest(f"Upload-Concat: partial upload {part_id} is for another topic")
    if part.offset != part.length:
        raise BadRequest(
            f"Upload-Concat: partial upload {part_id} is not complete "
            f"({part.offset} of {part.length} bytes)"
        )
    return part


@router.options("", include_in_schema=False)
@router.options(
    "/",
    status_code=204,
    responses={**_ERRORS, **headers_only(204, "what this tus server supports", *_CAPABILITIES)},
)
async def capabilities(settings: AppSettings) -> Response:
    """What this tus server supports."""
    headers = {
        "Tus-Resumable": TUS_VERSION,
        "Tus-Version": TUS_VERSION,
        "Tus-Extension": TUS_EXTENSIONS,
        "Tus-Max-Size": str(settings.max_body_bytes),
        "Tus-Checksum-Algorithm": CHECKSUM_ALGORITHMS,
    }
    return Response(status_code=204, headers=headers)


@router.post("", include_in_schema=False)
@router.post(
    "/",
    status_code=201,
    response_class=Response,
    responses={**_ERRORS, **headers_only(201, "created: continue at `Location`", *_CREATED)},
)
async def create(request: Request, ctx: Ctx, access: Access) -> Response:
    """tus creation: a new upload for the topic named in `Upload-Metadata`."""

    async def run() -> Response:
        _check_version(request)
        concat = parse_concat(request.headers.get("upload-concat"))
        final = concat is not None and not concat.partial
        length = 0 if final else _nonnegative(request, "upload-length")
        if final and "upload-length" in request.headers:
            raise BadRequest("a final upload takes its length from its parts: no Upload-Length")
        if length > ctx.settings.max_body_bytes:
            raise PayloadTooLarge(
                f"Upload-Length {length} exceeds the limit of {ctx.settings.max_body_bytes}"
            )
        # creation-with-upload: checked before anything is stored.
        with_data = _segment_type(request)
        declared = _content_length(request)
        checksum = parse_checksum(request.headers.get("upload-checksum"))
        if not with_data and declared:
            raise UnsupportedMediaType(f"data in a POST needs Content-Type: {OFFSET_TYPE}")
        if final and with_data and declared != 0:
            raise BadRequest("a final upload carries no data of its own")
        meta = parse_metadata(request.headers.get("upload-metadata"))
        if "topic" not in meta:
            raise BadRequest("Upload-Metadata must name the topic (key `topic`)")
        topic = parse_topic(meta["topic"], max_bytes=ctx.settings.max_topic_bytes)
        owner = await access.write(topic)
        await ctx.quotas.check(owner, length)  # per-user caps (gateway/ingest/_quotas.py): 429
        settings = _upload_settings(meta)
        uploads = ctx.uploads
        if final:
            assert concat is not None
            state = await _create_final(ctx, request, concat.parts, topic, owner, settings)
        else:
            partial = concat is not None
            state = await uploads.create(topic, length, owner=owner, partial=partial, **settings)
        location = f"{ctx.base_path}/uploads/{state.id}"
        try:
            if with_data and not final:
                state = await uploads.append(
                    state, 0, _body(request), declared=declared, checksum=checksum
                )
            if state.offset == state.length and not state.partial:
                state = await _finish(ctx, request, state)
        except GatewayError as exc:
            exc.headers.setdefault("Location", location)  # created: the client may resume
            raise
        headers = _state_headers(ctx, state)
        headers["Location"] = location
        return Response(status_code=201, headers=headers)

    return await _tus(run)


def _upload_settings(meta: dict[str, str]) -> dict[str, Any]:
    """What `Upload-Metadata` sets of the upload besides its topic, checked."""
    sha256 = meta.get("sha256", "").lower() or None
    if sha256 is not None and (
        len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256)
    ):
        raise BadRequest("Upload-Metadata sha256 must be 64 hex characters")
    return {
        "filename": check_filename(meta.get("filename") or meta.get("name")),
        "content_type": _content_type(meta),
        "sha256": sha256,
        "options": PublishOptions.from_metadata(meta),
    }


async def _create_final(
    ctx: Context,
    request: Request,
    part_ids: tuple[str, ...],
    topic: Topic,
    owner: str | None,
    settings: dict[str, Any],
) -> UploadState:
    """A concatenation's final upload, made of the partial uploads it names."""
    parts = [await _load_part(ctx, request, p, topic, owner) for p in part_ids]
    if sum(p.length for p in parts) > ctx.settings.max_body_bytes:
        raise PayloadTooLarge(f"the parts exceed the limit of {ctx.settings.max_body_bytes} bytes")
    template = UploadState(
        id="", topic=topic, length=0, message_id=MessageId.new(), created=0.0,
        expires=0.0, owner=owner, **settings,
    )  # fmt: skip
    return await ctx.uploads.create_final(template, parts)


@router.head(
    "/{upload_id}",
    response_class=Response,
    responses={**_ERRORS, **headers_only(200, "where to resume", *_STATE)},
)
async def offset(upload_id: str, request: Request, ctx: Ctx, access: Access) -> Response:
    """The upload's current offset: where a client resumes."""

    async def run() -> Response:
        _check_version(request)
        # Held: an earlier PATCH still under way is waited for (or stopped when its body
        # stalled), so the offset answered is the one the next PATCH will find.
        async with _held(ctx.uploads, access, upload_id) as (_, state):
            pass
        return Response(status_code=200, headers=_state_headers(ctx, state))

    return await _tus(run)


async def _body(request: Request) -> AsyncIterator[bytes]:
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect as exc:
        raise BadRequest("client disconnected mid-segment; resume from Upload-Offset") from exc


@router.patch(
    "/{upload_id}",
    status_code=204,
    responses={**_ERRORS, **headers_only(204, "the segment is stored", *_STATE)},
)
async def append(upload_id: str, request: Request, ctx: Ctx, access: Access) -> Response:
    """Append one segment at `Upload-Offset`; the last one completes and publishes."""

    async def run() -> Response:
        _check_version(request)
        if not _segment_type(request):
            raise UnsupportedMediaType(f"PATCH needs Content-Type: {OFFSET_TYPE}")
        at = _nonnegative(request, "upload-offset")
        checksum = parse_checksum(request.headers.get("upload-checksum"))
        length = _content_length(request)
        uploads = ctx.uploads
        async with _held(uploads, access, upload_id) as (hold, state):
            if state.parts and length:
                raise Forbidden("a final upload takes no PATCH data (tus concatenation)")
            if not state.completed:
                state = await uploads.append(
                    state,
                    at,
                    hold.feed(_body(request)),
                    declared=length,
                    checksum=checksum,
                    interruptible=hold.interruptible(),
                )
                if state.offset == state.length and not state.partial:
                    state = await _finish(ctx, request, state)
            elif at != state.length:
                raise BadRequest(f"upload already complete at {state.length} bytes")
        return Response(status_code=204, headers=_state_headers(ctx, state))

    return await _tus(run)


@router.delete(
    "/{upload_id}",
    status_code=204,
    responses={**_ERRORS, **headers_only(204, "the upload is forgotten", "Tus-Resumable")},
)
async def terminate(upload_id: str, request: Request, uploads: Uploads, access: Access) -> Response:
    """tus termination: forget the upload and its segments (a published message stays)."""

    async def run() -> Response:
        _check_version(request)
        async with _held(uploads, access, upload_id, take_over=True) as (_, state):
            await uploads.terminate(state)
        return Response(status_code=204)

    return await _tus(run)


async def _finish(ctx: Context, request: Request, state: UploadState) -> UploadState:
    """Assemble, verify, commit and announce a fully received upload."""
    uploads = ctx.uploads
    key, sha256, stamp, crc32c = await uploads.assemble(state)
    if state.sha256 is not None and sha256 != state.sha256:
        await ctx.service.discard(key)
        await uploads.terminate(state)
        raise ChecksumMismatch(
            f"the whole payload has SHA-256 {sha256}, Upload-Metadata said {state.sha256}; "
            "the upload was discarded"
        )
    options = state.options
    received = Received(
        state.topic, key, sha256, state.length, stamp, message_id=state.message_id, crc32c=crc32c
    )
    manifest = build_manifest(
        ctx,
        received,
        ttl=options.expiry,
        content_type=state.content_type,
        filename=state.filename,
        extra_headers=options.headers(),
    )
    published = await publish(
        ctx,
        request,
        manifest,
        options,
        kind="resumable",
        user=state.owner,
        hold=uploads.hold_of(state) if uploads.retention is not None else None,
    )
    done = replace(state, segments=(), sha256=sha256, url=published.url)
    await uploads.save(done)  # completed: segments no longer needed
    await uploads.remove_segments(state)
    return done
