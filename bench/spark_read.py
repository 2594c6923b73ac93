"""Benchmark: the `offload` Spark source on local[2] versus a sequential MinIO SDK get loop.

Starts its own SeaweedFS (tests/_servers.py), writes N payloads (default 64 x 16 MiB = 1 GiB)
exactly as the gateway lays them out, then times, over the same objects:

(a) a sequential `Minio.get_object(...).read()` loop over the payload keys;
(b) Spark `local[2]` reading them through the data source with
    `select(sum(length(payload)))`, which forces every payload through Spark, once with
    SHA-256 verification (the default) and once without.

Spark start-up and the Python workers' first launch are excluded: one warm-up scan runs first.
The JVM runs with `-XX:G1HeapRegionSize=32m` (see client.spark's docstring).

    python bench/spark_read.py                       # 1 GiB
    python bench/spark_read.py --objects 16          # 256 MiB
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from minio import Minio

from client.protocol import Manifest, MessageId, Topic, data_key, index_key, meta_key

from _servers import SeaweedFS

MIB = 1024 * 1024


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


def spark_read(spark: object, url: str, verify: bool) -> tuple[float, int]:
    from pyspark.sql import functions as F

    started = time.perf_counter()
    df = (
        spark.read.format("offload")  # type: ignore[attr-defined]
        .option("storage", url)
        .option("verify", str(verify).lower())
        .load()
    )
    total = df.select(F.sum(F.length("payload"))).collect()[0][0]
    return time.perf_counter() - started, int(total)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=64)
    parser.add_argument("--size-mib", type=float, default=16.0)
    args = parser.parse_args()
    size = int(args.size_mib * MIB)
    total_mib = args.objects * size / MIB

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
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "2g")
            # Payloads of several MiB are "humongous" objects for G1's default 1-4 MiB
            # regions; 32 MiB regions roughly halve Spark's cost per byte here.
            .config("spark.driver.extraJavaOptions", "-XX:G1HeapRegionSize=32m")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        # Warm-up: JVM, Python workers and the source's planning path, without payloads.
        spark.read.format("offload").option("storage", url).option(
            "payload", "false"
        ).load().count()

        loop_s, loop_bytes = sequential_loop(client, bucket, keys)
        spark_s, spark_bytes = spark_read(spark, url, verify=True)
        nover_s, nover_bytes = spark_read(spark, url, verify=False)
        expected = args.objects * size
        assert loop_bytes == spark_bytes == nover_bytes == expected, (
            loop_bytes,
            spark_bytes,
            nover_bytes,
            expected,
        )

        def rate(seconds: float) -> float:
            return total_mib / seconds

        print(f"sequential MinIO get loop : {loop_s:6.2f}s  {rate(loop_s):7.1f} MiB/s")
        print(
            f"spark local[2], verify    : {spark_s:6.2f}s  {rate(spark_s):7.1f} MiB/s  "
            f"ratio {loop_s / spark_s:.2f}x"
        )
        print(
            f"spark local[2], no verify : {nover_s:6.2f}s  {rate(nover_s):7.1f} MiB/s  "
            f"ratio {loop_s / nover_s:.2f}x"
        )
    finally:
        if spark is not None:
            spark.stop()
        seaweed.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
