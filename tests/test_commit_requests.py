"""A commit costs two store requests, and the id guarantees hold without the old lookup.

Before issue 15 every commit first read the id index (one request in four of a small
upload). Now a new id is committed with the sidecar PUT and the conditional index create
only; a retry of an id that is already committed learns it from the create's 412, on any
replica, and removes its own objects. The store is the real SeaweedFS; the counting store
only forwards to it (the `ObjectStore` interface the service really has).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

import bson
import httpx
import pytest

from client.protocol import Manifest, MessageId, Topic, data_key, index_key, meta_key
from gateway.ingest._service import OffloadService, now_ms
from gateway.storage import ObjectInfo, S3Store

from _gateway import GatewayServer

pytestmark = pytest.mark.servers


class CountingStore:
    """Forwards every call to a real store and counts the calls by method name."""

    def __init__(self, inner: S3Store) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def ping(self) -> None:
        self.calls["ping"] += 1
        self.inner.ping()

    def ensure_bucket(self) -> None:
        self.inner.ensure_bucket()

    def put_stream(
        self, key: str, reader: BinaryIO, length: int, content_type: str | None = None
    ) -> None:
        self.calls["put_stream"] += 1
        self.inner.put_stream(key, reader, length, content_type)

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/json") -> None:
        self.calls["put_bytes"] += 1
        self.inner.put_bytes(key, data, content_type)

    def create_bytes(self, key: str, data: bytes, content_type: str = "application/json") -> bool:
        self.calls["create_bytes"] += 1
        return self.inner.create_bytes(key, data, content_type)

    def get_bytes(self, key: str) -> bytes | None:
        self.calls["get_bytes"] += 1
        return self.inner.get_bytes(key)

    def open_range(self, key: str, start: int = 0, length: int | None = None) -> Iterator[bytes]:
        self.calls["open_range"] += 1
        return self.inner.open_range(key, start, length)

    def delete(self, key: str) -> None:
        self.calls["delete"] += 1
        self.inner.delete(key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self.calls["list"] += 1
        return self.inner.list(prefix)

    def concat(
        self, key: str, sources: Sequence[ObjectInfo], content_type: str | None = None
    ) -> None:
        self.calls["concat"] += 1
        self.inner.concat(key, sources, content_type)


def _received(store: S3Store, message_id: MessageId, payload: bytes) -> Manifest:
    """A payload stored as the receive step leaves it: object written, manifest not yet."""
    stamp = now_ms()
    key = data_key(Topic("commit/count"), stamp, uuid.uuid4().hex)
    store.put_bytes(key, payload, "application/octet-stream")
    digest = hashlib.sha256(payload).hexdigest()
    return Manifest(message_id, Topic("commit/count"), stamp, len(payload), digest, key)


def test_a_new_message_commits_with_two_store_requests(store: S3Store) -> None:
    counting = CountingStore(store)
    service = OffloadService(counting)
    manifest = _received(store, MessageId.new(), b"payload")

    stored = asyncio.run(service.commit(manifest))

    assert stored.created is True
    assert counting.calls == Counter({"put_bytes": 1, "create_bytes": 1})
    assert store.get_bytes(index_key(manifest.id)) == store.get_bytes(meta_key(manifest.data_key))


def test_a_retry_on_another_replica_finds_the_committed_id_and_removes_its_own(
    store: S3Store,
) -> None:
    """No lookup first, no shared cache: the conditional create is what tells the retry."""
    message_id = MessageId.new()
    first = _received(store, message_id, b"same bytes")
    assert asyncio.run(OffloadService(store).commit(first)).created is True

    retry = _received(store, message_id, b"same bytes")  # its own payload key
    stored = asyncio.run(OffloadService(store).commit(retry))  # a fresh replica
    assert stored.created is False and stored.manifest.data_key == first.data_key
    assert store.get_bytes(retry.data_key) is None
    assert store.get_bytes(meta_key(retry.data_key)) is None
    assert store.get_bytes(first.data_key) == b"same bytes"

    other = _received(store, message_id, b"other bytes")
    with pytest.raises(Exception, match="already exists"):
        asyncio.run(OffloadService(store).commit(other))
    assert store.get_bytes(other.data_key) is None
    assert store.get_bytes(meta_key(other.data_key)) is None
    manifest = Manifest.from_json(store.get_bytes(index_key(message_id)) or b"")
    assert manifest.data_key == first.data_key


def test_the_same_upload_through_two_gateways_is_stored_once(
    gateway_factory: Callable[..., GatewayServer], store: S3Store
) -> None:
    """A client retrying through another replica (no manifest cached there) gets 201
    `created: false` and the bucket holds one payload, one sidecar and one index."""
    one, two = gateway_factory(None), gateway_factory(None)
    msg_id = uuid.uuid4()
    payload = os.urandom(70_000)
    doc = bson.encode({"message": bson.Binary(payload), "headers": [["_id", msg_id.bytes]]})
    answers = [
        httpx.post(
            f"{gw.url}/topic/commit/twice+oversized",
            content=doc,
            headers={"Content-Type": "application/bson"},
        )
        for gw in (one, two)
    ]
    assert [a.status_code for a in answers] == [201, 201], [a.text for a in answers]
    assert [a.json()["created"] for a in answers] == [True, False]
    objects = sorted(o.key for o in store.list("data/commit/twice/"))
    objects += [o.key for o in store.list(f"ids/{msg_id}")]
    assert len(objects) == 3, objects
    assert httpx.get(f"{two.url}/msg/{msg_id}/payload").content == payload
