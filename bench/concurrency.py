"""Benchmark 6: 64 KiB uploads from 32 concurrent clients, gateway versus direct S3 puts.

Starts SeaweedFS and `offload-gateway` as a subprocess (`--workers`, default 2: one per
core). 32 threads, each with its own connection (httpx.Client for the gateway, one shared
MinIO client with a 32-connection pool for S3), upload 64 KiB payloads for a fixed number
of requests each:

* baseline: `Minio.put_object` of the payload (one S3 request);
* candidate: `POST /topic/<t>+oversized` (BSON via `client.protocol.encode_upload`): the
  gateway stores the payload, its sidecar manifest and the id index (three S3 writes, so a
  message is durable and findable before the 201; four requests before issue 15).

Reports requests/s, p50/p99 latency and CPU milliseconds per request of the gateway (with
its workers), SeaweedFS and this client; ratio = gateway rate / direct rate, target >= 0.5
(issue 15).

    python bench/concurrency.py                 # 32 clients x 30 requests
    python bench/concurrency.py --workers 1
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable

import httpx
from _harness import CpuMeter, SeaweedFS, cpu_text, emit, gateway_process, make_bucket, row
from minio import Minio
from urllib3 import PoolManager

from client.protocol import MessageId, encode_upload

KiB = 1024


def run_clients(
    clients: int, per_client: int, make: Callable[[], Callable[[], None]]
) -> list[float]:
    """Latencies of all requests; the wall time is appended last."""
    latencies: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            send = make()
            send()  # warm-up: the connection is open before the clock starts
            start.wait()
            mine = []
            for _ in range(per_client):
                t0 = time.perf_counter()
                send()
                mine.append(time.perf_counter() - t0)
            with lock:
                latencies.extend(mine)
        except BaseException as exc:
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return [*latencies, wall]


def summary(name: str, results: list[float]) -> tuple[float, float, float]:
    *latencies, wall = results
    ordered = sorted(latencies)
    rate = len(ordered) / wall
    p50 = statistics.median(ordered) * 1e3
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3
    print(f"{name}: {rate:.0f} req/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    return rate, p50, p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=30, help="per client")
    parser.add_argument("--size", type=int, default=64 * KiB)
    parser.add_argument("--workers", type=int, default=2, help="gateway uvicorn workers")
    args = parser.parse_args()
    payload = os.urandom(args.size)
    seaweed = SeaweedFS().start()
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        make_bucket(seaweed, bucket)
        s3 = Minio(
            seaweed.endpoint,
            seaweed.access_key,
            seaweed.secret_key,
            secure=False,
            http_client=PoolManager(maxsize=args.clients),
        )

        def direct() -> Callable[[], None]:
            def send() -> None:
                key = f"direct/{uuid.uuid4().hex}"
                s3.put_object(bucket, key, io.BytesIO(payload), len(payload))

            return send

        with gateway_process(seaweed, bucket, workers=args.workers) as gw:

            def gateway() -> Callable[[], None]:
                http = httpx.Client(timeout=60)

                def send() -> None:
                    message_id = MessageId.new()
                    head, tail = encode_upload(len(payload), headers=[("_id", message_id.bytes)])
                    r = http.post(
                        f"{gw.url}/topic/bench/concurrency+oversized",
                        content=head + payload + tail,
                        headers={"Content-Type": "application/bson"},
                    )
                    assert r.status_code == 201, r.text

                return send

            label = f"{args.clients} clients x {args.requests} x {args.size // KiB} KiB"
            meter = CpuMeter(gateway=gw.pid, store=seaweed.proc.pid, client=None)
            count = args.clients * (args.requests + 1)  # with each client's warm-up request
            before = meter.read()
            d_rate, d_p50, d_p99 = summary(
                f"direct S3 ({label})", run_clients(args.clients, args.requests, direct)
            )
            middle = meter.read()
            g_rate, g_p50, g_p99 = summary(
                f"gateway, {args.workers} worker(s) ({label})",
                run_clients(args.clients, args.requests, gateway),
            )
            after = meter.read()
            for name, spent in (
                ("direct S3", meter.spent(before, middle)),
                ("gateway", meter.spent(middle, after)),
            ):
                per = {k: v * 1e3 for k, v in spent.items()}
                print(f"  {name}: {cpu_text(per, count, 'request').replace('CPU-s', 'CPU-ms')}")
    finally:
        seaweed.close()
    rows = [
        row(
            "6 concurrency",
            "32 x 64 KiB uploads, req/s",
            d_rate,
            g_rate,
            "req/s",
            ">= 0.5",
            higher_is_better=True,
            limit=0.5,
        ),
        row(
            "6 concurrency",
            "p50 latency",
            d_p50,
            g_p50,
            "ms",
            "info",
            higher_is_better=False,
            limit=float("inf"),
        ),
        row(
            "6 concurrency",
            "p99 latency",
            d_p99,
            g_p99,
            "ms",
            "info",
            higher_is_better=False,
            limit=float("inf"),
        ),
    ]
    for r in rows[1:]:
        r["met"] = None  # latencies: reported for comparison, the target is the rate
    emit(rows)


if __name__ == "__main__":
    main()
