"""Export offloaded messages to Parquet, partitioned by topic and UTC date; print an inventory.

Run as `python -m client.spark ...` or, unchanged, `spark-submit path/to/client/spark/job.py
...` (imports are absolute so the file also works as a script; the package must be
importable on the driver and executors, e.g. installed or shipped with `--py-files`).

Idempotent: the range is widened to whole UTC days and the write replaces exactly the
(topic, date) partitions it produces (dynamic partition overwrite), so re-running over the
same range yields the same rows, and other partitions under `--out` are left alone. A
partition whose messages have all expired since an earlier run is not removed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from client.core._exceptions import ConfigError
from client.protocol import TopicFilter
from client.spark._bad import BadObjects
from client.spark._options import parse_time
from client.spark._plan import whole_days
from client.spark._source import FORMAT, register

_MICROS_PER_DAY = 86_400_000_000


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m client.spark",
        description="Export offloaded MQTT messages to Parquet partitioned by topic and date.",
    )
    parser.add_argument("--storage", required=True, help="s3://HOST:PORT/BUCKET?... or file:///")
    parser.add_argument("--topic", default="#", help="MQTT topic filter (default: #)")
    parser.add_argument("--since", help="start, ISO-8601 or epoch ms (widened to its UTC day)")
    parser.add_argument("--until", help="end, exclusive (widened to the end of its UTC day)")
    parser.add_argument("--out", required=True, help="output directory (any Hadoop path)")
    parser.add_argument("--no-payload", action="store_true", help="metadata columns only")
    parser.add_argument("--master", help="Spark master when not run by spark-submit")
    parser.add_argument(
        "--follow",
        action="store_true",
        help="keep running: append newly committed messages (needs --checkpoint)",
    )
    parser.add_argument("--checkpoint", help="--follow: checkpoint directory (offsets)")
    parser.add_argument(
        "--trigger-seconds", type=float, default=10.0, help="--follow: seconds between batches"
    )
    parser.add_argument(
        "--max-files-per-trigger", type=int, help="--follow: at most N messages per batch"
    )
    parser.add_argument(
        "--group",
        help="--follow: consumer group to confirm each committed batch's messages for (the "
        "gateway's retention by group)",
    )
    parser.add_argument(
        "--on-bad-object",
        choices=("skip", "fail"),
        default="skip",
        help="a message that cannot be delivered (checksum mismatch, undecodable manifest): "
        "skip it and report it (default), or fail the job",
    )
    parser.add_argument(
        "--identity",
        action="append",
        metavar="FILE",
        help="age identity file for encrypted payloads (repeatable; a path on the executors)",
    )
    parser.add_argument(
        "--access-key", help="S3 access key (default: OFFLOAD_S3_ACCESS_KEY, preferred)"
    )
    parser.add_argument(
        "--secret-key", help="S3 secret key (default: OFFLOAD_S3_SECRET_KEY, preferred)"
    )
    return parser


def _session(master: str | None) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("offload-export")
    if master:
        builder = builder.master(master)
    return builder.getOrCreate()


def export(
    spark: Any,
    *,
    storage: str,
    out: str,
    topic: str = "#",
    since: int | None = None,
    until: int | None = None,
    payload: bool = True,
    credentials: dict[str, str] | None = None,
    on_bad_object: str = "skip",
) -> list[tuple[str, str, int, int]]:
    """Write the selected messages under `out`; return the inventory of what `out` now holds.

    Args:
        spark: the SparkSession (`register` is called on it).
        storage: the storage URL.
        out: output directory.
        topic: MQTT topic filter.
        since: inclusive start in ms (widened to its UTC day), None: unbounded.
        until: exclusive end in ms (widened to the end of its UTC day), None: unbounded.
        payload: include payload bytes (else the payload column is null).
        credentials: `accessKey` / `secretKey` options, overriding the environment.
        on_bad_object: "skip" a message that cannot be delivered (reported in the executors'
            logs and counted by what `register` returns) or "fail" the export.

    Returns:
        (topic, date, messages, bytes) for every partition in the exported range, sorted.
    """
    from pyspark.sql import functions as F

    topic_filter = TopicFilter(topic)
    since, until = whole_days(since, until)
    register(spark)
    reader = spark.read.format(FORMAT).option("storage", storage).option("topic", topic)
    reader = reader.option("payload", str(payload).lower()).option("onBadObject", on_bad_object)
    for name, value in (("since", since), ("until", until)):
        if value is not None:
            reader = reader.option(name, str(value))
    for name, secret in (credentials or {}).items():
        reader = reader.option(name, secret)
    frame = reader.load()
    # Days since the epoch of the UTC timestamp: independent of the session time zone.
    days = F.floor(F.unix_micros("timestamp") / _MICROS_PER_DAY).cast("int")
    frame = frame.withColumn("date", F.date_from_unix_date(days))
    (
        frame.write.mode("overwrite")
        .option("partitionOverwriteMode", "dynamic")
        .partitionBy("topic", "date")
        .parquet(out)
    )
    return inventory(spark, out, topic_filter, since, until)


def follow(
    spark: Any,
    *,
    storage: str,
    out: str,
    checkpoint: str,
    topic: str = "#",
    since: int | None = None,
    payload: bool = True,
    credentials: dict[str, str] | None = None,
    max_files_per_trigger: int | None = None,
    trigger_seconds: float = 10.0,
    on_bad_object: str = "skip",
    group: str | None = None,
) -> Any:
    """Start appending newly committed messages under `out`; return the StreamingQuery.

    Same columns and `topic`/`date` partitions as `export`. Progress lives in `checkpoint`:
    a query restarted with the same checkpoint continues where it stopped, and the file
    sink's own log makes each micro-batch land exactly once. Use a fresh `out` (or one this
    query owns): `export` rewrites partitions, a stream only appends.

    Args:
        spark: the SparkSession (`register` is called on it).
        storage: the storage URL.
        out: output directory.
        checkpoint: checkpoint directory of this query.
        topic: MQTT topic filter.
        since: first timestamp in ms for a new query (None: the oldest message).
        payload: include payload bytes (else the payload column is null).
        credentials: `accessKey` / `secretKey` options, overriding the environment.
        max_files_per_trigger: at most this many messages per micro-batch.
        trigger_seconds: interval between micro-batches.
        on_bad_object: "skip" a message that cannot be delivered (reported in the executors'
            logs and counted by what `register` returns) or "fail" the query.
        group: confirm, for this consumer group, the messages of each batch Spark has
            committed (client/spark/_confirm.py); None: confirm nothing.
    """
    from pyspark.sql import functions as F

    register(spark)
    reader = spark.readStream.format(FORMAT).option("storage", storage).option("topic", topic)
    reader = reader.option("payload", str(payload).lower()).option("onBadObject", on_bad_object)
    if since is not None:
        reader = reader.option("since", str(since))
    if max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", str(max_files_per_trigger))
    if group is not None:
        reader = reader.option("group", group)
    for name, secret in (credentials or {}).items():
        reader = reader.option(name, secret)
    frame = reader.load()
    days = F.floor(F.unix_micros("timestamp") / _MICROS_PER_DAY).cast("int")
    frame = frame.withColumn("date", F.date_from_unix_date(days))
    return (
        frame.writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .partitionBy("topic", "date")
        .trigger(processingTime=f"{trigger_seconds} seconds")
        .start()
    )


def inventory(
    spark: Any, out: str, topic_filter: TopicFilter, since: int | None, until: int | None
) -> list[tuple[str, str, int, int]]:
    """Messages and bytes per topic per day under `out`, for the given filter and range.

    Reads only the `size` column and the partition paths, never payloads.

    Args:
        spark: the SparkSession.
        out: the export directory.
        topic_filter: only topics matching this filter.
        since: inclusive start in ms at a UTC day boundary, or None.
        until: exclusive end in ms at a UTC day boundary, or None.
    """
    from pyspark.sql import functions as F

    # A declared schema keeps Spark from typing a topic like "2024" as a number.
    table = spark.read.schema("size long, topic string, date date").parquet(out)
    grouped = table.groupBy("topic", "date").agg(
        F.count(F.lit(1)).alias("messages"), F.sum("size").alias("bytes")
    )
    first = None if since is None else _iso_day(since)
    last = None if until is None else _iso_day(until)
    rows = []
    for row in grouped.collect():
        day = row["date"].isoformat()
        if not topic_filter.matches(row["topic"]):
            continue
        if (first is not None and day < first) or (last is not None and day >= last):
            continue
        rows.append((row["topic"], day, int(row["messages"]), int(row["bytes"] or 0)))
    return sorted(rows)


def _iso_day(timestamp_ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(timestamp_ms / 1000, UTC).date().isoformat()


def format_inventory(rows: Sequence[tuple[str, str, int, int]]) -> str:
    """The inventory as a fixed-width text table with a total line.

    Args:
        rows: (topic, date, messages, bytes) tuples.
    """
    header = ("topic", "date", "messages", "bytes")
    total = ("TOTAL", "", sum(r[2] for r in rows), sum(r[3] for r in rows))
    cells = [tuple(str(c) for c in r) for r in (header, *rows, total)]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]

    def line(c: tuple[str, ...]) -> str:
        return "  ".join(
            c[i].ljust(widths[i]) if i < 2 else c[i].rjust(widths[i]) for i in range(4)
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(c) for c in cells[1:-1]), rule, line(cells[-1])])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m client.spark`; returns the process exit status.

    Args:
        argv: arguments without the program name (None: sys.argv[1:]).
    """
    args = _parser().parse_args(argv)
    try:
        since = parse_time(args.since, "--since") if args.since else None
        until = parse_time(args.until, "--until") if args.until else None
        TopicFilter(args.topic)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problem = _flags_problem(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    credentials = _credentials(args)
    spark = _session(args.master)
    skipped = register(spark)
    skipped.reset()
    if args.follow:
        query = follow(
            spark,
            storage=args.storage,
            out=args.out,
            checkpoint=args.checkpoint,
            topic=args.topic,
            since=since,
            payload=not args.no_payload,
            credentials=credentials,
            max_files_per_trigger=args.max_files_per_trigger,
            trigger_seconds=args.trigger_seconds,
            on_bad_object=args.on_bad_object,
            group=args.group,
        )
        print(f"following {args.topic!r} into {args.out} (checkpoint {args.checkpoint})")
        query.awaitTermination()
        return 0
    rows = export(
        spark,
        storage=args.storage,
        out=args.out,
        topic=args.topic,
        since=since,
        until=until,
        payload=not args.no_payload,
        credentials=credentials,
        on_bad_object=args.on_bad_object,
    )
    print(f"exported {args.topic!r} to {args.out}")
    print(format_inventory(rows))
    if skipped.count:
        print(format_skipped(skipped), file=sys.stderr)
    return 0


def _flags_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with a combination of flags, None when nothing is."""
    if args.follow and not args.checkpoint:
        return "--follow needs --checkpoint DIR"
    if args.follow and args.until:
        return "--follow runs without an end; drop --until"
    if args.max_files_per_trigger is not None and args.max_files_per_trigger < 1:
        return "--max-files-per-trigger must be at least 1"
    if not args.trigger_seconds > 0:
        return "--trigger-seconds must be positive"
    return None


def _credentials(args: argparse.Namespace) -> dict[str, str]:
    """The data source's credential options the flags give."""
    credentials = {}
    if args.access_key:
        credentials["accessKey"] = args.access_key
    if args.secret_key:
        credentials["secretKey"] = args.secret_key
    if args.identity:  # the data source's option (client/spark/_read.py decodes)
        credentials["identity_files"] = ",".join(args.identity)
    return credentials


def format_skipped(skipped: BadObjects, limit: int = 20) -> str:
    """What an export left out, for its standard error: counts per kind, then keys.

    Args:
        skipped: what `register` returned.
        limit: at most this many keys are named.
    """
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(skipped.counts.items()))
    lines = [f"skipped {skipped.count} message(s) that could not be delivered ({counts}):"]
    lines += [f"  {key} ({kind}): {reason}" for key, kind, reason in skipped.examples[:limit]]
    if skipped.count > limit:
        lines.append("  ... the executors' WARNING lines name every one")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
