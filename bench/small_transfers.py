"""Small transfers at once: the gateway's fixed cost per transfer, against the store's own.

Payloads just over a broker's limit (128-256 KiB on cloud brokers) are the most common
thing the gateway carries, and for them a transfer's fixed cost (HTTP, auth, the commit's
store writes, thread hand-overs) outweighs the bytes. Starts SeaweedFS and
`offload-gateway` (as bench/gateway_vs_s3.py does); `--clients` threads then keep
`--size` transfers going for `--seconds` each, in turn:

* direct: `Minio.put_object` and `get_object` straight to the store (the floor: no gateway);
* gateway: raw `PUT /msg/<id>?topic=...` (payload, sidecar and id index: three store
  writes) and `GET /msg/<id>/payload`, with urllib3.

Prints transfers per second and the CPU milliseconds per transfer that the gateway and the
store spent (from /proc), and ratios of the gateway's rate over the direct one.

    python bench/small_transfers.py                      # 256 KiB, 8 clients, 10 s each
    python bench/small_transfers.py --size 1048576 --clients 16
"""

from __future__ import annotations

import argparse
import io
import os
import threading
import time
import uuid
from collections.abc import Callable

from _harness import CpuMeter, SeaweedFS, emit, gateway_process, make_bucket, minio_client, row
from urllib3 import PoolManager


def run_for(seconds: float, clients: int, step: Callable[[], None]) -> tuple[int, float]:
    """`clients` threads calling `step` until `seconds` are up: (calls, wall seconds)."""
    done = [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def loop() -> None:
        while time.monotonic() < stop:
            step()
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return done[0], time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=256 * 1024)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    payload = os.urandom(args.size)
    seaweed = SeaweedFS().start()
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        make_bucket(seaweed, bucket)
        s3 = minio_client(seaweed)
        with gateway_process(seaweed, bucket) as gw:
            http = PoolManager(maxsize=args.clients, timeout=60)
            key = f"small/{uuid.uuid4().hex}"
            s3.put_object(bucket, key, io.BytesIO(payload), len(payload))
            message_id = str(uuid.uuid4())
            r = http.request("PUT", f"{gw.url}/msg/{message_id}?topic=bench/small", body=payload)
            assert r.status == 201, r.data[:300]

            def direct_put() -> None:
                name = f"small/{uuid.uuid4().hex}"
                s3.put_object(bucket, name, io.BytesIO(payload), len(payload))

            def direct_get() -> None:
                answer = s3.get_object(bucket, key)
                try:
                    assert len(answer.read()) == len(payload)
                finally:
                    answer.close()
                    answer.release_conn()

            def gateway_put() -> None:
                url = f"{gw.url}/msg/{uuid.uuid4()}?topic=bench/small"
                answer = http.request("PUT", url, body=payload)
                assert answer.status == 201, answer.data[:300]

            def gateway_get() -> None:
                answer = http.request("GET", f"{gw.url}/msg/{message_id}/payload")
                assert answer.status == 200 and len(answer.data) == len(payload)

            meter = CpuMeter(gateway=gw.pid, store=seaweed.proc.pid)
            rates: dict[str, float] = {}
            for name, step in (
                ("direct upload", direct_put),
                ("gateway upload", gateway_put),
                ("direct download", direct_get),
                ("gateway download", gateway_get),
            ):
                for _ in range(args.clients):
                    step()  # warm: connections, imports
                before = meter.read()
                count, wall = run_for(args.seconds, args.clients, step)
                spent = meter.spent(before, meter.read())
                rates[name] = count / wall
                gateway_ms, store_ms = (1000 * spent[who] / count for who in ("gateway", "store"))
                print(
                    f"{name}: {count / wall:.0f}/s ({args.clients} clients, "
                    f"{args.size / 1024:g} KiB); CPU ms per transfer: gateway "
                    f"{gateway_ms:.2f}, store {store_ms:.2f}"
                )
    finally:
        seaweed.close()
    size = f"{args.size / 1024:g} KiB x {args.clients} clients"
    rows = [
        row("small transfers", f"{size}, {kind}/s, gateway / direct", rates[f"direct {kind}"],
            rates[f"gateway {kind}"], "1/s", "info", higher_is_better=True, limit=0.0)
        for kind in ("upload", "download")
    ]  # fmt: skip
    for result in rows:
        result["met"] = None  # information: the store's own rate, not a target
    emit(rows)


if __name__ == "__main__":
    main()
