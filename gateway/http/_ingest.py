"""Receiving a payload into the store and announcing it on the broker.

Shared by the hop-client upload (`POST /topic/...+oversized`), `POST /publish/{topic}` and
the resumable uploads: every path streams the body into the store (never buffering it,
`_receive`), builds an uncommitted `Manifest` (`build_manifest`), commits it, and - for the
HTTP publish paths - publishes the same `_format=external` placeholder the client library
publishes (`_announce`), so subscribers cannot tell who offloaded it.

The ordering rule: commit first, publish second (a subscriber may fetch the moment the
placeholder arrives), and withdraw the committed message when the publish fails, so no
stored payload is ever left unannounced.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from client.protocol import Manifest, MessageId

from ..core import BadRequest, current_context
from ..ingest import PublishOptions, Stored, manifest_text_problem
from ..retention import Hold
from ._announce import announce
from ._context import Context
from ._receive import Received, store_span

ID_HEADER = "_id"  # the hop header that carries the message id


@dataclass(frozen=True, slots=True)
class Published:
    """A message committed and announced: what the publish routes answer with."""

    manifest: Manifest
    created: bool  # False: an identical earlier message was found (idempotent retry)
    url: str


def build_manifest(
    ctx: Context,
    received: Received,
    *,
    ttl: int | None,
    content_type: str | None = None,
    filename: str | None = None,
    extra_headers: tuple[tuple[str, bytes], ...] = (),
) -> Manifest:
    """The one place a received payload becomes a `Manifest` (not yet committed).

    The id is the sender's when it named one, else new; a message whose headers carry no
    `_id` gets one, the way the client library stores it. `extra_headers` (user properties)
    follow the sender's, and `ttl` (seconds, capped by the gateway) sets its expiry. The
    request's trace context is recorded (the Spark source's `trace_id`).
    """
    message_id = received.message_id or MessageId.new()
    headers = received.headers
    if not any(name == ID_HEADER for name, _ in headers):
        headers = (*headers, (ID_HEADER, message_id.bytes))
    return Manifest(
        id=message_id,
        topic=received.topic,
        timestamp=received.timestamp,
        size=received.size,
        sha256=received.sha256,
        crc32c=received.crc32c,
        data_key=received.data_key,
        headers=headers + extra_headers,
        key=received.key,
        content_type=content_type,
        filename=filename,
        expires=ctx.service.expiry_for(received.timestamp, ttl),
        traceparent=None if (trace := current_context()) is None else trace.traceparent,
    )


def message_url(ctx: Context, request: Request, message_id: MessageId) -> str:
    """The URL a placeholder and a `201` name: the public URL when set, else the request's."""
    base = ctx.public_url or str(request.base_url).rstrip("/")
    return f"{base}/msg/{message_id}"


async def publish(
    ctx: Context,
    request: Request,
    manifest: Manifest,
    options: PublishOptions,
    *,
    kind: str,
    user: str | None = None,
    hold: Hold | None = None,
) -> Published:
    """Commit, then announce: the one commit -> URL -> placeholder sequence of every path.

    Args:
        ctx: the request context.
        request: gives the message URL when no public URL is set.
        manifest: from `build_manifest`.
        options: the placeholder's QoS, retain, expiry and user properties.
        kind: the upload path, for the metrics (`publish`, `resumable`).
        user: whose account stores it; `hold`: its reservation (`commit_or_discard`).
    """
    stored = await commit_or_discard(ctx, manifest, kind=kind, user=user, hold=hold)
    url = message_url(ctx, request, stored.manifest.id)
    await announce(ctx, stored.manifest, url, options, created=stored.created)
    return Published(stored.manifest, stored.created, url)


async def commit_or_discard(
    ctx: Context,
    manifest: Manifest,
    *,
    kind: str,
    user: str | None = None,
    hold: Hold | None = None,
    verified: bool = True,
) -> Stored:
    """Commit a received payload; remove its object when the commit fails.

    Args:
        ctx: the request context.
        manifest: the received, uncommitted message.
        kind: the upload path, for the metrics (`envelope`, `publish`, `resumable`).
        user: whose account stores it (the authenticated principal; None: anonymous).
        hold: the upload's reservation on that account's ledger (gateway/retention).
        verified: whether the manifest's SHA-256 was taken from the bytes (else it is the
            uploader's word, and the payload is never shared: `OffloadService.commit`).
    """
    problem = manifest_text_problem(manifest)  # every path: readable by every reader
    if problem is not None:
        await ctx.service.drop(manifest)
        if hold is not None:
            await hold.release()
        raise BadRequest(f"{problem}; nothing was kept")
    # A failed commit removes what is ours itself: once the payload's record holds the
    # object, others may be linked to it.
    with store_span("store commit", manifest.topic, manifest.size, str(manifest.id)):
        return await ctx.service.commit(
            manifest, kind=kind, user=user, hold=hold, verified=verified
        )
