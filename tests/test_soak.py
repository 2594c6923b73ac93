"""Soak: producers publish while the gateway and the store are killed and restarted in turn.

Every publish the client acknowledged must reach the subscriber intact (its SHA-256
verified), none as a FetchError: a fetch that meets a restart retries
(`fetch_retry_for`) instead of giving up on an object that is intact in the store.

Real parts only: mosquitto, `offload-gateway` as its own process (SIGKILLed and started
again on the same port), a SeaweedFS of this test's own (stopped and started again on the
same ports and data), two producing `Client`s and one subscribing `Client`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from client import Client, Message, MessageError, OffloadError
from gateway.storage import S3Store

from _gateway import GatewayProcess
from _servers import Mosquitto, SeaweedFS

pytestmark = [pytest.mark.servers, pytest.mark.slow]

KiB = 1024
SOAK_SECONDS = 26.0  # faults at 5, 10, 15, 20 s: each part restarted twice
EVERY = 5.0  # seconds between faults, alternating gateway and store
SLOW_READER = 0.3  # seconds the subscriber spends on each message


@pytest.fixture
def store() -> Iterator[SeaweedFS]:
    server = SeaweedFS().start()
    try:
        yield server
    finally:
        server.close()


def test_every_acknowledged_message_survives_restarts(
    store: SeaweedFS, mosquitto_factory: Callable[..., Mosquitto]
) -> None:
    broker = mosquitto_factory(max_packet_size=262144)  # 300 KiB payloads are offloaded
    S3Store(
        store.endpoint, "soak", access_key=store.access_key, secret_key=store.secret_key
    ).ensure_bucket()
    gateway = GatewayProcess(
        {
            "OFFLOAD_STORAGE_URL": store.storage_url("soak"),
            "OFFLOAD_S3_ACCESS_KEY": store.access_key,
            "OFFLOAD_S3_SECRET_KEY": store.secret_key,
            "OFFLOAD_SWEEP_INTERVAL": "0",
            "OFFLOAD_LOG_LEVEL": "WARNING",
            "OFFLOAD_ALLOW_ANONYMOUS": "true",
        }
    ).start()
    acked: dict[str, str] = {}  # message id -> sha256 of every acknowledged publish
    refused = 0
    delivered: dict[str, Message] = {}
    errors: list[MessageError] = []
    done = threading.Event()
    lock = threading.Lock()

    # The subscriber reads slower than the producers publish and takes few messages ahead, so
    # its fetches are spread over the whole soak, outages included, not made the moment the
    # object is written.
    sub = Client(
        broker.url,
        endpoint=gateway.url,
        fetch_retry_for=60,
        fetch_concurrency=2,
        max_pending_deliveries=4,
    )
    sub.connect()
    sub.subscribe("soak/#", 1)

    def consume() -> None:
        while (item := sub.next_message(None)) is not None:
            if isinstance(item, MessageError):
                errors.append(item)
            elif item.message_id is not None:
                delivered[item.message_id] = item
            time.sleep(SLOW_READER)

    def produce(n: int) -> None:
        nonlocal refused
        with Client(broker.url, endpoint=gateway.url, chunking=False, http_timeout=5) as pub:
            seq = 0
            while not done.is_set():
                seq += 1
                body = os.urandom(16) + bytes([n, seq % 256]) * (150 * KiB)
                try:
                    result = pub.publish(f"soak/p{n}", body, qos=1, timeout=10)
                except OffloadError:
                    with lock:
                        refused += 1  # not acknowledged: nothing promised
                else:
                    assert result.message_id is not None
                    with lock:
                        acked[str(result.message_id)] = hashlib.sha256(body).hexdigest()
                time.sleep(0.25)

    threads = [threading.Thread(target=consume, daemon=True)] + [
        threading.Thread(target=produce, args=(n,), daemon=True) for n in (1, 2)
    ]
    for t in threads:
        t.start()
    try:
        started = time.monotonic()
        fault = 0
        while time.monotonic() - started < SOAK_SECONDS:
            time.sleep(EVERY)
            fault += 1
            if fault % 2:
                gateway.kill()
                time.sleep(1.0)
                gateway.start()
            else:
                store.stop()
                time.sleep(1.0)
                store.start()
        done.set()
        for t in threads[1:]:
            t.join(60)
        deadline = time.monotonic() + 120
        while set(acked) - set(delivered) and time.monotonic() < deadline and not errors:
            time.sleep(0.2)
    finally:
        done.set()
        sub.close()
        threads[0].join(10)
        gateway.kill()
    print(
        f"acknowledged {len(acked)}, refused {refused}, delivered {len(delivered)}, "
        f"errors {len(errors)}"
    )
    assert len(acked) > 50, "the producers hardly published: the soak showed nothing"
    assert errors == [], [str(e.error) for e in errors]
    assert set(acked) <= set(delivered), f"lost: {sorted(set(acked) - set(delivered))}"
    for mid, sha in acked.items():
        assert delivered[mid].sha256 == sha
        assert hashlib.sha256(delivered[mid].payload).hexdigest() == sha


def test_chaos_soak_short() -> None:
    """bench/soak.py at a smaller scale: one restart of each kind (broker gracefully with
    persistence, each gateway replica SIGKILLed, the store SIGKILLed), 4 producers and 4
    persistent-session consumers (two slow, so the broker holds a backlog for them when it
    restarts), sizes 1 KiB to 4 MiB across the 256 KiB broker. Every publish that returned
    reaches every consumer intact; duplicates are only reported. With the broker's
    persistence off, the slow consumers lose about 90 of 200 and partial chunked messages
    time out: the test fails."""
    # Loaded by path: bench/ on sys.path would shadow packages (bench/proxy.py is not proxy/).
    path = Path(__file__).resolve().parents[1] / "bench" / "soak.py"
    spec = importlib.util.spec_from_file_location("bench_soak", path)
    assert spec is not None and spec.loader is not None
    bench_soak = importlib.util.module_from_spec(spec)
    sys.modules["bench_soak"] = bench_soak  # its dataclasses look their module up
    spec.loader.exec_module(bench_soak)
    soak = bench_soak.Soak(seed=7, pause=0.5, slow=0.25)
    try:
        soak.start()
        figures = soak.run(0, rounds=1, gap=1.0, drain=60)
    finally:
        soak.close()
    print("\n".join(figures.lines()))
    assert all(figures.restarts[k] == 1 for k in ("broker", "gateway-a", "gateway-b", "store"))
    assert len(figures.published) >= 20, "the producers hardly published: the soak showed nothing"
    assert {"offloaded", "chunked"} <= set(figures.routes), figures.routes
    assert figures.backlog[0] > 0, "nothing was waiting at the broker when it restarted"
    assert figures.corrupt == []
    assert figures.errors == []
    for consumer in figures.delivered:
        assert figures.missing(consumer) == set(), (consumer, sorted(figures.missing(consumer)))
