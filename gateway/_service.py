"""The offload service: store a streamed payload and its manifest, find and serve them.

Writes go payload -> sidecar manifest -> id index, so a message is visible by id only once
everything is durable; a crash in between leaves an unreferenced payload that the sweeper
removes, never a half-visible message.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import ParamSpec, TypeVar

from client.protocol import Manifest, MessageId, Topic, data_key, index_key, meta_key

from ._errors import BadRequest, Conflict, NotFound, StorageUnavailable
from ._pipe import StreamingUpload
from .storage import ObjectStore, StoreError

log = logging.getLogger("gateway")

P = ParamSpec("P")
T = TypeVar("T")

OVERSIZED_SUFFIX = "+oversized"
MAX_KEY_BYTES = 1024  # S3's limit on object keys


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def parse_topic(raw: str, *, max_bytes: int) -> Topic:
    """A topic from a URL path segment; 400 with a reason when unusable."""
    topic = Topic(raw)  # raises InvalidTopic (400) for empty, wildcards, NUL
    if topic.value.startswith("$"):
        raise BadRequest(f"topic {raw!r}: topics starting with '$' are reserved for the broker")
    if len(topic.value.encode("utf-8")) > max_bytes:
        raise BadRequest(f"topic longer than {max_bytes} bytes")
    return topic


def message_id_from_headers(headers: Sequence[tuple[str, bytes]]) -> MessageId | None:
    for name, value in headers:
        if name == "_id":
            return MessageId.parse(value)
    return None


@dataclass(frozen=True, slots=True)
class Stored:
    manifest: Manifest
    created: bool  # False: an identical earlier upload was found (idempotent retry)


class OffloadService:
    """Everything the routes do with storage, as async methods.

    Args:
        store: where payloads and manifests live.
        default_ttl: seconds a payload is kept when the upload names no expiry (0: forever).
    """

    def __init__(self, store: ObjectStore, *, default_ttl: int = 0) -> None:
        self.store = store
        self.default_ttl = default_ttl

    async def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except StoreError as exc:
            raise StorageUnavailable(f"object store unavailable: {exc}") from exc

    def begin_upload(
        self, topic: Topic, length: int, *, content_type: str | None = None
    ) -> tuple[StreamingUpload, str, int]:
        """Start streaming a payload of `length` bytes (-1: unknown) into the store."""
        stamp = now_ms()
        key = data_key(topic, stamp, uuid.uuid4().hex)
        if len(key.encode("utf-8")) + 16 > MAX_KEY_BYTES:
            raise BadRequest("topic too long: its object key would exceed 1024 bytes")
        return StreamingUpload(self.store, key, length, content_type), key, stamp

    async def commit(self, manifest: Manifest) -> Stored:
        """Make an uploaded payload visible by id, or resolve a retry of the same id."""
        existing = await self.find(manifest.id)
        if existing is not None:
            await self._call(self.store.delete, manifest.data_key)
            if existing.sha256 == manifest.sha256 and existing.topic == manifest.topic:
                return Stored(existing, created=False)
            raise Conflict(
                f"message id {manifest.id} already exists with different content or topic"
            )
        if manifest.expires is None and self.default_ttl:
            manifest = replace(manifest, expires=manifest.timestamp + self.default_ttl * 1000)
        body = manifest.to_json()
        await self._call(self.store.put_bytes, meta_key(manifest.data_key), body)
        await self._call(self.store.put_bytes, index_key(manifest.id), body)
        return Stored(manifest, created=True)

    async def discard(self, key: str) -> None:
        try:
            await asyncio.to_thread(self.store.delete, key)
        except StoreError as exc:
            log.warning("could not remove abandoned payload %s: %s", key, exc)

    async def find(self, message_id: MessageId) -> Manifest | None:
        """The manifest of a live message, None when unknown or expired."""
        raw = await self._call(self.store.get_bytes, index_key(message_id))
        manifest = None if raw is None else Manifest.from_json(raw)
        if manifest is not None and manifest.expires is not None and manifest.expires <= now_ms():
            return None  # expired: never served, whatever the sweeper has done yet
        return manifest

    async def load(self, message_id: MessageId) -> Manifest:
        """The manifest of a live message; 404 when unknown or expired."""
        manifest = await self.find(message_id)
        if manifest is None:
            raise NotFound(f"no message with id {message_id}")
        return manifest

    async def open_payload(
        self, manifest: Manifest, start: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]:
        """The payload bytes (or a range) as an async stream; 404 when the object is gone."""
        try:
            pieces = await asyncio.to_thread(
                self.store.open_range, manifest.data_key, start, length
            )
        except FileNotFoundError as exc:
            raise NotFound(f"payload of message {manifest.id} is gone") from exc
        except StoreError as exc:
            raise StorageUnavailable(f"object store unavailable: {exc}") from exc
        return _iterate(pieces)


async def _iterate(pieces: Iterator[bytes]) -> AsyncIterator[bytes]:
    iterator = iter(pieces)
    try:
        while True:
            piece = await asyncio.to_thread(next, iterator, b"")
            if not piece:
                return
            yield piece
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            await asyncio.to_thread(close)
