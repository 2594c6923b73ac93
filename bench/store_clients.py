"""Which S3 client library for the gateway: the MinIO SDK versus obstore, measured.

Issue 15 asks to choose the store client by measurement. Both libraries talk to one
SeaweedFS (tests/_servers.py) from this process, in turns, and the benchmark reports wall
time and CPU seconds of this process (the client library's own cost, what the gateway
would pay) and of SeaweedFS:

* 32 MiB put: the SDK the way `S3Store.put_stream` does it (`put_parallel`, 8 MiB parts,
  2 at once, SHA-256 signed payload over plain http) versus `obstore.put` (8 MiB parts,
  2 at once);
* 32 MiB get: `get_object(...).read()` versus `obstore.get(...).bytes()`;
* 64 KiB conditional creates (`If-None-Match: *`, the commit's index write): the
  presigned PUT of `S3Store.create_bytes` versus `obstore.put(mode="create")`, 32 threads.

obstore is not a dependency: install it somewhere and point `--obstore-path` at it
(`pip install --target /tmp/obstore_pkg obstore`). bench/RESULTS.md has the decision.

    python bench/store_clients.py --obstore-path /tmp/obstore_pkg
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable

from _harness import CpuMeter, MiB, SeaweedFS, cpu_text, emit, make_bucket, row

from gateway.storage import S3Store
from gateway.storage._multipart import put_parallel


def measure(meter: CpuMeter, fn: Callable[[], None], runs: int) -> tuple[float, dict[str, float]]:
    """Median wall seconds of `runs` calls and the CPU seconds they spent in total."""
    fn()  # warm-up: connections, volume growth
    walls = []
    before = meter.read()
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls), meter.spent(before, meter.read())


def threaded(fn: Callable[[int], None], threads: int, each: int) -> Callable[[], None]:
    def run() -> None:
        workers = [
            threading.Thread(target=lambda t=t: [fn(t * each + i) for i in range(each)])
            for t in range(threads)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--obstore-path", default="/tmp/obstore_pkg")
    parser.add_argument("--runs", type=int, default=6)
    args = parser.parse_args()
    sys.path.insert(0, args.obstore_path)
    import obstore
    from obstore.store import S3Store as ObStore

    big = os.urandom(32 * MiB)
    small = os.urandom(64 * 1024)
    seaweed = SeaweedFS().start()
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    rows = []
    try:
        make_bucket(seaweed, bucket)
        sdk = S3Store(
            seaweed.endpoint, bucket, access_key=seaweed.access_key,
            secret_key=seaweed.secret_key, pool_size=64,
        )  # fmt: skip
        ob = ObStore(
            bucket,
            endpoint=f"http://{seaweed.endpoint}",
            access_key_id=seaweed.access_key,
            secret_access_key=seaweed.secret_key,
            region="us-east-1",
            virtual_hosted_style_request=False,
            client_options={"allow_http": True},
        )
        meter = CpuMeter(client=None, store=seaweed.proc.pid)
        sdk.put_bytes("get/big", big, "application/octet-stream")
        run = uuid.uuid4().hex

        def sdk_put() -> None:
            put_parallel(
                sdk.client, bucket, f"sdk/{uuid.uuid4().hex}", io.BytesIO(big), len(big),
                content_type="application/octet-stream", part_size=8 * MiB, parallel=2,
            )  # fmt: skip

        def ob_put() -> None:
            obstore.put(ob, f"ob/{uuid.uuid4().hex}", big, chunk_size=8 * MiB, max_concurrency=2)

        def sdk_get() -> None:
            assert len(b"".join(sdk.open_range("get/big"))) == len(big)

        def ob_get() -> None:
            assert len(obstore.get(ob, "get/big").bytes()) == len(big)

        def sdk_create(i: int) -> None:
            assert sdk.create_bytes(f"ids/sdk-{run}-{i}", small)

        def ob_create(i: int) -> None:
            obstore.put(ob, f"ids/ob-{run}-{i}", small, mode="create")

        counter = iter(range(10**9))
        cases = (
            ("32 MiB put", "MiB/s", 32, sdk_put, ob_put),
            ("32 MiB get", "MiB/s", 32, sdk_get, ob_get),
            (
                "32 x 20 64 KiB creates",
                "req/s",
                640,
                threaded(lambda i: sdk_create(next(counter)), 32, 20),
                threaded(lambda i: ob_create(next(counter)), 32, 20),
            ),
        )
        for name, unit, amount, with_sdk, with_ob in cases:
            results = {}
            for label, fn in (("minio", with_sdk), ("obstore", with_ob)):
                wall, spent = measure(meter, fn, args.runs)
                results[label] = amount / wall
                per = args.runs * amount
                print(
                    f"{name}, {label}: {amount / wall:.0f} {unit}; "
                    + cpu_text(
                        {k: v * 1e3 for k, v in spent.items()},
                        per,
                        "MiB" if unit == "MiB/s" else "request",
                    ).replace("CPU-s", "CPU-ms")
                )
            result = row("store client", f"{name}, obstore / minio", results["minio"],
                         results["obstore"], unit, "info", higher_is_better=True,
                         limit=0)  # fmt: skip
            result["met"] = None
            rows.append(result)
    finally:
        seaweed.close()
    emit(rows)


if __name__ == "__main__":
    main()
