"""`spark.readStream.format("offload")`: newly committed messages in micro-batches.

A thin adapter over `_offsets` (what a batch takes) and `_read` (how a task reads it). The
driver lists the topic filter's hour partitions from the offset's `floor` on, and for each
message it has not seen yet reads the sidecar (its exact stamp) and the id index (the commit
point: only a payload the index names is delivered). Stamps of committed messages are
cached for the life of the query, so each is read once. The
batch's keys are written into the end offset, so Spark's checkpoint alone decides what a
replayed batch reads; with a checkpointed file sink that is exactly once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
)

from .._exceptions import ConfigError, ProtocolError
from ..protocol import Manifest, index_key, meta_key, parse_data_key
from ._offsets import Candidate, StreamOffset, advance, initial_offset, positive_ms
from ._options import ScanOptions, parse_options
from ._plan import select_objects
from ._read import read_batches
from ._store import ReadStore, open_read_store

DEFAULT_LATENESS_MS = 600_000
# Sidecars read at once on the driver when many new messages arrive together.
STAMP_READERS = 8


@dataclasses.dataclass(frozen=True, slots=True)
class StreamOptions:
    """A checked `spark.readStream.format("offload")` request."""

    scan: ScanOptions
    max_files: int | None = None
    lateness: int = DEFAULT_LATENESS_MS


def parse_stream_options(
    options: Mapping[str, str], *, defaults: Mapping[str, str] | None = None
) -> StreamOptions:
    """The batch options plus `maxFilesPerTrigger` and `lateness` (seconds).

    Args:
        options: Spark's option map.
        defaults: what `register` saw (credentials, parallelism).
    """
    scan = parse_options(options, defaults=defaults)
    if scan.until is not None:
        raise ConfigError("until: a stream has no end; use spark.read for a fixed range")
    lowered = {k.lower(): v for k, v in options.items() if v is not None}
    max_files = None
    if "maxfilespertrigger" in lowered:
        text = lowered["maxfilespertrigger"]
        if not text.strip().isdigit() or int(text) < 1:
            raise ConfigError(f"maxFilesPerTrigger: expected a positive integer, got {text!r}")
        max_files = int(text)
    lateness = DEFAULT_LATENESS_MS
    if "lateness" in lowered:
        lateness = positive_ms(lowered["lateness"], "lateness")
    return StreamOptions(scan, max_files, lateness)


class StreamPartition(InputPartition):
    """One task's share of a micro-batch: payload keys only."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(None)
        self.keys = keys

    def __repr__(self) -> str:
        return f"StreamPartition({len(self.keys)} keys)"


class OffloadStreamReader(DataSourceStreamReader):
    """Offsets on the driver, reading in tasks (see the module docstring)."""

    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        self._stamps: dict[str, int] = {}  # payload key -> manifest timestamp

    def initialOffset(self) -> dict[str, Any]:
        return initial_offset(self.options.scan.since).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_files is None:
            return ReadAllAvailable()
        return ReadMaxFiles(self.options.max_files)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        offset = StreamOffset.from_json(start)
        max_files = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        candidates = self._candidates(offset)
        return advance(
            offset, candidates, max_files=max_files, lateness=self.options.lateness
        ).to_json()

    def _candidates(self, offset: StreamOffset) -> list[Candidate]:
        scan = self.options.scan
        store = open_read_store(scan.location)
        listed = select_objects(store, scan.topic_filter, since=offset.floor)
        tokens: dict[str, str] = {}
        for key, _size in listed:
            parsed = parse_data_key(key)
            if parsed is not None and parsed.token not in offset.seen:
                tokens[key] = parsed.token
        unknown = [k for k in tokens if k not in self._stamps]
        with ThreadPoolExecutor(STAMP_READERS, thread_name_prefix="offload-stamp") as pool:
            for key, stamp in zip(
                unknown, pool.map(lambda k: _stamp(store, k), unknown), strict=True
            ):
                if stamp is not None:
                    self._stamps[key] = stamp
        # Forget stamps that can no longer matter, so a long query's cache stays bounded.
        self._stamps = {k: v for k, v in self._stamps.items() if k in tokens}
        return [Candidate(k, tokens[k], self._stamps[k]) for k in tokens if k in self._stamps]

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[StreamPartition]:
        keys = list(StreamOffset.from_json(end).batch)
        slots = max(1, min(self.options.scan.parallelism or 1, len(keys)))
        return [StreamPartition(keys[i::slots]) for i in range(slots)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, StreamPartition):
            raise TypeError(f"not a partition of this source: {partition!r}")
        # The offsets already chose these messages: no time range is applied again.
        scan = dataclasses.replace(self.options.scan, since=None, until=None)
        return read_batches(open_read_store(scan.location), partition.keys, scan)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the store keeps messages until they expire."""


def _stamp(store: ReadStore, key: str) -> int | None:
    """The message's stamp once it is committed; None while it is not (or never will be).

    The id index is the commit point (written last): a sidecar without it is a commit in
    progress, and one whose index names another payload lost a race for its id and is
    about to be removed by the gateway. Neither may reach the sink.
    """
    raw = store.get(meta_key(key))
    if raw is None:  # expired since the listing
        return None
    try:
        manifest = Manifest.from_json(raw)
    except ProtocolError as exc:
        raise ProtocolError(f"{meta_key(key)}: {exc}") from exc
    index = store.get(index_key(manifest.id))
    if index is None:
        return None
    try:
        committed = Manifest.from_json(index)
    except ProtocolError as exc:
        raise ProtocolError(f"{index_key(manifest.id)}: {exc}") from exc
    return manifest.timestamp if committed.data_key == key else None
