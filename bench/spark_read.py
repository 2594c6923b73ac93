"""Benchmark: the `offload` Spark source on local[2] versus a sequential MinIO SDK get loop.

Starts its own SeaweedFS (tests/_servers.py), writes N payloads (default 64 x 16 MiB = 1 GiB)
exactly as the gateway lays them out, then times, over the same objects:

(a) a sequential `Minio.get_object(...).read()` loop over the payload keys (every byte read);
(b) Spark `local[2]` reading them through the data source with
    `select(sum(length(payload)))`, which makes every payload a value in the JVM (the
    source has no column pruning, so `count()` would move the same bytes but not read
    them there), once with SHA-256 verification (the default) and once without;
(c) the same scan with `payload=false`: what a query costs before any payload moves.

Start-up is excluded from both: before timing, Spark reads the payloads of one of the four
topics (JVM, JIT and Python workers warm) and the loop reads the same objects. The rounds
then alternate loop / Spark so a noisy neighbour hits both; the last line gives medians.
For each phase the CPU seconds of every process involved (this one, the Spark JVM, its
Python workers, SeaweedFS) are printed from /proc: on a shared 2-core machine they, not the
wall time, show where the bytes cost.

The JVM runs with `-XX:G1HeapRegionSize=32m` (see client.spark's docstring).

    python bench/spark_read.py                       # 1 GiB, 3 rounds
    python bench/spark_read.py --objects 16          # 256 MiB
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from minio import Minio

from client.protocol import Manifest, MessageId, Topic, data_key, index_key, meta_key

from _servers import SeaweedFS  # type: ignore[import-not-found]

MIB = 1024 * 1024


def cpu_seconds() -> dict[str, float]:
    """User+system CPU seconds of this process and its descendants, summed by name (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[tuple[int, str, float]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # exited meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        used = (int(fields[11]) + int(fields[12])) / tick
        children.setdefault(int(fields[1]), []).append((int(entry), name, used))
    times = os.times()
    totals = {"bench": times.user + times.system}
    stack = [os.getpid()]
    while stack:
        for pid, name, used in children.get(stack.pop(), []):
            totals[name] = totals.get(name, 0.0) + used
            stack.append(pid)
    return totals


def write_objects(client: Minio, bucket: str, count: int, size: int) -> list[str]:
    """Payload, sidecar and index of `count` messages of `size` random bytes each."""
    keys = []
    block = os.urandom(size)
    start = int(time.time() * 1000) - count
    for i in range(count):
        # Distinct bytes per object (no dedup anywhere) without paying os.urandom per object.
        payload = i.to_bytes(8, "big") + block[8:]
        topic = Topic(f"bench/{i % 4}")
        when = start + i
        key = data_key(topic, when, uuid.uuid4().hex)
        manifest = Manifest(
            MessageId.new(), topic, when, size, hashlib.sha256(payload).hexdigest(), key
        )
        client.put_object(bucket, key, io.BytesIO(payload), size, part_size=64 * MIB)
        body = manifest.to_json()
        client.put_object(bucket, meta_key(key), io.BytesIO(body), len(body))
        client.put_object(bucket, index_key(manifest.id), io.BytesIO(body), len(body))
        keys.append(key)
    return keys


def sequential_loop(client: Minio, bucket: str, keys: list[str]) -> tuple[float, int]:
    started = time.perf_counter()
    total = 0
    for key in keys:
        response = client.get_object(bucket, key)
        try:
            total += len(response.read())
        finally:
            response.close()
            response.release_conn()
    return time.perf_counter() - started, total


def spark_read(spark: object, url: str, verify: bool, topic: str = "#") -> tuple[float, int]:
    from pyspark.sql import functions as F

    started = time.perf_counter()
    df = (
        spark.read.format("offload")  # type: ignore[attr-defined]
        .option("storage", url)
        .option("topic", topic)
        .option("verify", str(verify).lower())
        .load()
    )
    total = df.select(F.sum(F.length("payload"))).collect()[0][0]
    return time.perf_counter() - started, int(total)


def spark_metadata(spark: object, url: str) -> tuple[float, int]:
    """The same scan without payloads: Spark's and the source's cost per query, not per byte."""
    started = time.perf_counter()
    reader = spark.read.format("offload")  # type: ignore[attr-defined]
    rows = reader.option("storage", url).option("payload", "false").load().count()
    return time.perf_counter() - started, rows


def timed(what: Callable[[], tuple[float, int]]) -> tuple[float, int, str]:
    """Run one phase; its seconds, bytes, and the CPU seconds it cost per process name."""
    before = cpu_seconds()
    seconds, total = what()
    after = cpu_seconds()
    spent = {k: v - before.get(k, 0.0) for k, v in after.items()}
    cpu = " ".join(f"{k} {v:.2f}" for k, v in sorted(spent.items()) if v >= 0.05)
    return seconds, total, f"cpu s: {cpu}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=64)
    parser.add_argument("--size-mib", type=float, default=16.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    size = int(args.size_mib * MIB)
    expected: int = args.objects * size
    total_mib = expected / MIB

    from pyspark.sql import SparkSession

    from client.spark import register

    seaweed = SeaweedFS().start()
    spark = None
    try:
        os.environ["OFFLOAD_S3_ACCESS_KEY"] = seaweed.access_key
        os.environ["OFFLOAD_S3_SECRET_KEY"] = seaweed.secret_key
        client = Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        client.make_bucket(bucket)
        url = seaweed.storage_url(bucket)
        t0 = time.perf_counter()
        keys = write_objects(client, bucket, args.objects, size)
        print(
            f"wrote {args.objects} x {args.size_mib:g} MiB = {total_mib:.0f} MiB "
            f"in {time.perf_counter() - t0:.1f}s"
        )

        spark = (
            SparkSession.builder.master("local[2]")
            .appName("offload-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "2g")
            # Payloads of several MiB are "humongous" objects for G1's default 1-4 MiB
            # regions; 32 MiB regions roughly halve Spark's cost per byte here.
            .config("spark.driver.extraJavaOptions", "-XX:G1HeapRegionSize=32m")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        # Warm-up, not timed: one topic's payloads through Spark (JVM, JIT, Python workers)
        # and through the loop.
        warm_keys = [k for k in keys if "/bench/0/" in k]
        spark_read(spark, url, verify=True, topic="bench/0")
        sequential_loop(client, bucket, warm_keys)

        def rate(seconds: float) -> float:
            return total_mib / seconds

        ratios: dict[str, list[float]] = {"verify": [], "no verify": []}
        for round_ in range(1, args.rounds + 1):
            loop_s, loop_bytes, loop_cpu = timed(lambda: sequential_loop(client, bucket, keys))
            print(
                f"round {round_} sequential MinIO get loop : {loop_s:6.2f}s "
                f"{rate(loop_s):7.1f} MiB/s          {loop_cpu}"
            )
            assert loop_bytes == expected, (loop_bytes, expected)
            for label, verify in (("verify", True), ("no verify", False)):
                spark_s, spark_bytes, spark_cpu = timed(partial(spark_read, spark, url, verify))
                assert spark_bytes == expected, (label, spark_bytes, expected)
                ratios[label].append(loop_s / spark_s)
                print(
                    f"round {round_} spark local[2], {label:9s} : {spark_s:6.2f}s "
                    f"{rate(spark_s):7.1f} MiB/s {loop_s / spark_s:.2f}x  {spark_cpu}"
                )
            meta_s, rows, meta_cpu = timed(lambda: spark_metadata(spark, url))
            assert rows == args.objects, (rows, args.objects)
            print(f"round {round_} spark metadata only      : {meta_s:6.2f}s {'':24s}{meta_cpu}")
        print(
            "median ratio to the loop: "
            + ", ".join(f"{k} {statistics.median(v):.2f}x" for k, v in ratios.items())
        )
    finally:
        if spark is not None:
            spark.stop()
        seaweed.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
