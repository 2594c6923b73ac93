"""The `offload` PySpark data source (Spark 4 Python Data Source API): a thin adapter.

Planning (`partitions`) runs once on the driver and lists keys and sizes; `read` runs in
each task on an executor and fetches that task's sidecars and payloads itself.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

from ..core._exceptions import ConfigError
from ._bad import BadObjects, Reporter, Tally, TallyParam
from ._options import ScanOptions, parse_options
from ._plan import pack, select_objects
from ._read import DDL, read_batches
from ._store import ACCESS_KEY_ENV, SECRET_KEY_ENV, open_read_store
from ._worker import check_worker_python

FORMAT = "offload"
_ACCUMULATORS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


class OffloadPartition(InputPartition):
    """One task's share: payload keys only, so the pickled plan stays small."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(None)
        self.keys = keys

    def __repr__(self) -> str:
        return f"OffloadPartition({len(self.keys)} keys)"


class OffloadReader(DataSourceReader):
    """Lists on the driver, reads on executors."""

    def __init__(self, options: ScanOptions, accumulator: Any | None = None) -> None:
        self.scan = options
        self.accumulator = accumulator  # of `_bad.Tally`, from `register`

    def partitions(self) -> list[OffloadPartition]:
        store = open_read_store(self.scan.location)
        since = self.scan.listing_since(self.scan.since)
        objects = select_objects(store, self.scan.topic_filter, since, self.scan.until)
        parallelism = self.scan.parallelism or os.cpu_count() or 1
        # Spark substitutes a bare InputPartition(None) for an empty plan: say "nothing".
        return [OffloadPartition(keys) for keys in pack(objects, parallelism)] or [
            OffloadPartition([])
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, OffloadPartition):
            raise TypeError(f"not a partition of this source: {partition!r}")
        store = open_read_store(self.scan.location)
        report = Reporter(self.scan.location.url, self.scan.on_bad_object, self.accumulator)
        return read_batches(store, partition.keys, self.scan, report=report)


class OffloadDataSource(DataSource):
    """`spark.read.format("offload")`: offloaded MQTT messages straight from object storage.

    Options:
        storage: `s3://HOST:PORT/BUCKET?secure=false` or `file:///PATH` (required).
        accessKey, secretKey: S3 credentials (default: the environment at `register`).
        topic: MQTT topic filter with `+` and `#` (default `#`).
        since, until: time range [since, until), ISO-8601 (UTC unless zoned) or epoch ms.
        payload: "false" leaves the payload column null and never fetches payloads.
        verify: "true" (default) checks each payload's size and the manifest's CRC-32C (its
            SHA-256 when the manifest records no CRC-32C); "sha256" size and SHA-256;
            "false" nothing.
        onBadObject: "skip" (default) skips a message that cannot be delivered (checksum
            mismatch, undecodable sidecar or index entry, deleted since planned, too large),
            logs it by key and counts it in what `register` returned; "fail" fails the task.
        parallelism: task slots to plan for (default: what `register` saw).
        maxFilesPerTrigger: streams only: at most this many messages per micro-batch.
        lateness: streams only: seconds an upload may take from its stamp to its commit
            and still be delivered (default 600).
        grantTtl: seconds a direct upload's key may be chosen before its commit stamps it
            (the gateway's OFFLOAD_DIRECT_GRANT_TTL, default 3600); the driver lists that far
            below `since` (a stream: below its floor). See docs/spark.md.
    """

    # Set by `register` on a subclass; read on the driver's planning worker.
    defaults: Mapping[str, str] = {}
    accumulator: Any | None = None

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return DDL

    def reader(self, schema: Any) -> OffloadReader:
        return OffloadReader(parse_options(self.options, defaults=self.defaults), self.accumulator)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        # Imported here: read limits (pyspark.sql.streaming.datasource) came with Spark 4.2,
        # and batch reads must keep working on 4.0 and 4.1.
        try:
            from ._stream import OffloadStreamReader, parse_stream_options
        except ImportError as exc:
            raise ConfigError(
                f'readStream.format("offload") needs pyspark >= 4.2 (read limits): {exc}'
            ) from exc
        options = parse_stream_options(self.options, defaults=self.defaults)
        return OffloadStreamReader(options, self.accumulator)


def register(spark: Any, *, parallelism: int | None = None) -> BadObjects:
    """Make `spark.read.format("offload")` available in this session.

    Reads OFFLOAD_S3_ACCESS_KEY / OFFLOAD_S3_SECRET_KEY from this (the driver's) environment
    now, as defaults that the `accessKey` / `secretKey` options override: Spark plans and
    reads in separate worker processes whose environment need not have them.

    Args:
        spark: the SparkSession.
        parallelism: task slots to plan for (default: `spark.sparkContext.defaultParallelism`,
            or the CPU count where there is no SparkContext, as on Spark Connect).

    Returns:
        The count (and first keys) of the messages the session's scans skipped
        (`onBadObject` = `skip`, see `client.spark._bad`); the same counter every call.
    """
    check_worker_python(spark)
    defaults: dict[str, str] = {}
    accumulator = None
    try:
        context = spark.sparkContext
    except Exception:  # Spark Connect has no SparkContext (nor accumulators)
        context = None
    if context is not None:
        # One per SparkContext: registering again (as the export job does) keeps counting.
        accumulator = _ACCUMULATORS.get(context)
        if accumulator is None:
            accumulator = _ACCUMULATORS[context] = context.accumulator(Tally(), TallyParam())
    if parallelism is None and context is not None:
        parallelism = int(context.defaultParallelism)
    if parallelism is not None:
        defaults["parallelism"] = str(parallelism)
    for option, variable in (("accessKey", ACCESS_KEY_ENV), ("secretKey", SECRET_KEY_ENV)):
        value = os.environ.get(variable)
        if value:
            defaults[option] = value

    # A class made here is pickled by value, so the defaults travel to the planning worker.
    class RegisteredOffloadDataSource(OffloadDataSource):
        pass

    RegisteredOffloadDataSource.defaults = defaults
    RegisteredOffloadDataSource.accumulator = accumulator
    spark.dataSource.register(RegisteredOffloadDataSource)
    return BadObjects(accumulator)
