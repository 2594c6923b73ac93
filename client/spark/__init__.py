"""Read offloaded MQTT messages from object storage with Spark, without the gateway.

Install with the `spark` extra (pyspark >= 4.0 with pyarrow, minio). Then::

    from client.spark import register

    register(spark)  # once per session; reads OFFLOAD_S3_ACCESS_KEY / _SECRET_KEY now
    df = (
        spark.read.format("offload")
        .option("storage", "s3://HOST:PORT/BUCKET?secure=false")
        .option("topic", "sensors/+/image")          # MQTT filter, optional
        .option("since", "2026-11-22T00:00:00Z")     # ISO-8601 or epoch ms, optional
        .option("until", "2026-11-23")               # exclusive, optional
        .option("payload", "false")                  # metadata-only scan, optional
        .load()
    )

Columns: `id` string, `topic` string, `timestamp` timestamp, `size` long, `sha256` string,
`content_type` string, `key` binary, `headers` map<string,binary>, `payload` binary.

How it reads:

* The driver lists keys and sizes only, pruned by the layout's key prefixes: the topic
  filter's fixed levels, then the `date=` and `hour=` partitions the time range touches. It
  packs the payload objects into tasks of nearly equal bytes (a few tasks per core, at most
  ~128 MiB each) and ships only their keys.
* Each task opens its own client and reads `<key>.meta.json`, then `<key>`. A payload whose
  sidecar is missing is an upload in flight and is not planned. The exact time range is
  applied to each manifest's `timestamp`.
* One message that cannot be delivered never stops a scan (`_bad`; docs/spark.md): a
  payload that differs from its manifest, a sidecar or index entry that is not a manifest
  (bad JSON, wrong types, a header name UTF-8 cannot encode), an object deleted after it
  was planned, a payload over 2 GiB. With `onBadObject` = `skip` (the default) the task
  skips it, logs a WARNING naming its URL and the reason, and counts it in the accumulator
  `register` returns (`BadObjects`: `count`, `counts`, `examples`); `fail` fails the task.
* `verify` checks every payload against its manifest; a difference is a bad object
  (`PayloadChecksumMismatch` under `fail`): a truncated or corrupted object would
  otherwise reach analyses silently. `true` (the default) checks the size and the CRC-32C
  the gateway records in the manifest (0.1-0.2 CPU-s per GiB), or the SHA-256 when the
  manifest predates that field; `sha256` always checks size and SHA-256 (0.6-0.7 CPU-s per
  GiB); `false` checks nothing. Metadata-only scans never hash. Why CRC-32C suffices by
  default: this reader holds the store's credentials and trusts it, and whoever can rewrite
  a payload there can rewrite its manifest too, so the check guards against corruption and
  torn or mismatched objects, not an adversary - what S3's own `x-amz-checksum-crc32c` is
  for. A CRC is easy to forge on purpose; choose `sha256` where manifests and payloads are
  kept or copied by different hands.
* Payloads a client encrypted (age) or compressed (zstd) are decoded after the check, told
  by their first bytes: option `identity_files` (comma-separated paths that exist on the
  executors) for encrypted ones, else the read fails with `NoMatchingIdentity` naming the
  option; `decode=false` returns the stored bytes. `size` and `sha256` describe the stored
  bytes (docs/encryption.md).
* A single payload must fit a Spark binary value (< 2 GiB) and a task's memory.
* Tuning for payloads of several MiB: start the JVMs with `-XX:G1HeapRegionSize=32m`
  (`spark.driver.extraJavaOptions` / `spark.executor.extraJavaOptions`); with G1's default
  regions every such value is a "humongous" allocation, which halved throughput here.
* Throughput: every payload byte crosses from the Python worker into the JVM through Arrow
  (socket, off-heap buffer, then a `byte[]` and an UnsafeRow per value). Payloads travel
  in Arrow batches of ~16 MiB, a larger payload alone and without a copy; on a `file://`
  store payload files of 1 MiB or more are mapped rather than read, so Python copies each
  byte once (into the socket) and checks it in place (SHA-256) or in 1 MiB slices
  (CRC-32C, whose library takes only `bytes`). On two cores every reader is CPU-bound, so
  the check's CPU is the gap to Spark's own `binaryFile` over the same objects: SHA-256
  costs 0.6-0.7 CPU-s per GiB and left 0.69 of its speed on a quiet machine; CRC-32C costs
  0.1-0.2, near `verify=false` (`python bench/spark_read.py`, bench/RESULTS.md).
  The Python Data Source API has no column pruning: say `option("payload", "false")` when
  payloads are not needed. For raw bytes without manifests use `binaryFile` (below).

Streaming (pyspark >= 4.2; `spark.readStream.format("offload")`, same options but `until`, plus
`maxFilesPerTrigger` and `lateness`) delivers newly committed messages in micro-batches; its
offsets (see `_offsets`) live in the query's checkpoint, so a restarted query continues where
it stopped and a checkpointed file sink gets every message exactly once::

    (spark.readStream.format("offload").option("storage", URL).option("topic", "a/#")
        .option("maxFilesPerTrigger", "100").load()
        .writeStream.format("parquet").option("path", OUT)
        .option("checkpointLocation", CHECKPOINT).start())

A message is visible once its id index names it. Messages are ordered by the stamp in the
index entry: the gateway's clock when a proxied upload began, or when a direct upload was
committed. An upload that commits more than `lateness` seconds (default 600) after its
stamp, and after newer messages were delivered, is not delivered. A direct upload's key
(its hour partition) is chosen at its grant, up to `grantTtl` seconds (default 3600, the
gateway's OFFLOAD_DIRECT_GRANT_TTL) before its commit, so the driver lists that far below
the offset (a batch read: below `since`). The offset carries the tokens of about
`lateness` seconds of delivered messages.

Export job (also runnable by `spark-submit client/spark/job.py ...`)::

    python -m client.spark --storage URL --topic 'a/#' --since 2026-11-01 --until 2026-11-08 \\
        --out /data/offload-parquet [--no-payload] [--master local[2]]
    python -m client.spark --storage URL --topic 'a/#' --out DIR --follow \\
        --checkpoint DIR [--trigger-seconds 10] [--max-files-per-trigger N]

The first form writes Parquet partitioned by `topic` and `date` (UTC), replacing only the
partitions it writes (dynamic partition overwrite; the range is widened to whole UTC days
so a partition is always rewritten whole), then prints messages and bytes per topic per
day. `--follow` keeps running and appends new messages with the streaming source (same
columns and partitions; the checkpoint holds its progress).

`register` fails with a ConfigError naming PYSPARK_PYTHON when, on a local master, the
interpreter Spark's workers would run cannot import pyarrow, minio or this package (else
the first query dies with only "Python worker exited unexpectedly"). A store that refuses
the credentials fails the query with a ConfigError naming the `accessKey`/`secretKey`
options and the OFFLOAD_S3_ACCESS_KEY/OFFLOAD_S3_SECRET_KEY variables.

Raw objects with Spark's built-in sources (no Python data source needed)
-----------------------------------------------------------------------

Payloads are plain objects and sidecars plain JSON, so Spark's own `binaryFile` and `json`
sources read them too. Point them at one topic's directory: Spark then discovers `date` and
`hour` as partition columns from the `date=`/`hour=` directories and prunes on them.

On a cluster with hadoop-aws on the classpath (`--packages
org.apache.hadoop:hadoop-aws:<the Hadoop version of your Spark>`, e.g. 3.4.x for Spark 4)::

    spark = (
        SparkSession.builder
        .config("spark.hadoop.fs.s3a.endpoint", "http://HOST:PORT")
        .config("spark.hadoop.fs.s3a.path.style.access", "true")
        .config("spark.hadoop.fs.s3a.connection.ssl.enabled", "false")
        .config("spark.hadoop.fs.s3a.access.key", access_key)
        .config("spark.hadoop.fs.s3a.secret.key", secret_key)
        .getOrCreate()
    )
    topic_dir = "s3a://BUCKET/data/sensors/temp/"       # levels percent-encoded as in the layout
    payloads = (
        spark.read.format("binaryFile")
        .load(topic_dir)                                 # path, modificationTime, length,
        .where("date = '2026-11-22'")                    # content, date, hour
        .where("NOT path LIKE '%.meta.json'")
    )
    manifests = spark.read.json(topic_dir + "date=*/hour=*/*.meta.json")

Join the two on the payload's path ending with the manifest's `data_key` to get ids and
headers. This reads everything below the directory (no in-flight check: a payload may be
listed before its sidecar exists) and does not verify checksums. Not tested here: the
hadoop-aws jars cannot be downloaded in this environment.

The embedded store (`file:///PATH`) is the same layout on disk, so the same code works with
`file:///PATH/data/sensors/temp/` as the directory (tested in tests/test_spark.py).
"""

from ._bad import BadObjects, Problem
from ._options import (
    OnBadObject,
    ScanOptions,
    StorageLocation,
    Verify,
    parse_options,
    parse_storage_url,
    parse_time,
)
from ._source import FORMAT, OffloadDataSource, register

__all__ = [
    "FORMAT",
    "BadObjects",
    "OffloadDataSource",
    "OnBadObject",
    "Problem",
    "ScanOptions",
    "StorageLocation",
    "Verify",
    "parse_options",
    "parse_storage_url",
    "parse_time",
    "register",
]
