"""Retention by consumer group (gateway/retention): real mosquitto, SeaweedFS, two gateway
replicas on one bucket, consumers of the library naming their group."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from client import Client, Message, Route
from client.protocol import ACKS_PREFIX, Manifest, MessageId, ack_key, index_key
from gateway._sweeper import Sweeper
from gateway.retention import Keeper
from gateway.storage import S3Store

from _gateway import GatewayServer
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers

GROUPS = """
[topics]
"fan/#" = ["analytics", "archive", "ml"]
"fan/audited/#" = ["audit"]

[members]
audit = ["auditor"]
"""


@pytest.fixture
def replicas(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto, tmp_path: Path
) -> tuple[GatewayServer, GatewayServer]:
    groups = tmp_path / "groups.toml"
    groups.write_text(GROUPS)
    settings = {"retention_groups_file": groups, "sweep_interval": 0, "confirm_sweep_interval": 0.3}
    return gateway_factory(broker, **settings), gateway_factory(broker, **settings)


def manifest(store: S3Store, message_id: str) -> Manifest | None:
    raw = store.get_bytes(index_key(MessageId.parse(message_id)))
    return None if raw is None else Manifest.from_json(raw)


def gone(store: S3Store, *prefixes: str) -> bool:
    """Nothing left under any of `prefixes`."""
    return not any(any(True for _ in store.list(prefix)) for prefix in prefixes)


def received(client: Client, timeout: float = 30) -> Message:
    item = client.next_message(timeout=timeout)
    assert isinstance(item, Message), item
    return item


def test_the_slowest_group_gets_its_payload_after_the_others_confirmed(
    replicas: tuple[GatewayServer, GatewayServer], broker: Mosquitto, store: S3Store
) -> None:
    """Three groups wait for fan/#: two confirm at once (one of them with two members,
    counted once) through two replicas, the payload stays; the third, away meanwhile,
    gets it when it comes back and confirms; then it is gone, record and all."""
    one, two = replicas
    # Replicas behind one URL in production; here each has its own: placeholders name the
    # publishing replica's, which consumers of the other take from the allow-list.
    both = {"discovery_allowlist": (one.url, two.url), "untrusted_endpoint": "anonymous"}
    ml = Client(broker.url, endpoint=one.url, client_id="ml-1", session_expiry=600, group="ml")
    with ml:  # subscribed, then away with its session kept
        ml.subscribe("fan/#", qos=1)
    consumers = [
        Client(broker.url, endpoint=one.url, group="archive"),
        Client(broker.url, endpoint=two.url, group="analytics", **both),  # type: ignore[arg-type]
        Client(broker.url, endpoint=two.url, group="analytics", **both),  # type: ignore[arg-type]
    ]
    payload = os.urandom(300 * 1024)
    try:
        for consumer in consumers:
            consumer.connect()
            consumer.subscribe("fan/#", qos=1)
        with Client(broker.url, endpoint=one.url) as producer:
            result = producer.publish("fan/cams", payload, qos=1)
        assert result.route is Route.OFFLOADED and result.message_id is not None
        for consumer in consumers:
            assert received(consumer).payload == payload
    finally:
        for consumer in consumers:
            consumer.close()
    message_id = result.message_id
    confirmed = store.list(f"{ACKS_PREFIX}{message_id}.")
    assert sorted(info.key.rsplit("/", 1)[-1] for info in confirmed) == ["analytics", "archive"]
    time.sleep(1.5)  # several short sweeps: never earlier than every group
    assert manifest(store, message_id) is not None

    ml = Client(broker.url, endpoint=one.url, client_id="ml-1", session_expiry=600, group="ml")
    with ml:  # back: the queued placeholder, the payload still there
        assert received(ml).payload == payload
    wait_until(lambda: manifest(store, message_id) is None, "deleted once ml confirmed", 10)
    # Index first, then the sidecar, confirmations, object and record: all of it goes.
    wait_until(lambda: gone(store, "data/fan/", ACKS_PREFIX, "blobs/"), "everything", 10)


def test_a_download_without_a_confirmation_keeps_the_payload_until_it_expires(
    replicas: tuple[GatewayServer, GatewayServer], store: S3Store
) -> None:
    """A consumer that fetched the payload whole and died before it confirmed (as one whose
    redirected fetch the gateway never saw end) leaves it stored: only confirmations
    count. It still goes at its expiry."""
    one, two = replicas
    body = os.urandom(4096)
    answer = httpx.post(f"{one.url}/publish/fan/lost?expiry=60", content=body, timeout=30)
    assert answer.status_code == 201, answer.text
    message_id = answer.json()["id"]
    fetched = httpx.get(f"{two.url}/msg/{message_id}/payload", timeout=30)
    assert fetched.content == body  # ... and the consumer dies here
    for group in ("archive", "analytics"):  # two of the three groups confirm
        httpx.post(f"{one.url}/msg/{message_id}/confirm", params={"group": group}, timeout=30)
    time.sleep(1.0)
    assert manifest(store, message_id) is not None
    Sweeper(store, interval=0, keeper=Keeper.plain(store)).sweep_once(
        now_ms=int(time.time() * 1000) + 120_000
    )
    assert manifest(store, message_id) is None
    assert [o.key for o in store.list(ACKS_PREFIX)] == []


def test_a_replica_stopped_between_the_last_confirmation_and_the_delete(
    replicas: tuple[GatewayServer, GatewayServer], store: S3Store
) -> None:
    """What a replica killed after it recorded the last confirmation leaves (every group's
    confirmation, the message still there) is deleted by the other's short sweep."""
    one, _ = replicas
    body = os.urandom(4096)
    message_id = httpx.post(f"{one.url}/publish/fan/crash", content=body).json()["id"]
    found = manifest(store, message_id)
    assert found is not None
    for group in found.groups:  # written as the dead replica did, then no delete
        store.create_bytes(ack_key(found.id, found.token, group), b"{}")
    wait_until(lambda: gone(store, "data/fan/", ACKS_PREFIX, "blobs/"), "a short sweep", 10)
    assert manifest(store, message_id) is None


def test_confirmations_that_do_not_count(
    replicas: tuple[GatewayServer, GatewayServer], store: S3Store
) -> None:
    """A topic without groups keeps its TTL (a confirmation is answered, not counted); a
    group the message does not wait for is not counted; a group that lists its members
    refuses anyone else (403, as for anonymous callers here)."""
    one, two = replicas
    plain = httpx.post(f"{one.url}/publish/other/t", content=b"x" * 100).json()["id"]
    answer = httpx.post(f"{two.url}/msg/{plain}/confirm", params={"group": "archive"}).json()
    assert answer["counted"] is False and "no group" in answer["detail"]
    assert manifest(store, plain) is not None and manifest(store, plain).groups == ()  # type: ignore[union-attr]

    fan = httpx.post(f"{one.url}/publish/fan/x", content=b"y" * 100).json()["id"]
    answer = httpx.post(f"{two.url}/msg/{fan}/confirm", params={"group": "sales"}).json()
    assert answer["counted"] is False and sorted(answer["remaining"]) == [
        "analytics", "archive", "ml"
    ]  # fmt: skip
    audited = httpx.post(f"{one.url}/publish/fan/audited/1", content=b"z" * 100).json()["id"]
    assert manifest(store, audited).groups == ("analytics", "archive", "audit", "ml")  # type: ignore[union-attr]
    refused = httpx.post(f"{two.url}/msg/{audited}/confirm", params={"group": "audit"})
    assert refused.status_code == 403 and "member" in refused.json()["detail"]
    assert httpx.post(f"{two.url}/msg/{fan}/confirm", params={"group": "a b"}).status_code == 400
    unknown = httpx.post(f"{two.url}/msg/{MessageId.new()}/confirm", params={"group": "ml"})
    assert unknown.status_code == 404
    assert hashlib.sha256(httpx.get(f"{one.url}/msg/{fan}/payload").content).hexdigest()
