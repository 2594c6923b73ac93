"""The `offload` PySpark data source (Spark 4 Python Data Source API): a thin adapter.

Planning (`partitions`) runs once on the driver and lists keys and sizes; `read` runs in
each task on an executor and fetches that task's sidecars and payloads itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

from .._exceptions import ConfigError
from ._options import ScanOptions, parse_options
from ._plan import pack, select_objects
from ._read import DDL, read_batches
from ._store import ACCESS_KEY_ENV, SECRET_KEY_ENV, open_read_store
from ._worker import check_worker_python

FORMAT = "offload"


class OffloadPartition(InputPartition):
    """One task's share: payload keys only, so the pickled plan stays small."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(None)
        self.keys = keys

    def __repr__(self) -> str:
        return f"OffloadPartition({len(self.keys)} keys)"


class OffloadReader(DataSourceReader):
    """Lists on the driver, reads on executors."""

    def __init__(self, options: ScanOptions) -> None:
        self.scan = options

    def partitions(self) -> list[OffloadPartition]:
        store = open_read_store(self.scan.location)
        objects = select_objects(store, self.scan.topic_filter, self.scan.since, self.scan.until)
        parallelism = self.scan.parallelism or os.cpu_count() or 1
        # Spark substitutes a bare InputPartition(None) for an empty plan: say "nothing".
        return [OffloadPartition(keys) for keys in pack(objects, parallelism)] or [
            OffloadPartition([])
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, OffloadPartition):
            raise TypeError(f"not a partition of this source: {partition!r}")
        store = open_read_store(self.scan.location)
        return read_batches(store, partition.keys, self.scan)


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
            "false" nothing. A mismatch fails the task (`PayloadChecksumMismatch`).
        parallelism: task slots to plan for (default: what `register` saw).
        maxFilesPerTrigger: streams only: at most this many messages per micro-batch.
        lateness: streams only: seconds an upload may take from its stamp to its commit
            and still be delivered (default 600).
    """

    # Set by `register` on a subclass; read on the driver's planning worker.
    defaults: Mapping[str, str] = {}

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return DDL

    def reader(self, schema: Any) -> OffloadReader:
        return OffloadReader(parse_options(self.options, defaults=self.defaults))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        # Imported here: read limits (pyspark.sql.streaming.datasource) came with Spark 4.2,
        # and batch reads must keep working on 4.0 and 4.1.
        try:
            from ._stream import OffloadStreamReader, parse_stream_options
        except ImportError as exc:
            raise ConfigError(
                f'readStream.format("offload") needs pyspark >= 4.2 (read limits): {exc}'
            ) from exc
        return OffloadStreamReader(parse_stream_options(self.options, defaults=self.defaults))


def register(spark: Any, *, parallelism: int | None = None) -> None:
    """Make `spark.read.format("offload")` available in this session.

    Reads OFFLOAD_S3_ACCESS_KEY / OFFLOAD_S3_SECRET_KEY from this (the driver's) environment
    now, as defaults that the `accessKey` / `secretKey` options override: Spark plans and
    reads in separate worker processes whose environment need not have them.

    Args:
        spark: the SparkSession.
        parallelism: task slots to plan for (default: `spark.sparkContext.defaultParallelism`,
            or the CPU count where there is no SparkContext, as on Spark Connect).
    """
    check_worker_python(spark)
    defaults: dict[str, str] = {}
    if parallelism is None:
        try:
            parallelism = int(spark.sparkContext.defaultParallelism)
        except Exception:  # Spark Connect has no SparkContext
            parallelism = None
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
    spark.dataSource.register(RegisteredOffloadDataSource)
