"""Benchmark 7: many concurrent large uploads and downloads; memory per concurrent transfer.

Starts SeaweedFS and `offload-gateway` as a subprocess (one worker, default pools and
limits). For each concurrency level N, N clients at once move SIZE bytes each:

* baseline: direct S3 SDK transfers (`Minio.put_object` / `get_object`, one shared client
  with an N-connection pool, N threads), measured in the same run;
* candidate: the gateway, N asyncio httpx clients streaming `POST /topic/<t>+oversized`
  (hop-client BSON around the payload), then N downloads of `GET /msg/<id>/payload`.

Reports aggregate MiB/s for both (ratio = gateway / direct) and the gateway's memory per
concurrent transfer: (peak RSS during the level - RSS before it) / N, from VmHWM, which is
reset before each level (/proc/<pid>/clear_refs; falls back to sampling VmRSS every 50 ms
where that is not allowed).

First, issue 31's memory-per-transfer figure: 16 streaming 64 MiB uploads and 4 downloads
of 64 MiB at once, (peak - idle RSS) / 20, every upload 201 and every download byte for
byte what was uploaded (target <= 12 MiB). With it, the chart's `gateway.maxTransfers`
(helm/mqtt-offload/values.yaml, target >= 72), met when that many transfers at this run's
figure, on top of the idle RSS, fit the chart's memory limit.

    python bench/load.py                          # N = 8 and 32, 32 MiB each
    python bench/load.py --mixed-only             # issue 31's figure alone
    python bench/load.py --concurrency 64 --size-mib 16
    BENCH_GATEWAY_ENV=OFFLOAD_S3_PARALLEL_UPLOADS=1 python bench/load.py
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import yaml
from _harness import (
    MiB,
    SeaweedFS,
    absolute_row,
    emit,
    gateway_process,
    make_bucket,
    reset_hwm,
    row,
    vm_hwm_kib,
)
from minio import Minio
from urllib3 import PoolManager

from client.protocol import MessageId, encode_upload

# Issue 31: 16 streaming 64 MiB uploads + 4 downloads at once, (peak - idle RSS) / 20.
MIXED_UP, MIXED_DOWN, MIXED_MIB, MIXED_TARGET = 16, 4, 64, 12.0
MIXED_LABEL = f"RSS per transfer, {MIXED_UP} x {MIXED_MIB} MiB up + {MIXED_DOWN} down at once"
# Issue 31: the chart admits at least 72 transfers inside its memory limit (24 before).
CHART_VALUES = Path(__file__).resolve().parents[1] / "helm" / "mqtt-offload" / "values.yaml"
CHART_TARGET = 72
CHART_LABEL = "chart gateway.maxTransfers, idle + that many x the figure above in its limit"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise KeyError("VmRSS")


class PeakRss:
    """Peak RSS of `pid` while the block runs: VmHWM after a reset, or sampled."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = rss_kib(pid)
        self.peak = self.before
        self._sampled = not reset_hwm(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_kib(self.pid))

    def __enter__(self) -> PeakRss:
        if self._sampled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._sampled:
            self._stop.set()
            self._thread.join()
        else:
            self.peak = max(self.peak, vm_hwm_kib(self.pid))


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def direct(s3: Minio, bucket: str, n: int, payload: bytes) -> tuple[float, float]:
    """Seconds for n concurrent puts, then n concurrent gets of what was put."""
    keys = [f"direct/{uuid.uuid4().hex}" for _ in range(n)]

    def put(key: str) -> None:
        s3.put_object(bucket, key, io.BytesIO(payload), len(payload))

    def get(key: str) -> None:
        response = s3.get_object(bucket, key)
        try:
            got = sum(len(piece) for piece in response.stream(4 * MiB))
        finally:
            response.close()
            response.release_conn()
        assert got == len(payload)

    with ThreadPoolExecutor(n) as pool:
        up = timed(lambda: list(pool.map(put, keys)))
        down = timed(lambda: list(pool.map(get, keys)))
    return up, down


def _limits(n: int) -> httpx.Limits:
    return httpx.Limits(max_connections=n, max_keepalive_connections=n)


async def _upload(http: httpx.AsyncClient, url: str, payload: bytes) -> str:
    """One hop BSON upload to `url`, streamed in 1 MiB pieces; its message id (201 asserted)."""
    head, tail = encode_upload(len(payload), headers=[("_id", MessageId.new().bytes)])

    async def body() -> AsyncIterator[bytes]:
        yield head
        view = memoryview(payload)
        for start in range(0, len(payload), MiB):
            yield bytes(view[start : start + MiB])
        yield tail

    r = await http.post(
        url,
        content=body(),
        headers={
            "Content-Type": "application/bson",
            "Content-Length": str(len(head) + len(payload) + len(tail)),
        },
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def gateway_uploads(url: str, n: int, payload: bytes) -> tuple[float, list[str]]:
    """Seconds for n concurrent streamed uploads; the message ids."""
    async with httpx.AsyncClient(timeout=300, limits=_limits(n)) as http:
        t0 = time.perf_counter()
        ids = await asyncio.gather(
            *(_upload(http, f"{url}/topic/bench/load+oversized", payload) for _ in range(n))
        )
        return time.perf_counter() - t0, list(ids)


async def gateway_downloads(url: str, ids: list[str], size: int) -> float:
    """Seconds for concurrent downloads of every id."""
    async with httpx.AsyncClient(timeout=300, limits=_limits(len(ids))) as http:

        async def download(message_id: str) -> None:
            got = 0
            async with http.stream("GET", f"{url}/msg/{message_id}/payload") as r:
                assert r.status_code == 200, await r.aread()
                async for piece in r.aiter_raw():
                    got += len(piece)
            assert got == size

        t0 = time.perf_counter()
        await asyncio.gather(*(download(i) for i in ids))
        return time.perf_counter() - t0


async def mixed(url: str, payload: bytes, ids: list[str], uploads: int) -> None:
    """`uploads` streaming uploads and a download of each of `ids`, all at once; every
    upload 201, every download byte for byte the payload."""
    expected = hashlib.sha256(payload).digest()
    async with httpx.AsyncClient(timeout=600, limits=_limits(uploads + len(ids))) as http:

        async def download(message_id: str) -> None:
            digest = hashlib.sha256()
            async with http.stream("GET", f"{url}/msg/{message_id}/payload") as r:
                assert r.status_code == 200, await r.aread()
                async for piece in r.aiter_raw():
                    digest.update(piece)
            assert digest.digest() == expected, "a download differs from what was uploaded"

        target = f"{url}/topic/bench/mixed+oversized"
        await asyncio.gather(
            *(_upload(http, target, payload) for _ in range(uploads)),
            *(download(i) for i in ids),
        )


def memory_per_transfer(
    url: str, pid: int, size_mib: int, uploads: int, downloads: int
) -> tuple[float, float]:
    """Issue 31's figure: (peak - idle RSS) / transfers, with `uploads` streaming uploads and
    `downloads` downloads of `size_mib` MiB at once; returns it and the idle RSS, MiB."""
    payload = os.urandom(size_mib * MiB)
    _, ids = asyncio.run(gateway_uploads(url, downloads, payload))
    time.sleep(3)  # idle: the gateway gives back freed memory (heartbeat)
    with PeakRss(pid) as mem:
        t0 = time.perf_counter()
        asyncio.run(mixed(url, payload, ids, uploads))
        wall = time.perf_counter() - t0
    per = (mem.peak - mem.before) / 1024 / (uploads + downloads)
    print(
        f"{uploads} x {size_mib} MiB uploads + {downloads} downloads at once: idle "
        f"{mem.before / 1024:.0f} MiB, peak {mem.peak / 1024:.0f} MiB, {per:.1f} MiB per "
        f"transfer ({wall:.1f} s)"
    )
    return per, mem.before / 1024


def chart_row(idle_mib: float, per_mib: float) -> dict[str, object]:
    """The chart's `gateway.maxTransfers`, and whether that many transfers at `per_mib`, on
    top of `idle_mib`, fit the chart's memory limit."""
    values = yaml.safe_load(CHART_VALUES.read_text())
    transfers = int(values["gateway"]["maxTransfers"])
    limit = str(values["resources"]["limits"]["memory"])
    limit_mib = int(limit[:-2]) * {"Mi": 1, "Gi": 1024}[limit[-2:]]
    need = idle_mib + transfers * per_mib
    print(
        f"chart: gateway.maxTransfers {transfers}, memory limit {limit}: idle {idle_mib:.0f} "
        f"+ {transfers} x {per_mib:.1f} MiB = {need:.0f} MiB of {limit_mib}"
    )
    met = transfers >= CHART_TARGET and need <= limit_mib
    return absolute_row("7 load", CHART_LABEL, transfers, "transfers", f">= {CHART_TARGET}", met)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--size-mib", type=int, default=32)
    parser.add_argument(
        "--mixed-only", action="store_true", help="only the memory-per-transfer figure"
    )
    args = parser.parse_args()
    size = args.size_mib * MiB
    payload = os.urandom(size)
    seaweed = SeaweedFS().start()
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    rows: list[dict[str, object]] = []
    try:
        make_bucket(seaweed, bucket)
        top = max(args.concurrency)
        s3 = Minio(
            seaweed.endpoint,
            seaweed.access_key,
            seaweed.secret_key,
            secure=False,
            http_client=PoolManager(maxsize=top),
        )
        with gateway_process(seaweed, bucket) as gw:
            idle = rss_kib(gw.pid)
            print(f"gateway RSS idle: {idle / 1024:.0f} MiB")
            per, idle_mib = memory_per_transfer(gw.url, gw.pid, MIXED_MIB, MIXED_UP, MIXED_DOWN)
            rows.append(
                absolute_row("7 load", MIXED_LABEL, per, "MiB", f"<= {MIXED_TARGET}",
                             per <= MIXED_TARGET)
            )  # fmt: skip
            rows.append(chart_row(idle_mib, per))
            for n in [] if args.mixed_only else args.concurrency:
                total = n * size / MiB
                d_up, d_down = direct(s3, bucket, n, payload)
                time.sleep(2)  # idle: the gateway gives back freed memory (heartbeat)
                with PeakRss(gw.pid) as up_mem:
                    g_up, ids = asyncio.run(gateway_uploads(gw.url, n, payload))
                # Downloads measured apart, so each peak belongs to one direction.
                time.sleep(2)
                with PeakRss(gw.pid) as down_mem:
                    g_down = asyncio.run(gateway_downloads(gw.url, ids, size))
                per_up = (up_mem.peak - up_mem.before) / 1024 / n
                per_down = (down_mem.peak - down_mem.before) / 1024 / n
                label = f"{n} x {args.size_mib} MiB"
                print(
                    f"{label}: uploads direct {total / d_up:.0f} MiB/s, gateway "
                    f"{total / g_up:.0f} MiB/s; downloads direct {total / d_down:.0f} MiB/s, "
                    f"gateway {total / g_down:.0f} MiB/s; gateway RSS peak "
                    f"{up_mem.peak / 1024:.0f} MiB uploading ({per_up:.1f} MiB per upload), "
                    f"{down_mem.peak / 1024:.0f} MiB downloading ({per_down:.1f} MiB per download)"
                )
                rows += [
                    row("7 load", f"{label} uploads, aggregate", total / d_up, total / g_up,
                        "MiB/s", "info", higher_is_better=True, limit=0),
                    row("7 load", f"{label} downloads, aggregate", total / d_down,
                        total / g_down, "MiB/s", "info", higher_is_better=True, limit=0),
                    absolute_row("7 load", f"{label} RSS per concurrent upload", per_up,
                                 "MiB", "info", True),
                    absolute_row("7 load", f"{label} RSS per concurrent download", per_down,
                                 "MiB", "info", True),
                ]  # fmt: skip
    finally:
        seaweed.close()
    for r in rows:
        if r["metric"] not in (MIXED_LABEL, CHART_LABEL):
            r["met"] = None  # no target in the issue: reported for comparison
    emit(rows)


if __name__ == "__main__":
    main()
