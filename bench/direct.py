"""Benchmark: 32 MiB by direct transfers versus the MinIO SDK straight to the same SeaweedFS.

Starts SeaweedFS and `offload-gateway` with `OFFLOAD_S3_PUBLIC_URL` (direct transfers on).
Runs alternate (SDK, direct, SDK, direct, ...) so background load hits both alike:

* upload: the client's direct path (`client.http._direct.DirectUploader`: hash the parts, grant,
  parallel part PUTs to the store, commit) versus `Minio.put_object`;
* download: `HttpTransport.fetch` of `/msg/<id>/payload` (307 from the gateway, then the
  store; size and SHA-256 checked as every subscriber does) versus
  `Minio.get_object(...).read()`, which checks nothing; and the same fetch with the SHA-256
  check off (`expected_sha256=None`, size still checked), to tell the transfer from the check.
* the floor of a verifying reader (info): the same SDK get followed by `hashlib.sha256` of
  what it read. On two cores that SeaweedFS shares while it serves, the check's CPU comes
  out of the read's time; the row says what verifying costs any reader here.

Ratios are direct-transfer throughput over SDK throughput (medians); target >= 0.95 both.
Each download also prints this process's CPU per GiB (median; the client's side only:
SeaweedFS and the gateway run in their own processes).

    python bench/direct.py              # 8 runs of 32 MiB each way
    python bench/direct.py --runs 4 --size 67108864
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time
import uuid
from collections.abc import Callable

from _harness import MiB, SeaweedFS, emit, gateway_process, make_bucket, minio_client, row
from gateway_vs_s3 import direct_download, direct_upload

from client.core._source import PayloadSource
from client.http._direct import DirectUploader
from client.http._transport import HttpTransport
from client.protocol import MessageId


def upload(uploader: DirectUploader, url: str, store: str, payload: bytes) -> tuple[float, str]:
    message_id = MessageId.new()
    t0 = time.perf_counter()
    with PayloadSource(payload) as source:
        uploader.upload(url, store, "bench/direct", source, message_id=message_id)
    return time.perf_counter() - t0, str(message_id)


def download(
    transport: HttpTransport, url: str, message_id: str, payload: bytes, *, check: bool = True
) -> float:
    digest = hashlib.sha256(payload).hexdigest() if check else None
    t0 = time.perf_counter()
    got = transport.fetch(
        f"{url}/msg/{message_id}/payload",
        expected_sha256=digest,
        expected_size=len(payload),
        spool_threshold=len(payload),
        redirect_ok=lambda origin: True,
    )
    elapsed = time.perf_counter() - t0
    assert got.size == len(payload)
    got.discard()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--size", type=int, default=32 * MiB)
    args = parser.parse_args()
    payload = os.urandom(args.size)
    mib = args.size / MiB
    seaweed = SeaweedFS().start()
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    store = f"http://{seaweed.endpoint}"
    try:
        make_bucket(seaweed, bucket)
        s3 = minio_client(seaweed)
        env = {"OFFLOAD_S3_PUBLIC_URL": store}
        with (
            gateway_process(seaweed, bucket, extra_env=env) as gw,
            HttpTransport(timeout=120) as transport,
        ):
            uploader = DirectUploader(transport.client)
            # Warm-up: connections, SeaweedFS volume growth for the bucket, imports.
            direct_download(s3, bucket, direct_upload(s3, bucket, payload)[1], args.size)
            download(transport, gw.url, upload(uploader, gw.url, store, payload)[1], payload)
            up: dict[str, list[float]] = {"sdk": [], "direct": []}
            down: dict[str, list[float]] = {"sdk": [], "direct": []}
            raw: list[float] = []
            verified: list[float] = []
            cpu: dict[str, list[float]] = {"sdk": [], "direct": [], "raw": [], "verified": []}
            sha256 = hashlib.sha256(payload).hexdigest()

            def timed(name: str, read: Callable[..., float], *args: object, **kw: bool) -> float:
                c0 = time.process_time()
                elapsed = read(*args, **kw)
                cpu[name].append(time.process_time() - c0)
                return elapsed

            for _ in range(args.runs):
                t, key = direct_upload(s3, bucket, payload)
                up["sdk"].append(t)
                t, mid = upload(uploader, gw.url, store, payload)
                up["direct"].append(t)
                down["sdk"].append(timed("sdk", direct_download, s3, bucket, key, args.size))
                down["direct"].append(timed("direct", download, transport, gw.url, mid, payload))
                raw.append(timed("raw", download, transport, gw.url, mid, payload, check=False))
                verified.append(
                    timed("verified", direct_download, s3, bucket, key, args.size, sha256=sha256)
                )
    finally:
        seaweed.close()
    gib = args.size / (1 << 30)
    print(
        "client CPU-s per GiB downloaded (median): "
        + ", ".join(
            f"{label} {statistics.median(cpu[name]) / gib:.2f}"
            for name, label in (
                ("sdk", "S3 SDK get"),
                ("direct", "HttpTransport.fetch"),
                ("raw", "HttpTransport.fetch, no SHA-256 check"),
                ("verified", "S3 SDK get + SHA-256"),
            )
        )
    )
    rows = []
    down_raw = {"sdk": down["sdk"], "direct": raw}
    for name, times in (
        ("upload", up),
        ("download", down),
        ("download, no SHA-256 check", down_raw),
    ):
        d = mib / statistics.median(times["sdk"])
        g = mib / statistics.median(times["direct"])
        print(
            f"{name} {mib:.0f} MiB x {args.runs}: S3 SDK {d:.0f} MiB/s, "
            f"direct transfers {g:.0f} MiB/s, ratio {g / d:.2f} (target >= 0.95)"
        )
        rows.append(
            row(
                "direct transfers vs S3",
                f"{mib:.0f} MiB {name}",
                d,
                g,
                "MiB/s",
                ">= 0.95",
                higher_is_better=True,
                limit=0.95,
            )
        )
    d = mib / statistics.median(down["sdk"])
    v = mib / statistics.median(verified)
    print(f"floor: S3 SDK get + SHA-256 {v:.0f} MiB/s, ratio {v / d:.2f} to the SDK get alone")
    rows.append(
        row(
            "direct transfers vs S3",
            f"{mib:.0f} MiB download, floor: S3 SDK get + SHA-256 (info)",
            d,
            v,
            "MiB/s",
            "info",
            higher_is_better=True,
            limit=0.0,
        )
    )
    rows[-1]["met"] = None
    emit(rows)


if __name__ == "__main__":
    main()
