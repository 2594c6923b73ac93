"""One object per payload per account (gateway/retention): against real SeaweedFS, two gateway
replicas on one bucket, mosquitto where a client publishes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from client import Client, Message, Route, gateway_auth
from client.protocol import Manifest, MessageId, index_key
from gateway._sweeper import Sweeper
from gateway.retention import Keeper
from gateway.storage import S3Store

from _auth import AUTH_SECRET, credential_files
from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers

OFFLOAD = shutil.which("offload") or "offload"
USERS = {"alice": "alice-pw", "bob": "bob-pw"}


def login(user: str) -> httpx.Auth:
    auth = gateway_auth(username=user, password=USERS[user], token=None, scheme="scram")
    assert auth is not None
    return auth


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


def received_bytes() -> float:
    """Upload body bytes every in-process gateway received (raw uploads and links)."""
    from prometheus_client import REGISTRY

    routes = ("/msg/{message_id}", "/msg/{message_id}/link")
    return sum(
        REGISTRY.get_sample_value("offload_http_received_bytes_total", {"route": r}) or 0.0
        for r in routes
    )


def test_the_library_sends_a_payload_its_account_stores_no_more(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    store: S3Store,
) -> None:
    """The same 600 kB published on three topics: asked by SHA-256 first, the gateway gets
    its bytes once, the bucket holds one object, every subscriber gets the payload; with
    `dedup` off the client sends it again (and the gateway still keeps one copy)."""
    gw = gateway_factory(broker)
    payload = os.urandom(600_000)
    with Client(broker.url, endpoint=gw.url, client_id="sub-dedup") as sub:
        sub.subscribe("dedup/+", qos=1)
        before = received_bytes()
        with Client(broker.url, endpoint=gw.url) as producer:
            results = [producer.publish(f"dedup/{t}", payload, qos=1) for t in ("a", "b", "c")]
        sent = received_bytes() - before
        assert all(r.route is Route.OFFLOADED for r in results)
        for _ in results:
            item = sub.next_message(timeout=30)
            assert isinstance(item, Message) and item.payload == payload
    assert len(payload) <= sent < 1.1 * len(payload)
    assert len(payload_objects(store)) == 1

    before = received_bytes()
    with Client(broker.url, endpoint=gw.url, dedup=False) as producer:
        producer.publish("dedup/d", payload, qos=1)
    assert received_bytes() - before >= len(payload)
    assert len(payload_objects(store)) == 1


def test_offload_publish_twice_sends_the_file_once_and_usage_counts_it_once(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto, tmp_path: Path
) -> None:
    """The CLI, as a script runs it: `offload publish -f` twice, then `offload usage`."""
    gw = gateway_factory(broker, max_stored_bytes_per_user=10_000_000)
    path = tmp_path / "scan.bin"
    path.write_bytes(os.urandom(400_000))
    env = {**os.environ, "OFFLOAD_BROKER": broker.url, "OFFLOAD_ENDPOINT": gw.url}
    before = received_bytes()
    for topic in ("cli/a", "cli/b"):
        done = subprocess.run(
            [OFFLOAD, "publish", "-t", topic, "-f", str(path)], env=env, capture_output=True
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["route"] == "offloaded"
    assert received_bytes() - before < 1.1 * 400_000
    done = subprocess.run([OFFLOAD, "usage"], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout)
    assert line == {
        "user": None, "counted": True, "stored_bytes": 400_000, "held_bytes": 0,
        "limit_bytes": 10_000_000,
    }  # fmt: skip


def test_an_account_cannot_learn_whether_another_stores_a_payload(
    gateway_factory: Callable[..., GatewayServer], tmp_path: Path, store: S3Store
) -> None:
    """Bob asking for the payload Alice stores gets the very answer he gets for one nobody
    stores (status, body, headers but the request id); Alice gets hers linked."""
    with credential_files("probe-", USERS, "pattern readwrite #\n") as files:
        gw = gateway_factory(
            None,
            password_file=files / "passwd",
            acl_file=files / "acl",
            auth_secret=AUTH_SECRET,
            allow_anonymous=False,
        )
        secret = os.urandom(70_000)
        stored = httpx.put(
            f"{gw.url}/msg/{uuid.uuid4()}",
            params={"topic": "probe/x"},
            content=secret,
            auth=login("alice"),
        )
        assert stored.status_code == 201, stored.text

        def ask(user: str, body: bytes) -> httpx.Response:
            return httpx.post(
                f"{gw.url}/msg/{uuid.uuid4()}/link",
                params={"topic": "probe/x"},
                headers={
                    "X-Offload-Sha256": hashlib.sha256(body).hexdigest(),
                    "X-Offload-Size": str(len(body)),
                },
                auth=login(user),
            )

        hit, miss = ask("bob", secret), ask("bob", os.urandom(70_000))
        assert (hit.status_code, hit.content) == (miss.status_code, miss.content) == (
            404, miss.content,
        )  # fmt: skip
        strip = {"x-request-id", "date", "authentication-info"}
        assert {k: v for k, v in hit.headers.items() if k not in strip} == {
            k: v for k, v in miss.headers.items() if k not in strip
        }
        assert ask("alice", secret).status_code == 201
    assert len(payload_objects(store)) == 1


def test_a_false_hash_claimed_for_a_direct_upload_is_never_linked_to(
    gateway_factory: Callable[..., GatewayServer], seaweed: SeaweedFS, store: S3Store
) -> None:
    """A multipart direct upload whose whole SHA-256 is the producer's word (parts are
    store-verified, the whole is not): its payload keeps a record of its own, so a later
    message of the same claimed content is never served its bytes; a lie costs only its
    own message."""
    gw = gateway_factory(None, s3_public_url=f"http://{seaweed.endpoint}")
    real = os.urandom(5 * 1024 * 1024 + 1000)
    claimed = hashlib.sha256(b"what it is not").hexdigest()
    a, b = real[: 5 * 1024 * 1024], real[5 * 1024 * 1024 :]
    parts = [hashlib.sha256(p).hexdigest() for p in (a, b)]
    body = {"size": len(real), "sha256": claimed, "part_size": len(a), "parts": parts}
    granted = httpx.post(f"{gw.url}/direct/grant/lie/x", json=body)
    assert granted.status_code == 201, granted.text
    etags = [
        httpx.put(u, content=d).headers["ETag"]
        for u, d in zip(granted.json()["urls"], (a, b), strict=True)
    ]
    done = httpx.post(
        f"{gw.url}/direct/commit", json={"grant": granted.json()["grant"], "etags": etags}
    )
    assert done.status_code == 201, done.text
    asked = httpx.post(
        f"{gw.url}/msg/{uuid.uuid4()}/link",
        params={"topic": "lie/y"},
        headers={"X-Offload-Sha256": claimed, "X-Offload-Size": str(len(real))},
    )
    assert asked.status_code == 404  # never linked to the unverified bytes
