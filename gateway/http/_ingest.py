"""Receiving a payload into the store and announcing it on the broker.

Shared by the hop-client upload (`POST /topic/...+oversized`), `POST /publish/{topic}` and
the resumable uploads: every path streams the body into the store (never buffering it),
builds an uncommitted `Manifest`, commits it, and - for the HTTP publish paths - publishes
the same `_format=external` placeholder the client library publishes
(`client.protocol.Placeholder.encode`), so subscribers cannot tell who offloaded it.

The ordering rule: commit first, publish second (a subscriber may fetch the moment the
placeholder arrives), and withdraw the committed message when the publish fails, so no
stored payload is ever left unannounced.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from starlette.requests import ClientDisconnect, Request

from client import ConnectionFailed, PublishRejected
from client.protocol import (
    TRACEPARENT,
    EnvelopeComplete,
    EnvelopeParser,
    Manifest,
    MessageId,
    PayloadData,
    PayloadEnd,
    PayloadStart,
    Placeholder,
    PublishProperties,
    Topic,
    UploadFields,
    mqtt_text_problem,
    publish_packet_size,
    publish_properties_problem,
    upload_fields,
)
from client.tracing import Span, message_attributes

from ..core import (
    BadRequest,
    BrokerUnavailable,
    InvalidPublish,
    PayloadTooLarge,
    StorageUnavailable,
    child,
    current_context,
)
from ..ingest import (
    RESERVED,
    PublishOptions,
    Stored,
    Upload,
    manifest_text_problem,
    message_id_from_headers,
)
from ..retention import Hold
from ._context import Context, NoBroker

log = logging.getLogger("gateway")

ID_HEADER = "_id"  # the hop header that carries the message id

PUBLISH_TIMEOUT = 30.0  # seconds to wait for the broker's PUBACK/PUBCOMP


@dataclass(frozen=True, slots=True)
class Received:
    """A payload stored but not yet described: what every receive path hands on.

    The hop BSON upload, the raw `/publish` body and a completed tus upload each end in
    one of these; `build_manifest` turns it into the message, the same way for all three.
    """

    topic: Topic
    data_key: str
    sha256: str
    size: int
    timestamp: int  # milliseconds since the epoch, when the upload began
    headers: tuple[tuple[str, bytes], ...] = ()  # the sender's (hop document); else none
    key: bytes | None = None  # the hop document's `key`
    message_id: MessageId | None = None  # the id the sender chose; None: a new one
    crc32c: str | None = None  # taken with the SHA-256 in the same pass (`_pipe`)


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


def check_running_total(total: int, limit: int) -> None:
    """Stop a body without Content-Length (chunked) once it passes the limit."""
    if total > limit:
        raise PayloadTooLarge(f"body exceeds the limit of {limit} bytes")


async def receive_raw(
    ctx: Context,
    topic: Topic,
    chunks: AsyncIterator[bytes],
    *,
    length: int,
    content_type: str | None,
    hold: Hold | None = None,
) -> Received:
    """Stream a raw body into a new payload object.

    Args:
        ctx: the request context (service, limits).
        topic: where the payload's key is laid out.
        chunks: the body.
        length: declared length, -1 when unknown (chunked transfer encoding).
        content_type: stored as the object's content type.
        hold: the upload's reservation on its account's ledger: the declared length is
            reserved before any byte is stored, an unknown one a part at a time as it
            arrives (413 past the stored-bytes quota).

    Returns:
        The stored payload; nothing is stored when this raises.
    """
    limit = ctx.settings.max_body_bytes
    if hold is not None and length > 0:
        await hold.reserve(length)
    upload, key, stamp = ctx.service.begin_upload(topic, length, content_type=content_type)
    total = 0
    with store_span("store write", topic, length) as span:
        try:
            async for chunk in chunks:
                total += len(chunk)
                check_running_total(total, limit)
                if hold is not None:
                    await hold.cover(total)
                await upload.write(chunk)
            if length >= 0 and total != length:
                raise BadRequest(f"body has {total} bytes but Content-Length said {length}")
            sha256, size = await upload.finish()
        except BaseException as exc:
            await upload.abort(exc)
            if isinstance(exc, ClientDisconnect):
                raise BadRequest("client disconnected before the body was complete") from exc
            raise
        span.set("messaging.message.body.size", size)
    return Received(topic, key, sha256, size, stamp, crc32c=upload.crc32c)


def store_span(name: str, topic: Topic, size: int, message_id: str | None = None) -> Span:
    """A child of the request's span for its work with the object store."""
    return child(
        name, "client", message_attributes(topic.value, max(size, 0), name, "send", message_id)
    )


async def receive_envelope(
    ctx: Context,
    topic: Topic,
    chunks: AsyncIterator[bytes],
    *,
    check_headers: Callable[[Sequence[tuple[str, bytes]]], object] | None = None,
    hold: Hold | None = None,
) -> Received:
    """Stream a hop-client BSON upload document `{message, headers, key?}` into the store.

    The message id is the `_id` header (16 raw bytes or UUID text); without one,
    `build_manifest` assigns a new id and adds it to the headers.

    Args:
        ctx: the request context.
        topic: the message's topic.
        chunks: the request body.
        check_headers: raises when the headers are unacceptable; called as soon as they
            arrive (before the payload is stored when the document sends them first).
        hold: the upload's reservation: the payload's length (the document states it
            before its bytes) is reserved before any byte is stored.

    Returns:
        The stored payload, its headers and id; nothing is left stored when this raises.
    """
    parser = EnvelopeParser(
        max_document=ctx.settings.max_body_bytes, max_fields=ctx.settings.max_header_bytes
    )
    sink = _EnvelopeSink(ctx, topic, check_headers, hold)
    with store_span("store write", topic, 0) as span:
        try:
            async for chunk in chunks:
                for event in parser.feed(chunk):
                    await sink.handle(event)
            parser.end()
            received = sink.received()
        except BaseException as exc:
            await sink.abort(exc)
            if isinstance(exc, ClientDisconnect):
                raise BadRequest("client disconnected before the body was complete") from exc
            raise
        span.set("messaging.message.body.size", received.size)
    return received


class _EnvelopeSink:
    """Where a hop upload document's parser events go: the payload into the store."""

    def __init__(
        self,
        ctx: Context,
        topic: Topic,
        check_headers: Callable[[Sequence[tuple[str, bytes]]], object] | None,
        hold: Hold | None = None,
    ) -> None:
        self.ctx = ctx
        self.topic = topic
        self.check_headers = check_headers
        self.hold = hold
        self.written = 0
        self.upload: Upload | None = None
        self.stored_key: str | None = None
        self.fields: UploadFields | None = None
        self.sha256 = ""
        self.crc32c: str | None = None
        self.size = 0
        self.stamp = 0

    def _check(self, headers: Sequence[tuple[str, bytes]]) -> None:
        if self.check_headers is not None:
            self.check_headers(headers)

    async def handle(self, event: object) -> None:
        if isinstance(event, PayloadData):
            assert self.upload is not None
            self.written += len(event.data)
            if self.hold is not None:
                await self.hold.cover(self.written)
            await self.upload.write(event.data)
        elif isinstance(event, PayloadStart):
            if event.fields:  # headers sent first: reject bad ones before storing
                self._check(upload_fields(event.fields).headers)
            if self.hold is not None and event.length > 0:
                await self.hold.reserve(event.length)
            self.upload, _, self.stamp = self.ctx.service.begin_upload(self.topic, event.length)
        elif isinstance(event, PayloadEnd):
            assert self.upload is not None
            self.sha256, self.size = await self.upload.finish()
            self.crc32c = self.upload.crc32c
            self.stored_key, self.upload = self.upload.key, None
        elif isinstance(event, EnvelopeComplete):
            self.fields = upload_fields(event.fields)
            self._check(self.fields.headers)

    def received(self) -> Received:
        """The stored payload, once the document ended."""
        fields = self.fields
        assert fields is not None and self.stored_key is not None
        return Received(
            self.topic,
            self.stored_key,
            self.sha256,
            self.size,
            self.stamp,
            headers=tuple(fields.headers),
            key=fields.key,
            message_id=message_id_from_headers(fields.headers),
            crc32c=self.crc32c,
        )

    async def abort(self, exc: BaseException) -> None:
        """Leave nothing behind: the upload in progress, or a payload stored undescribed."""
        if self.upload is not None:
            await self.upload.abort(exc)
        if self.stored_key is not None:
            await self.ctx.service.discard(self.stored_key)


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


def require_broker(ctx: Context) -> None:
    """Refuse before reading a body when the placeholder could not be published anyway."""
    if isinstance(ctx.broker, NoBroker):
        raise BrokerUnavailable("this gateway has no broker configured (OFFLOAD_MQTT_URL)")
    if not ctx.broker.connected:
        raise BrokerUnavailable(f"broker unreachable: not connected to {ctx.broker.broker}")


async def announce(
    ctx: Context,
    manifest: Manifest,
    url: str,
    options: PublishOptions,
    *,
    created: bool = True,
) -> None:
    """Publish the placeholder for a committed message; withdraw the message on failure.

    Args:
        ctx: the request context (its broker link).
        manifest: the committed message.
        url: the message URL the placeholder carries (`.../msg/<id>`).
        options: QoS, retain, expiry and user properties of the placeholder.
        created: False when the commit found an identical earlier message: that one is
            not withdrawn on failure, since an earlier publish may have announced it.

    The placeholder carries the `publish` span's context only where it still fits the
    broker's Maximum Packet Size (as offload-proxy adds it).

    Raises:
        BadRequest: the placeholder (its user properties) is over the broker's limit.
        BrokerUnavailable: the broker is unreachable or did not acknowledge.
    """
    placeholder = Placeholder(url, manifest.size, manifest.sha256, manifest.id, options.encoding)
    original = options.properties(manifest.content_type)
    with publish_span(manifest, original) as span:
        body, props = placeholder.encode(original)
        if span.context is not None and original.user_property(TRACEPARENT) is None:
            traced = placeholder.encode(original.with_user_properties(*span.context.pairs()))
            if _over_limit(ctx, manifest, traced[0], traced[1], options) is None:
                body, props = traced
        await _publish_placeholder(ctx, manifest, body, props, options, created)


def publish_span(manifest: Manifest, original: PublishProperties) -> Span:
    """The placeholder's `publish {topic}` span: PRODUCER, its context the message's
    creation context, unless the uploader gave its own `traceparent` user property (kept
    as it is: then CLIENT)."""
    custom = original.user_property(TRACEPARENT) is not None
    attributes = message_attributes(
        manifest.topic.value, manifest.size, "publish", "send", str(manifest.id)
    )
    name = f"publish {manifest.topic.value}"
    return child(name, "client" if custom else "producer", attributes)


async def _publish_placeholder(
    ctx: Context,
    manifest: Manifest,
    body: bytes,
    props: PublishProperties | None,
    options: PublishOptions,
    created: bool,
) -> None:
    """Send the placeholder; withdraw the message when the broker does not take it."""
    problem = None if props is None else publish_properties_problem(props)
    # A PUBLISH over the broker's limit is answered by dropping the gateway's connection,
    # and with it every other request's placeholder on the way.
    problem = problem or _over_limit(ctx, manifest, body, props, options)
    if problem is not None:
        # Every route validates before storing; this is the last line, never the first.
        if created:
            await ctx.service.forget(manifest)
        raise BadRequest(f"cannot publish this message: {problem}; nothing was kept")
    try:
        require_broker(ctx)
        future = ctx.broker.publish(
            manifest.topic.value, body, qos=options.qos, retain=options.retain, properties=props
        )
        await asyncio.wait_for(asyncio.wrap_future(future), PUBLISH_TIMEOUT)
    except InvalidPublish as exc:  # unreachable after the check above; never a 5xx
        if created:
            await ctx.service.forget(manifest)
        raise BadRequest(f"cannot publish this message: {exc}; nothing was kept") from exc
    except (ConnectionFailed, PublishRejected, TimeoutError, BrokerUnavailable) as exc:
        if created:
            try:
                await ctx.service.forget(manifest)
            except StorageUnavailable as gone:  # the sweeper removes it at expiry instead
                log.warning("could not withdraw unannounced %s: %s", manifest.id, gone)
        raise BrokerUnavailable(
            f"broker unreachable, message not published and not kept: {exc}"
        ) from exc


def _over_limit(
    ctx: Context,
    manifest: Manifest,
    body: bytes,
    props: PublishProperties | None,
    options: PublishOptions,
) -> str | None:
    """Why the placeholder cannot go to the broker (over its Maximum Packet Size), or None
    (also when the broker states no limit)."""
    limit = ctx.broker.max_packet_size
    try:
        size = publish_packet_size(
            manifest.topic.value, len(body), qos=options.qos, properties=props
        )
    except ValueError as exc:  # ProtocolError: a property no PUBLISH can carry
        return str(exc)
    if limit is None or size <= limit:
        return None
    return f"its placeholder would be {size} bytes, over the broker's limit of {limit}"


def placeholder_user_properties(
    headers: Sequence[tuple[str, bytes]],
) -> tuple[tuple[str, str], ...]:
    """Stored headers as the placeholder's MQTT user properties (reserved names skipped).

    A value that is not UTF-8 is a binary hop header with no user-property form and stays
    only in the stored message. A text header the broker would refuse (control characters
    such as CR/LF, non-characters, over 65535 bytes) is refused with 400: dropping it would
    lose it silently, sending it would get the gateway disconnected.

    Raises:
        BadRequest: a text header cannot travel as an MQTT user property.
    """
    out: list[tuple[str, str]] = []
    for name, value in headers:
        if name in RESERVED:
            continue
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            continue  # binary hop headers have no MQTT user-property form
        problem = mqtt_text_problem(name, "header name") or mqtt_text_problem(
            text, f"header {name!r:.60} value"
        )
        if problem is not None:
            raise BadRequest(f"{problem}: it cannot travel as an MQTT user property")
        out.append((name, text))
    return tuple(out)
