"""Retention against real SeaweedFS: expiry, the sweeper, delete-after-fetch."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from urllib.parse import quote

import bson
import httpx
import pytest
from prometheus_client import REGISTRY

from client import Client, Message
from client.protocol import (
    Manifest,
    MessageId,
    Placeholder,
    Topic,
    data_key,
    index_key,
    meta_key,
)
from gateway._sweeper import Sweeper, partition_end_ms
from gateway.ingest._service import OffloadService
from gateway.storage import S3Store
from gateway.storage._store_connection import LIMIT as STORE_READ_AHEAD

from _gateway import GatewayServer
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers

HOUR_MS = 3600 * 1000


def upload_doc(payload: bytes, msg_id: uuid.UUID) -> bytes:
    return bson.encode({"message": bson.Binary(payload), "headers": [["_id", msg_id.bytes]]})


def keys(store: S3Store) -> set[str]:
    """The messages' objects: payloads, sidecars, the id index (not the payloads' records,
    which tests/test_lifecycle*.py follow)."""
    return {info.key for info in store.list("") if not info.key.startswith("blobs/")}


@pytest.fixture
def gw(gateway_factory: Callable[..., GatewayServer]) -> GatewayServer:
    # No background sweeps: these tests call the sweeper themselves.
    return gateway_factory(None, sweep_interval=0)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- expiry arithmetic ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("default", "cap", "ttl", "seconds"),
    [
        (100, 0, None, 100),  # the default
        (100, 0, 5, 5),  # the uploader's ttl wins over the default
        (100, 50, 5000, 50),  # clamped to the cap
        (0, 0, None, None),  # kept forever
        (0, 60, None, 60),  # "forever" is capped too
        (100, 50, None, 50),  # so is the default
    ],
)
def test_expiry_for(default: int, cap: int, ttl: int | None, seconds: int | None) -> None:
    service = OffloadService(store=None, default_ttl=default, max_ttl=cap)  # type: ignore[arg-type]
    expected = None if seconds is None else 1_000 + seconds * 1000
    assert service.expiry_for(1_000, ttl) == expected


@pytest.mark.parametrize(
    ("default", "cap", "floor", "ttl", "seconds"),
    [
        (100, 0, 3600, 5, 3600),  # a short ttl is raised to the sessions' floor
        (100, 0, 3600, None, 3600),  # so is the default
        (100, 0, 60, 7200, 7200),  # a longer one is kept
        (0, 0, 60, None, None),  # "forever" stays forever
        (100, 600, 3600, 5, 600),  # the cap still wins
    ],
)
def test_expiry_for_with_a_retention_floor(
    default: int, cap: int, floor: int, ttl: int | None, seconds: int | None
) -> None:
    service = OffloadService(store=None, default_ttl=default, max_ttl=cap, min_ttl=floor)  # type: ignore[arg-type]
    expected = None if seconds is None else 1_000 + seconds * 1000
    assert service.expiry_for(1_000, ttl) == expected


def test_partition_end_comes_from_the_key() -> None:
    key = data_key(Topic("a/b"), 1_700_000_000_000, "tok")  # 2023-11-14 22:13 UTC
    end = partition_end_ms(key)
    assert end is not None and end - HOUR_MS <= 1_700_000_000_000 < end
    assert partition_end_ms("elsewhere/x") is None
    assert partition_end_ms(meta_key(key)) is None


# -- through the gateway --------------------------------------------------------------------


def test_ttl_is_stored_and_capped(
    gateway_factory: Callable[..., GatewayServer], store: S3Store
) -> None:
    gw = gateway_factory(None, sweep_interval=0, max_ttl=60, default_ttl=30)
    ids = [uuid.uuid4() for _ in range(3)]
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        for msg_id, query in zip(ids, ["?ttl=10", "?ttl=999999", ""], strict=True):
            r = http.post(f"/topic/r/ttl+oversized{query}", content=upload_doc(b"x", msg_id))
            assert r.status_code == 201, r.text
        assert http.post("/topic/r/ttl+oversized?ttl=0", content=b"").status_code == 400
        assert http.post("/topic/r/ttl+oversized?ttl=soon", content=b"").status_code == 400
    lifetimes = []
    for msg_id in ids:
        raw = store.get_bytes(index_key(MessageId.parse(str(msg_id))))
        assert raw is not None
        manifest = Manifest.from_json(raw)
        assert manifest.expires is not None
        lifetimes.append(manifest.expires - manifest.timestamp)
    assert lifetimes == [10_000, 60_000, 30_000]


def test_expired_message_is_never_served_even_before_the_sweeper_runs(
    gw: GatewayServer, store: S3Store
) -> None:
    msg_id = uuid.uuid4()
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        r = http.post("/topic/r/short+oversized?ttl=1", content=upload_doc(b"brief", msg_id))
        assert r.status_code == 201, r.text
        assert http.get(f"/msg/{msg_id}/payload").content == b"brief"
        time.sleep(1.2)
        assert http.get(f"/msg/{msg_id}/payload").status_code == 404
        assert http.get(f"/msg/{msg_id}").status_code == 404
        assert http.head(f"/msg/{msg_id}/payload").status_code == 404
    # Still stored: the refusal is the gateway's, not the sweeper's.
    assert len(keys(store)) == 3
    report = Sweeper(store).sweep_once()
    assert report.expired == 1
    assert keys(store) == set()


def test_sweeper_deletes_only_expired_messages(gw: GatewayServer, store: S3Store) -> None:
    short, long = uuid.uuid4(), uuid.uuid4()
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        for msg_id, ttl in ((short, 1), (long, 3600)):
            r = http.post(f"/topic/r/mix+oversized?ttl={ttl}", content=upload_doc(b"p", msg_id))
            assert r.status_code == 201
        report = Sweeper(store).sweep_once(now_ms() + 2_000)
        assert (report.expired, report.kept, report.orphans, report.errors) == (1, 1, 0, 0)
        assert http.get(f"/msg/{long}/payload").status_code == 200
    left = keys(store)
    assert left and all(str(short) not in k for k in left)
    assert len(left) == 3  # the long one's payload, sidecar and index


def test_an_id_reused_after_expiry_keeps_its_new_index(gw: GatewayServer, store: S3Store) -> None:
    msg_id = uuid.uuid4()
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        assert (
            http.post("/topic/r/re+oversized?ttl=1", content=upload_doc(b"old", msg_id))
        ).status_code == 201
        time.sleep(1.2)
        r = http.post("/topic/r/re+oversized?ttl=3600", content=upload_doc(b"new", msg_id))
        assert r.status_code == 201 and r.json()["created"] is True
        # Taking over the expired id removed the old message (the index is created only
        # where none exists, so the expired one had to go first): nothing left to sweep.
        report = Sweeper(store).sweep_once()
        assert report.expired == 0 and report.kept == 1
        assert http.get(f"/msg/{msg_id}/payload").content == b"new"
    assert len(keys(store)) == 3


def _orphan(store: S3Store, hours_ago: float, *, sidecar: bool) -> str:
    stamp = now_ms() - int(hours_ago * HOUR_MS)
    key = data_key(Topic("r/orphans"), stamp, uuid.uuid4().hex)
    store.put_bytes(key, b"abandoned", "application/octet-stream")
    if sidecar:  # crash after the sidecar, before the index
        manifest = Manifest(MessageId.new(), Topic("r/orphans"), stamp, 9, "0" * 64, key)
        store.put_bytes(meta_key(key), manifest.to_json())
    return key


def test_abandoned_payloads_go_after_the_grace_period_and_a_second_look(store: S3Store) -> None:
    old = _orphan(store, 3, sidecar=False)
    old_with_sidecar = _orphan(store, 3, sidecar=True)
    young = _orphan(store, 0, sidecar=False)
    foreign = "backups/not-ours.bin"
    store.put_bytes(foreign, b"keep me")
    sweeper = Sweeper(store, grace=3600)

    first = sweeper.sweep_once()
    assert (first.orphans, first.suspects) == (0, 2)
    assert {old, old_with_sidecar, young} <= keys(store)  # seen once: not yet deleted

    second = sweeper.sweep_once()
    assert (second.orphans, second.suspects) == (2, 0)
    assert keys(store) == {young, foreign}  # payloads and the sidecar gone


def test_claims_on_direct_grants_go_once_their_grant_is_long_expired(store: S3Store) -> None:
    """A claim a crashed commit left (`grants/<expires>/<digest>`) goes after expiry + grace."""
    now = int(time.time())
    stale = f"grants/{now - 3601 - 60}/{'a' * 32}"
    recent = f"grants/{now - 60}/{'b' * 32}"  # expired, but within the grace period
    live = f"grants/{now + 3600}/{'c' * 32}"
    foreign = "grants/not-a-claim"
    for key in (stale, recent, live, foreign):
        store.put_bytes(key, b"{}")
    Sweeper(store, grace=3600).sweep_once()
    assert keys(store) == {recent, live, foreign}


def test_replicas_sweeping_at_once_do_not_trip_over_each_other(store: S3Store) -> None:
    for _ in range(8):
        stamp = now_ms() - 10_000
        key = data_key(Topic("r/many"), stamp, uuid.uuid4().hex)
        manifest = Manifest(MessageId.new(), Topic("r/many"), stamp, 1, "0" * 64, key)
        manifest = replace(manifest, expires=stamp + 1)
        store.put_bytes(key, b"x", "application/octet-stream")
        store.put_bytes(meta_key(key), manifest.to_json())
        store.put_bytes(index_key(manifest.id), manifest.to_json())
    reports = []
    errors: list[BaseException] = []

    def sweep() -> None:
        try:
            reports.append(Sweeper(store).sweep_once())
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=sweep) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert all(r.errors == 0 for r in reports)
    assert keys(store) == set()


def test_the_lifespan_sweeper_runs_by_itself(
    gateway_factory: Callable[..., GatewayServer], store: S3Store
) -> None:
    gw = gateway_factory(None, sweep_interval=0.5)
    msg_id = uuid.uuid4()
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        assert (
            http.post("/topic/r/auto+oversized?ttl=1", content=upload_doc(b"x", msg_id))
        ).status_code == 201
    deadline = time.monotonic() + 15
    while keys(store) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert keys(store) == set()


# -- delete after fetch ---------------------------------------------------------------------


@pytest.fixture
def once(gateway_factory: Callable[..., GatewayServer]) -> GatewayServer:
    return gateway_factory(None, sweep_interval=0, delete_after_fetch=True)


def handed(topic: str) -> dict[str, str]:
    """The header a subscriber sends: the topic it got the placeholder on."""
    return {"X-Offload-Placeholder-Topic": quote(topic, safe="")}


def test_delete_after_fetch_deletes_after_one_whole_read(
    once: GatewayServer, store: S3Store
) -> None:
    msg_id = uuid.uuid4()
    payload = os.urandom(100_000)
    mine = handed("r/once")
    with httpx.Client(base_url=once.url, timeout=30, headers=mine) as http:
        assert http.post("/topic/r/once+oversized", content=upload_doc(payload, msg_id)).is_success
        # Neither a HEAD nor a range is a fetch of the message.
        assert http.head(f"/msg/{msg_id}/payload").status_code == 200
        part = http.get(f"/msg/{msg_id}/payload", headers={"Range": "bytes=0-99"})
        assert part.status_code == 206
        whole = http.get(f"/msg/{msg_id}/payload")
        assert whole.status_code == 200 and whole.content == payload
        assert http.get(f"/msg/{msg_id}/payload").status_code == 404
    assert keys(store) == set()


def test_delete_after_fetch_works_for_the_hop_download_too(
    once: GatewayServer, store: S3Store
) -> None:
    msg_id = uuid.uuid4()
    with httpx.Client(base_url=once.url, timeout=30, headers=handed("r/hop")) as http:
        assert http.post("/topic/r/hop+oversized", content=upload_doc(b"hop", msg_id)).is_success
        assert bson.decode(http.get(f"/msg/{msg_id}").content)["message"] == b"hop"
        assert http.get(f"/msg/{msg_id}").status_code == 404
    assert keys(store) == set()


def test_only_a_fetch_for_the_messages_own_topic_deletes_it(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    store: S3Store,
    unique_topic: Callable[[str], str],
) -> None:
    """A publisher on topic A hands out a placeholder naming topic B's message (which the
    subscriber may read): the subscriber's fetch must not delete B's message."""
    gw = gateway_factory(broker, sweep_interval=0, delete_after_fetch=True)
    other, hostile = unique_topic("victim"), unique_topic("hostile")
    payload, msg_id = os.urandom(50_000), uuid.uuid4()
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        stored = http.post(f"/topic/{other}+oversized", content=upload_doc(payload, msg_id))
        assert stored.status_code == 201, stored.text
        url = stored.json()["url"]
        # Fetches that name no topic, another topic, or bytes that are not UTF-8: served,
        # and nothing deleted.
        for headers in ({}, handed(hostile), {"X-Offload-Placeholder-Topic": "%FF"}):
            got = http.get(f"/msg/{msg_id}/payload", headers=headers)
            assert got.status_code == 200 and got.content == payload
    ref = Placeholder(url, len(payload), hashlib.sha256(payload).hexdigest(), MessageId(msg_id))
    body, props = ref.encode(None)
    sub = Client(broker.url, endpoint=gw.url)
    sub.connect()
    try:
        sub.subscribe(hostile)
        sub.connection.publish(hostile, body, qos=1, properties=props).result(10)
        got = sub.next_message(30)
        assert isinstance(got, Message) and got.payload == payload  # served, on its word
        # B's own subscriber still finds the message, and its fetch is the one that deletes.
        sub.subscribe(other)
        sub.connection.publish(other, body, qos=1, properties=props).result(10)
        got = sub.next_message(30)
        assert isinstance(got, Message) and got.payload == payload
    finally:
        sub.close()
    # The gateway deletes once the last piece left it, after the subscriber may have read it.
    gone = lambda: httpx.get(f"{gw.url}/msg/{msg_id}/payload").status_code == 404  # noqa: E731
    wait_until(gone, "B's message deleted after its own topic's fetch", 10)


def _payloads_served() -> float:
    """Whole-payload GETs the gateway has finished answering, counted once the handler
    returned (after any delete-after-fetch). Read from this process's registry: the test
    gateway runs in a thread here, and a /metrics request would be one more task on the
    event loop whose timing the test is about."""
    labels = {"method": "GET", "route": "/msg/{message_id}/payload", "status": "200"}
    return REGISTRY.get_sample_value("offload_http_requests_total", labels) or 0.0


def _fetch_64k_and_close(gw: GatewayServer, msg_id: uuid.UUID, topic: str) -> None:
    """GET the payload as its subscriber would, read 64 KiB of it, close the connection,
    and wait until the gateway has finished with that request.

    The receive buffer is set small before connecting, which turns off its autotuning:
    the kernel cannot take the payload off the gateway's hands on the client's behalf.
    """
    served = _payloads_served()
    with socket.create_connection(("127.0.0.1", gw.port), timeout=60) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.sendall(
            f"GET /msg/{msg_id}/payload HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"X-Offload-Placeholder-Topic: {quote(topic, safe='')}\r\n\r\n".encode()
        )
        got = b""
        while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < 65536:
            piece = sock.recv(65536)
            assert piece, "the gateway closed the connection"
            got += piece
        assert got.startswith(b"HTTP/1.1 200 "), got[:200]
    wait_until(lambda: _payloads_served() > served, "the end of the interrupted fetch", 60)


def _dropped_fetches_keep_the_message(
    gw: GatewayServer, store: S3Store, topic: str, payload: bytes, *, drops: int
) -> None:
    """Upload `payload`, drop its fetch after 64 KiB `drops` times (the message stays
    each time), then fetch it whole: the message is served, then gone."""
    msg_id = uuid.uuid4()
    with httpx.Client(base_url=gw.url, timeout=60) as http:
        posted = http.post(f"/topic/{topic}+oversized", content=upload_doc(payload, msg_id))
        assert posted.is_success, posted.text
    for _ in range(drops):
        _fetch_64k_and_close(gw, msg_id, topic)
        assert len(keys(store)) == 3  # payload, sidecar and index
    with httpx.Client(base_url=gw.url, timeout=60, headers=handed(topic)) as http:
        again = http.get(f"/msg/{msg_id}/payload")
        assert again.status_code == 200 and again.content == payload
        assert http.get(f"/msg/{msg_id}/payload").status_code == 404


def test_an_interrupted_fetch_keeps_the_message(once: GatewayServer, store: S3Store) -> None:
    """A client gone after 64 KiB: the gateway cannot have handed the payload over whole.

    The payload is larger than what can sit between the two ends at once: the client's
    small receive buffer, the gateway's send buffer (at most tcp_wmem's maximum) and the
    gateway's own few MiB of buffers. Fetched and dropped a few times, as the point where
    the gateway notices the disconnect varies.
    """
    with open("/proc/sys/net/ipv4/tcp_wmem") as f:
        send_buffer_max = int(f.read().split()[2])
    payload = os.urandom(max(32 << 20, 2 * send_buffer_max + (8 << 20)))
    _dropped_fetches_keep_the_message(once, store, "r/cut", payload, drops=3)


def test_a_client_gone_while_the_gateway_holds_the_rest_keeps_the_message(
    gateway_factory: Callable[..., GatewayServer], store: S3Store
) -> None:
    """The rest of the payload is in the gateway's memory when its client leaves.

    The gateway's send buffer is fixed at 64 KiB and the client's receive buffer small:
    of a payload the size of what the gateway buffers from the store, far from all can
    leave the gateway before the client reads 64 KiB and closes, and the store has sent
    the rest by then. The response then runs to its end without waiting on anything,
    every send after the disconnect a no-op in uvicorn: that must not count as a fetch.
    Dropped ten times: without the gateway's check, a drop deletes the message only when
    the delete's store call starts before the cancellation that follows the disconnect.
    """
    gw = gateway_factory(None, sweep_interval=0, delete_after_fetch=True, send_buffer=65536)
    payload = os.urandom(STORE_READ_AHEAD)
    _dropped_fetches_keep_the_message(gw, store, "r/held", payload, drops=10)


def test_by_default_messages_survive_being_fetched(gw: GatewayServer) -> None:
    msg_id = uuid.uuid4()
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        assert http.post("/topic/r/keep+oversized", content=upload_doc(b"k", msg_id)).is_success
        for _ in range(3):
            assert http.get(f"/msg/{msg_id}/payload").content == b"k"
