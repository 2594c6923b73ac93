"""`spark.readStream.format("offload")`: newly committed messages in micro-batches.

A thin adapter over `_offsets` (what a batch takes) and `_read` (how a task reads it). The
driver lists the topic filter's hour partitions from `grantTtl` below the offset's `floor`
on (a direct upload is keyed at its grant, stamped at its commit), and for each message it
has not seen yet reads the sidecar and, unless it is stamped below `floor`, the id index
(the commit point, whose stamp orders the stream: only a payload the index names is
delivered). What it finds is cached for the life of the query, so each is read once. A
sidecar or index entry it cannot decode is not a reason to stop: it takes a place in the
next batch as a bad object, which that batch reports instead of reading (`_bad`). The
batch's keys are written into the end offset, so Spark's checkpoint alone decides what a
replayed batch reads; with a checkpointed file sink that is exactly once.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
)

from ..core._exceptions import ConfigError
from ..protocol import index_key, meta_key, parse_data_key
from ..protocol._layout import DataKey
from ._bad import BadObject, Problem, Reporter
from ._confirm import batch_id, confirm_batch, group_option, note_verified
from ._offsets import Candidate, StreamOffset, advance, initial_offset, positive_ms
from ._options import ScanOptions, Verify, parse_options
from ._plan import select_objects
from ._read import MAX_SIDECAR_BYTES, parse_manifest, read_batches
from ._store import ReadStore, open_read_store

log = logging.getLogger("client.spark")

DEFAULT_LATENESS_MS = 600_000
# Sidecars read at once on the driver when many new messages arrive together.
STAMP_READERS = 8


@dataclasses.dataclass(frozen=True, slots=True)
class StreamOptions:
    """A checked `spark.readStream.format("offload")` request."""

    scan: ScanOptions
    max_files: int | None = None
    lateness: int = DEFAULT_LATENESS_MS
    group: str | None = None  # confirms what each committed batch delivered (`_confirm`)


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
    group = group_option(lowered.get("group"))
    if group is not None and (not scan.payload or scan.verify is Verify.OFF):
        raise ConfigError(
            "group: a stream confirms only payloads it read and verified (payload=true, "
            "verify=true or sha256)"
        )
    return StreamOptions(scan, max_files, lateness, group)


class StreamPartition(InputPartition):
    """One task's share of a micro-batch: payload keys, and the undecodable ones to report."""

    def __init__(
        self, keys: list[str], bad: tuple[BadObject, ...] = (), batch: str = "", task: int = 0
    ) -> None:
        super().__init__(None)
        self.keys = keys
        self.bad = bad
        self.batch = batch  # the micro-batch's name, for its confirmations (`_confirm`)
        self.task = task

    def __repr__(self) -> str:
        return f"StreamPartition({len(self.keys)} keys)"


class OffloadStreamReader(DataSourceStreamReader):
    """Offsets on the driver, reading in tasks (see the module docstring)."""

    def __init__(self, options: StreamOptions, accumulator: Any | None = None) -> None:
        self.options = options
        self.accumulator = accumulator  # of `_bad.Tally`, from `register`
        # payload key -> its stamp once committed, or why it cannot be delivered
        self._stamps: dict[str, int | BadObject] = {}
        self._held: set[str] = set()  # stamped in the future, already logged

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
            offset,
            candidates,
            max_files=max_files,
            lateness=self.options.lateness,
            key_lead=self.options.scan.grant_ttl,
        ).to_json()

    def _candidates(self, offset: StreamOffset) -> list[Candidate]:
        scan = self.options.scan
        store = open_read_store(scan.location)
        listed = select_objects(store, scan.topic_filter, since=scan.listing_since(offset.floor))
        keys: dict[str, DataKey] = {}
        for key, _size in listed:
            parsed = parse_data_key(key)
            if parsed is not None and parsed.token not in offset.seen:
                keys[key] = parsed
        unknown = [k for k in keys if k not in self._stamps]
        with ThreadPoolExecutor(STAMP_READERS, thread_name_prefix="offload-stamp") as pool:
            found = pool.map(lambda k: _stamp(store, k, offset.floor), unknown)
            for key, stamp in zip(unknown, found, strict=True):
                if stamp is not None:
                    self._stamps[key] = stamp
        # Forget stamps that can no longer matter, so a long query's cache stays bounded.
        self._stamps = {k: v for k, v in self._stamps.items() if k in keys}
        self._held = {k for k in self._held if k in keys}
        # A stamp ahead of this clock by more than `lateness` waits for its time: taken now,
        # it would lift the floor past every message committed until then (a gateway's
        # clock gone wrong, or an entry written straight into the store).
        horizon = int(time.time() * 1000) + self.options.lateness
        candidates = []
        for key, parsed in keys.items():
            stamp = self._stamps.get(key)
            if isinstance(stamp, BadObject):
                problem = (stamp.problem.value, stamp.reason)
                hour = _hour_ms(parsed, offset.floor)
                candidates.append(Candidate(key, parsed.token, hour, problem))
            elif stamp is not None and stamp > horizon:
                if key not in self._held:
                    self._held.add(key)
                    ahead = stamp - horizon + self.options.lateness
                    log.warning("offload stream holds back %s: stamped %d ms ahead", key, ahead)
            elif stamp is not None:
                candidates.append(Candidate(key, parsed.token, stamp))
        return candidates

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[StreamPartition]:
        offset = StreamOffset.from_json(end)
        keys = [k for k in offset.batch if k not in offset.bad]
        bad = tuple(
            BadObject(k, _problem(kind), reason) for k, (kind, reason) in offset.bad.items()
        )
        slots = max(1, min(self.options.scan.parallelism or 1, len(keys)))
        batch = batch_id(offset.batch)
        return [
            StreamPartition(keys[i::slots], bad if i == 0 else (), batch, i) for i in range(slots)
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, StreamPartition):
            raise TypeError(f"not a partition of this source: {partition!r}")
        # The offsets already chose these messages: no time range is applied again.
        scan = dataclasses.replace(self.options.scan, since=None, until=None)
        report = Reporter(scan.location.url, scan.on_bad_object, self.accumulator)
        for bad in partition.bad:
            report(bad)
        store = open_read_store(scan.location)
        group = self.options.group
        if group is None:
            return read_batches(store, partition.keys, scan, report=report)
        return _noting(store, group, partition, scan, report)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark has the batch that ended at `end` in its sink: with `group`, confirm what
        its tasks verified (`_confirm`); else nothing to release (the gateway keeps
        messages until they expire or their groups confirmed them)."""
        group = self.options.group
        if group is None:
            return
        batch = StreamOffset.from_json(end).batch
        if batch:
            store = open_read_store(self.options.scan.location)
            done = confirm_batch(store, group, batch_id(batch))
            log.info("offload stream confirmed %d messages for group %s", done, group)


def _noting(
    store: ReadStore,
    group: str,
    partition: StreamPartition,
    scan: ScanOptions,
    report: Reporter,
) -> Iterator[Any]:
    """The task's rows, then the list of what it verified (once every row is Spark's)."""
    delivered: list[str] = []
    yield from read_batches(store, partition.keys, scan, report=report, delivered=delivered)
    note_verified(store, group, partition.batch, partition.task, delivered)


def _stamp(store: ReadStore, key: str, floor: int) -> int | BadObject | None:
    """The message's stamp once committed, why it cannot be delivered, or None (not committed).

    The id index is the commit point (written last): a sidecar without it is a commit in
    progress, and one whose index names another payload lost a race for its id and is
    about to be removed by the gateway. Neither may reach the sink. The index's stamp orders
    the stream: the gateway stamps a direct upload when it commits it.

    Args:
        store: the driver's store client.
        key: a listed payload key.
        floor: the offset's floor: a message whose sidecar is stamped before it was
            delivered or given up on, and its index is not read.
    """
    raw = store.get(meta_key(key), MAX_SIDECAR_BYTES)
    if raw is None:  # expired since the listing, or a loser removed
        return None
    manifest = parse_manifest(raw, key, "sidecar", key)
    if isinstance(manifest, BadObject):
        return manifest
    if manifest.timestamp < floor:
        return manifest.timestamp
    where = index_key(manifest.id)
    index = store.get(where, MAX_SIDECAR_BYTES)
    if index is None:
        return None
    committed = parse_manifest(index, None, f"index entry {where}", key)
    if isinstance(committed, BadObject):
        return committed
    return committed.timestamp if committed.home == key else None


def _hour_ms(key: DataKey, fallback: int) -> int:
    """Start of the key's UTC hour in ms (an undecodable message's only time)."""
    try:
        start = datetime.strptime(f"{key.date} {key.hour}", "%Y-%m-%d %H").replace(tzinfo=UTC)
    except ValueError:
        return fallback
    return int(start.timestamp() * 1000)


def _problem(kind: str) -> Problem:
    try:
        return Problem(kind)
    except ValueError:
        return Problem.MALFORMED
