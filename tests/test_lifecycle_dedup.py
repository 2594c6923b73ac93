"""One object per payload per account (gateway/retention): against real SeaweedFS, two gateway
replicas on one bucket, mosquitto where a client publishes."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Callable

import httpx
import pytest

from client.protocol import Manifest, MessageId, index_key
from gateway._sweeper import Sweeper
from gateway.retention import Keeper
from gateway.storage import S3Store

from _gateway import GatewayServer
from _servers import SeaweedFS

pytestmark = pytest.mark.servers


@pytest.fixture
def store(seaweed: SeaweedFS, bucket_name: str) -> S3Store:
    s = S3Store(
        seaweed.endpoint, bucket_name, access_key=seaweed.access_key, secret_key=seaweed.secret_key
    )
    s.ensure_bucket()
    return s


def payload_objects(store: S3Store) -> list[str]:
    """Payload objects (not sidecars) anywhere under data/."""
    return sorted(o.key for o in store.list("data/") if not o.key.endswith(".meta.json"))


def put(
    gw: GatewayServer, topic: str, body: bytes, **params: object
) -> tuple[str, dict[str, object]]:
    message_id = str(uuid.uuid4())
    answer = httpx.put(
        f"{gw.url}/msg/{message_id}", params={"topic": topic, **params}, content=body, timeout=60
    )
    assert answer.status_code == 201, answer.text
    return message_id, answer.json()


def manifest_of(store: S3Store, message_id: str) -> Manifest:
    raw = store.get_bytes(index_key(MessageId.parse(message_id)))
    assert raw is not None
    return Manifest.from_json(raw)


def test_the_same_payload_on_two_topics_through_two_replicas_is_stored_once(
    gateway_factory: Callable[..., GatewayServer], store: S3Store
) -> None:
    """Uploaded twice (no link asked first: curl's way), kept once; each message serves it;
    the object outlives the first message and goes with the last, record and all."""
    one, two = gateway_factory(None, sweep_interval=0), gateway_factory(None, sweep_interval=0)
    body = os.urandom(300_000)
    first, _ = put(one, "dedup/a", body, ttl=60)
    second, answer = put(two, "dedup/b", body, ttl=3600)
    assert answer["sha256"] == hashlib.sha256(body).hexdigest()
    assert len(payload_objects(store)) == 1
    a, b = manifest_of(store, first), manifest_of(store, second)
    assert b.data_key == a.data_key and b.filed_at is not None and b.blob == a.blob
    for gw, message_id in ((two, first), (one, second)):
        assert httpx.get(f"{gw.url}/msg/{message_id}/payload").content == body

    sweeper = Sweeper(store, interval=0, keeper=Keeper.plain(store))
    sweeper.sweep_once(now_ms=int(time.time() * 1000) + 120_000)  # the first one expired
    # A replica that has not cached the deleted message (a cached manifest is trusted for
    # 10 s: with the object shared, a replica that read it may serve it that long).
    fresh = gateway_factory(None, sweep_interval=0)
    assert httpx.get(f"{fresh.url}/msg/{first}/payload").status_code == 404
    assert httpx.get(f"{fresh.url}/msg/{second}/payload").content == body
    assert len(payload_objects(store)) == 1

    sweeper.sweep_once(now_ms=int(time.time() * 1000) + 7_200_000)  # and the second
    assert payload_objects(store) == []
    assert [o.key for o in store.list("blobs/")] == []
    assert [o.key for o in store.list("data/")] == []
