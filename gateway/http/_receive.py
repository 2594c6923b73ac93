"""A request body into the store: a raw body or hop-client's BSON document, streamed.

Every receive path ends in one :class:`Received` (the payload stored, not yet described),
which `gateway.http._ingest.build_manifest` turns into the message, the same way for all.
Nothing is buffered whole, nothing is left stored when a receive fails, and an upload's
reservation on its account's ledger (`Hold`) is taken before the bytes it covers are stored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from starlette.requests import ClientDisconnect

from client.protocol import (
    EnvelopeComplete,
    EnvelopeParser,
    MessageId,
    PayloadData,
    PayloadEnd,
    PayloadStart,
    Topic,
    UploadFields,
    upload_fields,
)
from client.tracing import Span, message_attributes

from ..core import BadRequest, PayloadTooLarge, child
from ..ingest import Upload, message_id_from_headers
from ..retention import Hold
from ._context import Context


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
