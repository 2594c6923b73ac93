"""Benchmark 1: 32 MiB through the gateway versus the MinIO SDK straight to the same SeaweedFS.

Starts SeaweedFS (tests/_servers.py) and `offload-gateway` as a subprocess on it. Runs
alternate (direct, gateway, direct, gateway, ...) so background load hits both alike:

* upload: `POST /topic/<t>+oversized` with the hop BSON document built by
  `client.protocol.encode_upload` (one pooled httpx.Client) versus `Minio.put_object`;
* download: the raw `GET /msg/<id>/payload` read whole versus
  `Minio.get_object(...).read()`, with httpx (`response.content`), with urllib3 (what the
  SDK uses: the gateway's own cost, without httpx's reads on the client) and (info) with
  `client.HttpTransport.fetch`, the library's own verified read (SHA-256 included).

The floor of any proxy (info rows, when nginx is installed): the same SDK calls through
nginx as a plain streaming reverse proxy in front of the same SeaweedFS (`_harness.
nginx_proxy`). On two cores that the store and the SDK already keep busy, a proxy's copies
and its process come out of the transfer's time, however cheap it is.

Ratios are gateway throughput over direct throughput (medians); target >= 0.85 both ways
(issue 15). With nginx, also the gateway over nginx (issue 31: >= 0.95 both ways) and the
gateway's CPU per GiB over nginx's. CPU seconds per GiB of the gateway, SeaweedFS and this
client are printed per operation: on a shared 2-core machine they move less than wall time.

    python bench/gateway_vs_s3.py              # 8 runs of 32 MiB each way
    python bench/gateway_vs_s3.py --runs 4 --workers 2
    python bench/gateway_vs_s3.py --downloads --runs 12   # the download rows alone
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import httpx
from _harness import (
    CpuMeter,
    MiB,
    SeaweedFS,
    cpu_text,
    emit,
    gateway_process,
    make_bucket,
    minio_client,
    nginx_proxy,
    row,
)
from urllib3 import PoolManager

from client.http._transport import HttpTransport
from client.protocol import MessageId, encode_upload

TARGET = 0.85
NGINX_TARGET = 0.95  # issue 31: the gateway / nginx in front of the same store
T = TypeVar("T")


def gateway_upload(http: httpx.Client, url: str, payload: bytes) -> tuple[float, str]:
    message_id = MessageId.new()
    head, tail = encode_upload(len(payload), headers=[("_id", message_id.bytes)])
    # One contiguous body: the client side costs what an SDK caller's bytes cost, no more.
    body = b"".join((head, payload, tail))
    t0 = time.perf_counter()
    r = http.post(
        f"{url}/topic/bench/s3+oversized",
        content=body,
        headers={"Content-Type": "application/bson"},
    )
    elapsed = time.perf_counter() - t0
    assert r.status_code == 201, r.text
    return elapsed, str(message_id)


def gateway_download(http: httpx.Client, url: str, message_id: str, size: int) -> float:
    t0 = time.perf_counter()
    r = http.get(f"{url}/msg/{message_id}/payload")
    elapsed = time.perf_counter() - t0
    assert r.status_code == 200 and len(r.content) == size, r.status_code
    return elapsed


def gateway_download_urllib3(pool: PoolManager, url: str, message_id: str, size: int) -> float:
    """The same download with the SDK's HTTP library: the gateway's cost alone."""
    t0 = time.perf_counter()
    r = pool.request("GET", f"{url}/msg/{message_id}/payload")
    elapsed = time.perf_counter() - t0
    assert r.status == 200 and len(r.data) == size, r.status
    return elapsed


def transport_download(transport: HttpTransport, url: str, message_id: str, size: int) -> float:
    """The client library's read: verified SHA-256, size-capped (the hash is in the time)."""
    t0 = time.perf_counter()
    payload = transport.fetch(
        f"{url}/msg/{message_id}/payload", expected_sha256=None, expected_size=size,
        spool_threshold=size,
    )  # fmt: skip
    elapsed = time.perf_counter() - t0
    assert payload.size == size
    payload.discard()
    return elapsed


def direct_upload(client: object, bucket: str, payload: bytes) -> tuple[float, str]:
    key = f"direct/{uuid.uuid4().hex}"
    t0 = time.perf_counter()
    client.put_object(bucket, key, io.BytesIO(payload), len(payload))  # type: ignore[attr-defined]
    return time.perf_counter() - t0, key


def direct_download(
    client: object, bucket: str, key: str, size: int, *, sha256: str | None = None
) -> float:
    """The SDK's get, timed; with `sha256`, the clock stops once what it read is checked."""
    t0 = time.perf_counter()
    response = client.get_object(bucket, key)  # type: ignore[attr-defined]
    try:
        data = response.read()
    finally:
        response.close()
        response.release_conn()
    ok = sha256 is None or hashlib.sha256(data).hexdigest() == sha256
    elapsed = time.perf_counter() - t0
    assert len(data) == size and ok
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--size", type=int, default=32 * MiB)
    parser.add_argument("--workers", type=int, default=1, help="gateway uvicorn workers")
    parser.add_argument("--env", action="append", default=[], help="OFFLOAD_X=V for the gateway")
    parser.add_argument(
        "--downloads", action="store_true",
        help="downloads only (one upload each way first): direct, httpx, urllib3, nginx reads",
    )  # fmt: skip
    args = parser.parse_args()
    extra_env = dict(item.split("=", 1) for item in args.env)
    payload = os.urandom(args.size)
    mib = args.size / MiB
    seaweed = SeaweedFS().start()
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        make_bucket(seaweed, bucket)
        s3 = minio_client(seaweed)
        with (
            gateway_process(seaweed, bucket, workers=args.workers, extra_env=extra_env) as gw,
            httpx.Client(timeout=120) as http,
            nginx_proxy(seaweed.s3_port) as nginx,
        ):
            proxied = None
            if nginx is not None:
                from minio import Minio

                proxied = Minio(f"127.0.0.1:{nginx.port}", seaweed.access_key,
                                seaweed.secret_key, secure=False)  # fmt: skip
                direct_download(proxied, bucket, direct_upload(proxied, bucket, payload)[1],
                                args.size)  # fmt: skip
            # Warm-up: connections, SeaweedFS volume growth for the bucket, imports.
            direct_download(s3, bucket, direct_upload(s3, bucket, payload)[1], args.size)
            gid = gateway_upload(http, gw.url, payload)[1]
            gateway_download(http, gw.url, gid, args.size)
            proxies = {} if nginx is None else {"nginx": nginx.pid}
            meter = CpuMeter(gateway=gw.pid, store=seaweed.proc.pid, client=None, **proxies)
            times: dict[str, list[float]] = {}
            cpu: dict[str, dict[str, float]] = {}

            def timed(kind: str, fn: Callable[..., T], *call: object) -> T:
                before = meter.read()
                result = fn(*call)
                spent = meter.spent(before, meter.read())
                elapsed = result[0] if isinstance(result, tuple) else result
                times.setdefault(kind, []).append(float(elapsed))  # type: ignore[arg-type]
                total = cpu.setdefault(kind, dict.fromkeys(spent, 0.0))
                for name, seconds in spent.items():
                    total[name] += seconds
                return result

            pool = PoolManager()
            transport = HttpTransport(timeout=120)
            if args.downloads:
                key = direct_upload(s3, bucket, payload)[1]
                gid = gateway_upload(http, gw.url, payload)[1]
            for _ in range(args.runs):
                if args.downloads:
                    timed("direct download", direct_download, s3, bucket, key, args.size)
                    timed("gateway download", gateway_download, http, gw.url, gid, args.size)
                    timed("urllib3 download", gateway_download_urllib3, pool, gw.url, gid,
                          args.size)  # fmt: skip
                    if proxied is not None:
                        timed("nginx download", direct_download, proxied, bucket, key, args.size)
                    continue
                _, key = timed("direct upload", direct_upload, s3, bucket, payload)
                _, gid = timed("gateway upload", gateway_upload, http, gw.url, payload)
                timed("direct download", direct_download, s3, bucket, key, args.size)
                timed("gateway download", gateway_download, http, gw.url, gid, args.size)
                timed("urllib3 download", gateway_download_urllib3, pool, gw.url, gid, args.size)
                timed("fetch download", transport_download, transport, gw.url, gid, args.size)
                if proxied is not None:
                    _, nkey = timed("nginx upload", direct_upload, proxied, bucket, payload)
                    timed("nginx download", direct_download, proxied, bucket, nkey, args.size)
            transport.close()
    finally:
        seaweed.close()
    gib = args.runs * args.size / (1 << 30)
    for kind, spent in cpu.items():
        print(f"  {kind}: {cpu_text(spent, gib, 'GiB')}")
    rows = []
    cases = (
        ("upload, hop BSON", "direct upload", "gateway upload", True),
        ("download, httpx", "direct download", "gateway download", True),
        ("download, urllib3", "direct download", "urllib3 download", True),
        ("download, HttpTransport.fetch", "direct download", "fetch download", False),
        ("upload, floor: the SDK through nginx", "direct upload", "nginx upload", False),
        ("download, floor: the SDK through nginx", "direct download", "nginx download", False),
    )
    for name, base, cand, targeted in cases:
        if cand not in times:
            continue
        d = mib / statistics.median(times[base])
        g = mib / statistics.median(times[cand])
        via = "through nginx" if cand.startswith("nginx") else "gateway"
        print(
            f"{name} {mib:.0f} MiB x {args.runs}: direct S3 {d:.0f} MiB/s, "
            f"{via} {g:.0f} MiB/s, ratio {g / d:.2f}"
            + (f" (target >= {TARGET})" if targeted else " (info)")
        )
        result = row("1 gateway vs S3", f"{mib:.0f} MiB {name}", d, g, "MiB/s",
                     f">= {TARGET}" if targeted else "info", higher_is_better=True,
                     limit=TARGET)  # fmt: skip
        if not targeted:
            result["met"] = None
        rows.append(result)
    # Issue 31: the gateway against nginx itself (the floor of any proxy), both measured here.
    for name, floor, cand, kind in (
        ("upload, hop BSON, gateway / nginx", "nginx upload", "gateway upload", "upload"),
        ("download, urllib3, gateway / nginx", "nginx download", "urllib3 download", "download"),
    ):
        if floor not in times or cand not in times:
            continue
        n = mib / statistics.median(times[floor])
        g = mib / statistics.median(times[cand])
        rows.append(row("1 gateway vs nginx", f"{mib:.0f} MiB {name}", n, g, "MiB/s",
                        f">= {NGINX_TARGET}", higher_is_better=True,
                        limit=NGINX_TARGET))  # fmt: skip
        proxy_cpu = cpu[floor].get("nginx", 0.0) / gib
        gateway_cpu = cpu[cand]["gateway"] / gib
        cpu_row = row("1 gateway vs nginx", f"{kind} CPU-s per GiB, gateway / nginx",
                      proxy_cpu, gateway_cpu, "CPU-s/GiB", "info", higher_is_better=False,
                      limit=1.0)  # fmt: skip
        cpu_row["met"] = None
        rows.append(cpu_row)
    emit(rows)


if __name__ == "__main__":
    main()
