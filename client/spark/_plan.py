"""Driver-side planning: which payload objects a scan reads, and how they are split into tasks.

Works on keys and sizes only (the driver never reads a payload or a sidecar). Selection
follows the storage layout (client.protocol._layout):

* the topic filter becomes a key prefix (`filter_prefix`), and every key's topic is then
  checked against the filter, since `+` and `#` cannot be expressed as a prefix;
* without a time range one recursive listing below that prefix is enough;
* with a time range the topic tree is walked one level at a time (delimiter listings) down
  to the `date=` partitions; a date wholly inside the range is listed whole, a date the range
  cuts is listed per `hour=` partition, dates outside are never listed;
* a payload whose sidecar is not in the listing is an upload still in flight and is skipped
  (the gateway writes payload, then sidecar, then index);
* a sidecar without a payload beside it is a message whose payload the account had stored
  already (one object per payload per account): its manifest's `data_key` names the
  object, read in its task (planned at the sidecar's size: the driver reads no manifest).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

from ..protocol import (
    DATA_PREFIX,
    META_SUFFIX,
    TopicFilter,
    filter_prefix,
    meta_key,
    parse_data_key,
)
from ..protocol._layout import decode_level
from ._store import ReadStore

# Like Spark's spark.sql.files.openCostInBytes: a request costs about as much as reading this
# many bytes, so many small objects are not packed into one straggling task.
OPEN_COST_BYTES = 1024 * 1024
# Like spark.sql.files.maxPartitionBytes: beyond this a task is split further.
MAX_PARTITION_BYTES = 128 * 1024 * 1024
TASKS_PER_CORE = 3

_HOUR_MS = 3_600_000
_DAY_MS = 24 * _HOUR_MS


def _may_match(levels: Sequence[str], topic_filter: TopicFilter) -> bool:
    """Whether some topic that starts with `levels` (and has more) can match the filter."""
    f_levels = topic_filter.levels
    if levels and levels[0].startswith("$") and f_levels[0] in ("+", "#"):
        return False
    for i, level in enumerate(levels):
        if i >= len(f_levels):
            return False
        if f_levels[i] == "#":
            return True
        if f_levels[i] not in ("+", level):
            return False
    return True


def _topic_levels(prefix: str) -> list[str] | None:
    """Decoded topic levels of a `data/<levels>/` prefix; None when one is not decodable."""
    segments = prefix[len(DATA_PREFIX) :].rstrip("/").split("/")
    try:
        return [decode_level(s) for s in segments if s]
    except UnicodeDecodeError:
        return None


def _day_start_ms(date: str) -> int | None:
    try:
        day = datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        return None
    return int(day.timestamp() * 1000)


def _overlaps(start: int, end: int, since: int | None, until: int | None) -> bool:
    return (since is None or end > since) and (until is None or start < until)


def _covers(start: int, end: int, since: int | None, until: int | None) -> bool:
    return (since is None or since <= start) and (until is None or end <= until)


def _last_segment(prefix: str) -> str:
    return prefix.rstrip("/").rpartition("/")[2]


def _walk_date(
    store: ReadStore, date_prefix: str, since: int | None, until: int | None
) -> Iterable[tuple[str, int]]:
    start = _day_start_ms(_last_segment(date_prefix)[len("date=") :])
    if start is None or not _overlaps(start, start + _DAY_MS, since, until):
        return
    if _covers(start, start + _DAY_MS, since, until):
        yield from store.list_all(date_prefix)
        return
    for hour_prefix in store.list_level(date_prefix).prefixes:
        hour = _last_segment(hour_prefix)[len("hour=") :]
        if not hour.isdigit():
            continue
        hour_start = start + int(hour) * _HOUR_MS
        if _overlaps(hour_start, hour_start + _HOUR_MS, since, until):
            yield from store.list_all(hour_prefix)


def _walk(
    store: ReadStore,
    prefix: str,
    topic_filter: TopicFilter,
    since: int | None,
    until: int | None,
) -> Iterable[tuple[str, int]]:
    for sub in store.list_level(prefix).prefixes:
        # `=` is percent-encoded inside topic levels, so `date=` is always a partition.
        if _last_segment(sub).startswith("date="):
            levels = _topic_levels(sub.rstrip("/").rpartition("/")[0] + "/")
            if levels and topic_filter.matches("/".join(levels)):
                yield from _walk_date(store, sub, since, until)
            continue
        levels = _topic_levels(sub)
        if levels is not None and _may_match(levels, topic_filter):
            yield from _walk(store, sub, topic_filter, since, until)


def select_objects(
    store: ReadStore,
    topic_filter: TopicFilter,
    since: int | None = None,
    until: int | None = None,
) -> list[tuple[str, int]]:
    """(key, size) of every complete payload object the scan may need, sorted by key.

    The time range is applied at hour granularity here; readers check each manifest's
    exact timestamp.

    Args:
        store: the store to list.
        topic_filter: MQTT filter the topics must match.
        since: inclusive lower bound, ms since the epoch (None: unbounded).
        until: exclusive upper bound, ms since the epoch (None: unbounded).
    """
    prefix = filter_prefix(topic_filter)
    if since is None and until is None:
        listed: Iterable[tuple[str, int]] = store.list_all(prefix)
    else:
        listed = _walk(store, prefix, topic_filter, since, until)
    sizes = dict(listed)
    selected = []
    for name, size in sizes.items():
        key = name.removesuffix(META_SUFFIX)
        if name != key and key in sizes:
            continue  # a sidecar beside its payload: the payload key is the message
        parsed = parse_data_key(key)
        if parsed is None or meta_key(key) not in sizes:
            continue
        if topic_filter.matches(parsed.topic):
            selected.append((key, size))
    selected.sort()
    return selected


def partition_count(total_weight: int, objects: int, parallelism: int) -> int:
    """How many tasks: a few per core, more when each would exceed MAX_PARTITION_BYTES.

    Rounded up to a multiple of `parallelism` so the last wave of tasks keeps every core
    busy, and never more than there are objects.

    Args:
        total_weight: sum over objects of size + OPEN_COST_BYTES.
        objects: number of objects.
        parallelism: task slots (Spark's defaultParallelism).
    """
    if objects == 0:
        return 0
    wanted = max(parallelism * TASKS_PER_CORE, math.ceil(total_weight / MAX_PARTITION_BYTES))
    wanted = math.ceil(wanted / parallelism) * parallelism
    return min(wanted, objects)


def pack(objects: Sequence[tuple[str, int]], parallelism: int) -> list[list[str]]:
    """Split objects into tasks of nearly equal bytes (longest-processing-time bin packing).

    Each object weighs its size plus OPEN_COST_BYTES. Keys within a task are sorted so a
    task reads neighbouring keys; empty tasks are dropped.

    Args:
        objects: (key, size) pairs.
        parallelism: task slots (Spark's defaultParallelism), at least 1.
    """
    if parallelism < 1:
        raise ValueError("parallelism must be at least 1")
    weighted = sorted(((size + OPEN_COST_BYTES, key) for key, size in objects), reverse=True)
    count = partition_count(sum(w for w, _ in weighted), len(weighted), parallelism)
    if count == 0:
        return []
    bins: list[list[str]] = [[] for _ in range(count)]
    heap = [(0, i) for i in range(count)]
    for weight, key in weighted:
        load, index = heapq.heappop(heap)
        bins[index].append(key)
        heapq.heappush(heap, (load + weight, index))
    return [sorted(b) for b in bins if b]


def whole_days(since: int | None, until: int | None) -> tuple[int | None, int | None]:
    """Widen a range to UTC day boundaries (the export job's partition grain).

    Args:
        since: inclusive lower bound in ms, or None.
        until: exclusive upper bound in ms, or None.
    """
    start = None if since is None else since - since % _DAY_MS
    end = None if until is None else until + (-until % _DAY_MS)
    return start, end


def day_of(timestamp_ms: int) -> str:
    """The UTC date of a timestamp, as the layout and the export job write it."""
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=timestamp_ms)).strftime(
        "%Y-%m-%d"
    )
