"""The Spark reader's planning and options, without Spark: fast, on the embedded file store."""

from __future__ import annotations

import dataclasses
import hashlib
import mmap
import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import google_crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.core._exceptions import ConfigError, PayloadChecksumMismatch
from client.protocol import Manifest, MessageId, Topic, TopicFilter, data_key, meta_key
from client.spark import parse_options, parse_storage_url, parse_time
from client.spark._options import StorageLocation, Verify
from client.spark._plan import (
    MAX_PARTITION_BYTES,
    OPEN_COST_BYTES,
    pack,
    partition_count,
    select_objects,
    whole_days,
)
from client.spark._read import check, crc32c_hex, read_batches
from client.spark._store import MAP_MIN_BYTES, FileReadStore, Listing, Oversize, Payload


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


class KeepingStore(FileReadStore):
    """A real file store that keeps the bytes objects it returned, by key."""

    def __init__(self, root: Path) -> None:
        super().__init__(StorageLocation("file", str(root)))
        self.returned: dict[str, Payload] = {}

    def get_payload(self, key: str, max_bytes: int) -> Payload | Oversize | None:
        data = super().get_payload(key, max_bytes)
        if isinstance(data, (bytes, mmap.mmap)):
            self.returned[key] = data
        return data


class RecordingStore(FileReadStore):
    """A real file store that remembers which prefixes were listed."""

    def __init__(self, root: Path) -> None:
        super().__init__(StorageLocation("file", str(root)))
        self.levels: list[str] = []
        self.recursive: list[str] = []

    def list_level(self, prefix: str) -> Listing:
        self.levels.append(prefix)
        return super().list_level(prefix)

    def list_all(self, prefix: str) -> Iterator[tuple[str, int]]:
        if not self.recursive or not prefix.startswith(self.recursive[-1]):
            self.recursive.append(prefix)
        return super().list_all(prefix)


def put(root: Path, topic: str, when: int, payload: bytes = b"p", sidecar: bool = True) -> str:
    t = Topic(topic)
    key = data_key(t, when, uuid.uuid4().hex)
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    if sidecar:
        manifest = Manifest(
            MessageId.new(), t, when, len(payload), hashlib.sha256(payload).hexdigest(), key
        )
        (root / meta_key(key)).write_bytes(manifest.to_json())
    return key


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, str]:
    keys = {
        "a/x@21T23": put(tmp_path, "a/x", ms("2026-11-21T23:30:00")),
        "a/x@22T10": put(tmp_path, "a/x", ms("2026-11-22T10:15:00")),
        "a/y@22T11": put(tmp_path, "a/y", ms("2026-11-22T11:00:00")),
        "a@22T12": put(tmp_path, "a", ms("2026-11-22T12:00:00")),
        "a/x/deep@22T00": put(tmp_path, "a/x/deep", ms("2026-11-22T00:00:00")),
        "b/z@23T05": put(tmp_path, "b/z", ms("2026-11-23T05:00:00")),
        "odd@22T09": put(tmp_path, "we=ird/../%/ü/", ms("2026-11-22T09:00:00")),
    }
    put(tmp_path, "a/x", ms("2026-11-22T10:20:00"), sidecar=False)  # in flight
    return keys


def selected(
    root: Path, topic_filter: str, since: int | None = None, until: int | None = None
) -> set[str]:
    store = FileReadStore(StorageLocation("file", str(root)))
    return {k for k, _ in select_objects(store, TopicFilter(topic_filter), since, until)}


@pytest.mark.parametrize(
    ("topic_filter", "names"),
    [
        (
            "#",
            {
                "a/x@21T23",
                "a/x@22T10",
                "a/y@22T11",
                "a@22T12",
                "a/x/deep@22T00",
                "b/z@23T05",
                "odd@22T09",
            },
        ),
        ("a/#", {"a/x@21T23", "a/x@22T10", "a/y@22T11", "a@22T12", "a/x/deep@22T00"}),
        ("a/+", {"a/x@21T23", "a/x@22T10", "a/y@22T11"}),
        ("a/x", {"a/x@21T23", "a/x@22T10"}),
        ("a", {"a@22T12"}),
        ("+/+/deep", {"a/x/deep@22T00"}),
        ("we=ird/../%/ü/", {"odd@22T09"}),
        ("+", {"a@22T12"}),
    ],
)
def test_topic_selection(
    tmp_path: Path, tree: dict[str, str], topic_filter: str, names: set[str]
) -> None:
    assert selected(tmp_path, topic_filter) == {tree[n] for n in names}
    # The same through the time-range walk, with a range that holds everything.
    assert selected(tmp_path, topic_filter, ms("2000-01-01T00:00:00")) == {tree[n] for n in names}


def test_in_flight_payloads_and_sidecars_are_not_selected(
    tmp_path: Path, tree: dict[str, str]
) -> None:
    keys = selected(tmp_path, "a/x")
    assert keys == {tree["a/x@21T23"], tree["a/x@22T10"]}
    assert not any(k.endswith(".meta.json") for k in keys)


def test_time_range_lists_only_the_dates_and_hours_it_touches(
    tmp_path: Path, tree: dict[str, str]
) -> None:
    store = RecordingStore(tmp_path)
    since, until = ms("2026-11-22T10:00:00"), ms("2026-11-22T11:00:00")
    keys = {k for k, _ in select_objects(store, TopicFilter("a/#"), since, until)}
    assert keys == {tree["a/x@22T10"]}
    # 2026-11-21 and other hours of the 22nd are never listed; no topic outside a/ is visited.
    assert all("2026-11-21" not in p and "2026-11-23" not in p for p in store.levels)
    assert all(p.startswith("data/a/") for p in store.levels + store.recursive)
    assert all("/hour=10/" in p for p in store.recursive)


def test_whole_days_in_the_range_are_listed_at_once(tmp_path: Path, tree: dict[str, str]) -> None:
    store = RecordingStore(tmp_path)
    select_objects(store, TopicFilter("a/x"), ms("2026-11-22T00:00:00"), ms("2026-11-23T00:00:00"))
    assert store.recursive == ["data/a/x/date=2026-11-22/"]


def test_hour_pruning_is_refined_by_the_exact_timestamp(
    tmp_path: Path, tree: dict[str, str]
) -> None:
    since = ms("2026-11-22T10:16:00")  # after a/x@22T10 (10:15) but in its hour
    options = parse_options({"storage": tmp_path.as_uri(), "since": str(since), "topic": "a/x"})
    store = FileReadStore(options.location)
    keys = [k for k, _ in select_objects(store, options.topic_filter, since, None)]
    assert keys == [tree["a/x@22T10"]]  # listed by hour ...
    assert list(read_batches(store, keys, options)) == []  # ... dropped by its manifest


def test_batches_are_bounded_by_bytes_and_a_lone_payload_is_not_copied(tmp_path: Path) -> None:
    import pyarrow as pa

    sizes = [5, 30, 7, 7, 7, 0, 12]
    when = ms("2026-11-22T10:00:00")
    keys = [put(tmp_path, "a/x", when + i, bytes([65 + i]) * n) for i, n in enumerate(sizes)]
    options = parse_options({"storage": tmp_path.as_uri()})
    store = KeepingStore(tmp_path)
    batches = list(read_batches(store, keys, options, batch_bytes=20))
    # Flushed before overshooting 20 bytes; the 30-byte payload travels alone.
    assert [b.column("size").to_pylist() for b in batches] == [[5], [30], [7, 7], [7, 0, 12]]
    payloads = [p for b in batches for p in b.column("payload").to_pylist()]
    assert payloads == [bytes([65 + i]) * n for i, n in enumerate(sizes)]
    # The lone payloads' Arrow data buffers are the very bytes objects the store returned.
    for batch, key in zip(batches[:2], keys[:2], strict=True):
        data = batch.column("payload").buffers()[2]
        assert data.address == pa.py_buffer(store.returned[key]).address
    assert batches[2].column("payload").buffers()[2].address not in {
        pa.py_buffer(store.returned[k]).address for k in keys[2:4]
    }


def test_a_large_file_is_mapped_and_travels_without_a_copy(tmp_path: Path) -> None:
    import pyarrow as pa

    payload = os.urandom(MAP_MIN_BYTES + 1)
    key = put(tmp_path, "a/x", ms("2026-11-22T10:00:00"), payload)
    options = parse_options({"storage": tmp_path.as_uri()})
    store = KeepingStore(tmp_path)
    (batch,) = read_batches(store, [key], options)  # verified against its SHA-256 too
    assert isinstance(store.returned[key], mmap.mmap)
    data = batch.column("payload").buffers()[2]
    assert data.address == pa.py_buffer(store.returned[key]).address
    assert batch.column("payload")[0].as_py() == payload


@pytest.mark.parametrize("extra", [-1, 0, 1, MAP_MIN_BYTES, 2 * MAP_MIN_BYTES - 1])
def test_crc32c_of_a_mapped_payload_is_that_of_its_bytes(tmp_path: Path, extra: int) -> None:
    """google_crc32c refuses a mapping: it is fed in slices, whatever the size."""
    payload = os.urandom(MAP_MIN_BYTES + extra)
    key = put(tmp_path, "a/x", ms("2026-11-22T10:00:00"), payload)
    mapped = FileReadStore(StorageLocation("file", str(tmp_path))).get_payload(key, len(payload))
    assert mapped is not None and isinstance(mapped, mmap.mmap) == (extra >= 0)
    assert crc32c_hex(mapped) == crc32c_hex(payload) == f"{google_crc32c.value(payload):08x}"


def test_check_picks_the_checksum_the_option_and_the_manifest_allow() -> None:
    payload = b"payload"
    sha = hashlib.sha256(payload).hexdigest()
    base = Manifest(MessageId.new(), Topic("a"), 0, len(payload), sha, "data/a/x")
    crc = crc32c_hex(payload)
    wrong_sha = dataclasses.replace(base, sha256="0" * 64, crc32c=crc)
    wrong_crc = dataclasses.replace(base, crc32c="00000000")
    wrong_size = dataclasses.replace(base, size=len(payload) + 1)
    check(wrong_sha, payload, Verify.AUTO, "u")  # the CRC-32C stands for the payload
    check(base, payload, Verify.AUTO, "u")  # no CRC-32C recorded: SHA-256, which matches
    for manifest, verify, algorithm in [
        (wrong_sha, Verify.SHA256, "sha256"),
        (wrong_crc, Verify.AUTO, "crc32c"),
        (wrong_size, Verify.AUTO, "sha256"),  # caught whatever the hash says
    ]:
        with pytest.raises(PayloadChecksumMismatch, match=f"expected {algorithm} "):
            check(manifest, payload, verify, "file:///s/k")
    check(wrong_crc, payload, Verify.SHA256, "u")  # sha256 never looks at the CRC-32C


@given(st.lists(st.integers(0, 300 * 1024 * 1024), max_size=60), st.integers(1, 8))
def test_pack_places_every_object_once_in_balanced_tasks(
    sizes: list[int], parallelism: int
) -> None:
    objects = [(f"k{i:03d}", s) for i, s in enumerate(sizes)]
    tasks = pack(objects, parallelism)
    assert sorted(k for t in tasks for k in t) == sorted(k for k, _ in objects)
    assert len(tasks) == partition_count(
        sum(s + OPEN_COST_BYTES for s in sizes), len(sizes), parallelism
    )
    if not tasks:
        return
    weight = dict((k, s + OPEN_COST_BYTES) for k, s in objects)
    loads = [sum(weight[k] for k in t) for t in tasks]
    # Greedy LPT bound: no task exceeds the mean by more than its largest object.
    assert max(loads) <= sum(loads) / len(loads) + max(weight.values())
    assert all(t == sorted(t) for t in tasks)


def test_partition_count() -> None:
    assert partition_count(0, 0, 2) == 0
    assert partition_count(3 * OPEN_COST_BYTES, 3, 2) == 3  # never more tasks than objects
    assert partition_count(100 * OPEN_COST_BYTES, 100, 2) == 6  # three per slot
    # 1 GiB of 64 objects: tasks of at most ~128 MiB, rounded up to a multiple of the slots.
    assert partition_count(1024 * 1024 * 1024 + 64 * OPEN_COST_BYTES, 64, 2) == 10
    assert partition_count(10 * MAX_PARTITION_BYTES, 1000, 4) == 12


def test_parse_options() -> None:
    opts = parse_options(
        {
            "Storage": "s3://127.0.0.1:9000/bkt?secure=false&region=eu",
            "TOPIC": "a/+",
            "since": "2026-11-22",
            "until": "1795392000000",
            "payload": "False",
            "verify": "no",
            "parallelism": "4",
        },
        defaults={"accessKey": "AK", "secretKey": "S3CRET", "parallelism": "2"},
    )
    assert opts.location == StorageLocation(
        "s3",
        "bkt",
        endpoint="127.0.0.1:9000",
        secure=False,
        region="eu",
        access_key="AK",
        secret_key="S3CRET",
    )
    assert opts.topic_filter == TopicFilter("a/+")
    assert (opts.since, opts.until) == (ms("2026-11-22T00:00:00"), 1795392000000)
    assert (opts.payload, opts.verify, opts.parallelism) == (False, Verify.OFF, 4)
    assert "S3CRET" not in repr(opts)
    explicit = parse_options(
        {"storage": "s3://h:1/b", "accessKey": "mine"}, defaults={"accessKey": "env"}
    )
    assert explicit.location.access_key == "mine"
    assert explicit.location.secure is True
    assert parse_options({"storage": "file:///srv/offload/"}).location == StorageLocation(
        "file", "/srv/offload"
    )


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"storage": "http://h/b"},
        {"storage": "s3://h:1/b/extra"},
        {"storage": "s3://h:1/"},
        {"storage": "file://relative/path"},
        {"storage": "s3://h:1/b", "topic": "a/#/b"},
        {"storage": "s3://h:1/b", "since": "yesterday"},
        {"storage": "s3://h:1/b", "since": "2026-11-23", "until": "2026-11-22"},
        {"storage": "s3://h:1/b", "payload": "maybe"},
        {"storage": "s3://h:1/b", "verify": "md5"},
        {"storage": "s3://h:1/b", "parallelism": "0"},
    ],
)
def test_bad_options_are_config_errors(options: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        parse_options(options)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, Verify.AUTO),
        ("true", Verify.AUTO),
        ("Yes", Verify.AUTO),
        ("SHA256", Verify.SHA256),
        ("sha-256", Verify.SHA256),
        ("false", Verify.OFF),
        ("0", Verify.OFF),
    ],
)
def test_verify_option_values(value: str | None, expected: Verify) -> None:
    options = {"storage": "file:///srv"} | ({} if value is None else {"verify": value})
    assert parse_options(options).verify is expected


def test_parse_time() -> None:
    assert parse_time("0") == 0
    assert parse_time("2026-11-22T10:00:00Z") == ms("2026-11-22T10:00:00")
    assert parse_time("2026-11-22T11:00:00+01:00") == ms("2026-11-22T10:00:00")
    assert parse_time("2026-11-22 10:00") == ms("2026-11-22T10:00:00")


def test_storage_url_round_trip() -> None:
    loc = parse_storage_url("s3://127.0.0.1:9000/bkt?secure=false", secret_key="s3cr3t-value")
    assert loc.url == "s3://127.0.0.1:9000/bkt"
    assert loc.secret_key == "s3cr3t-value"
    assert "s3cr3t" not in repr(loc)


def test_whole_days() -> None:
    assert whole_days(None, None) == (None, None)
    assert whole_days(ms("2026-11-22T10:00:00"), ms("2026-11-23T00:00:00")) == (
        ms("2026-11-22T00:00:00"),
        ms("2026-11-23T00:00:00"),
    )
    assert whole_days(ms("2026-11-22T00:00:00"), ms("2026-11-23T00:00:00") + 1)[1] == ms(
        "2026-11-24T00:00:00"
    )
