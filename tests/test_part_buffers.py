"""Proxied uploads' part buffers: sized from the load, reused, and every byte kept.

Against the real SeaweedFS through `S3Store` (issue 31 item 1): one upload alone holds the
configured parts, uploads in flight together share `part_memory`, and whatever the sizes
and readers the stored object is byte for byte the stream.
"""

from __future__ import annotations

import concurrent.futures
import io
import os
import threading
from collections.abc import Iterator

import pytest

from gateway.storage import S3Store, StoreError
from gateway.storage._buffers import PartBuffers, part_size_under_load, plan

from _servers import SeaweedFS

pytestmark = pytest.mark.servers

MiB = 1024 * 1024


class CountingBuffers(PartBuffers):
    """The store's free list, counting the buffers handed out and not yet given back."""

    def __init__(self, keep_bytes: int) -> None:
        super().__init__(keep_bytes)
        self._count_lock = threading.Lock()
        self.out = 0
        self.peak = 0

    def take(self, size: int) -> bytearray:
        with self._count_lock:
            self.out += 1
            self.peak = max(self.peak, self.out)
        return super().take(size)

    def give(self, buffer: bytearray) -> None:
        with self._count_lock:
            self.out -= 1
        super().give(buffer)


class ReadOnly:
    """A reader with `read` alone (no `readinto`), as any store client may get."""

    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)

    def read(self, n: int = -1) -> bytes:
        return self._inner.read(min(n, 777_777))  # short reads, as a socket gives


class Gated(io.BytesIO):
    """Waits at its first read until every upload of the test is in flight."""

    def __init__(self, data: bytes, gate: threading.Barrier) -> None:
        super().__init__(data)
        self._gate: threading.Barrier | None = gate

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._gate is not None:
            self._gate.wait(60)
            self._gate = None
        return super().readinto(buffer)


@pytest.fixture
def make_store(seaweed: SeaweedFS, bucket_name: str) -> Iterator[type[S3Store]]:
    def make(**kw: int) -> S3Store:
        store = S3Store(
            seaweed.endpoint,
            bucket_name,
            access_key=seaweed.access_key,
            secret_key=seaweed.secret_key,
            timeout=60,
            **kw,  # type: ignore[arg-type]
        )
        store.ensure_bucket()
        return store

    yield make  # type: ignore[misc]


def test_one_upload_alone_keeps_the_configured_parts_many_share_the_budget() -> None:
    budget = 128 * MiB
    assert plan(part_size=8 * MiB, parallel=2, budget=budget, transfers=1).buffers == 3
    assert plan(part_size=8 * MiB, parallel=2, budget=budget, transfers=8).buffers == 2
    assert plan(part_size=8 * MiB, parallel=2, budget=budget, transfers=20).buffers == 1
    assert plan(part_size=8 * MiB, parallel=2, budget=budget, transfers=500).buffers == 1
    assert part_size_under_load(8 * MiB, budget=budget, transfers=1) == 8 * MiB
    assert part_size_under_load(8 * MiB, budget=budget, transfers=12) == 5 * MiB
    assert part_size_under_load(8 * MiB, budget=budget, transfers=500) == 5 * MiB  # S3's floor


def test_a_buffer_given_back_is_reused_and_idle_ones_are_bounded() -> None:
    buffers = PartBuffers(keep_bytes=10 * MiB)
    first = buffers.take(5 * MiB)
    second = buffers.take(5 * MiB)
    third = buffers.take(5 * MiB)
    for b in (first, second, third):
        buffers.give(b)
    assert buffers.idle_bytes == 10 * MiB  # the third was freed
    assert buffers.take(5 * MiB) in (first, second)


def test_uploads_in_flight_together_hold_one_part_each(make_store: type[S3Store]) -> None:
    store = make_store(part_size=5 * MiB, parallel_uploads=2, part_memory=24 * MiB)
    counting = CountingBuffers(keep_bytes=0)
    store._buffers = counting
    data = os.urandom(21 * MiB)  # five parts
    store.put_stream("alone", io.BytesIO(data), len(data))
    assert counting.peak == 3  # alone: 2 parts in flight + the one being filled
    counting.peak = 0
    gate = threading.Barrier(4)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        jobs = [
            pool.submit(store.put_stream, f"many-{i}", Gated(data, gate), len(data))
            for i in range(4)
        ]
        for job in jobs:
            job.result()
    # 24 MiB over 4 transfers: one 5 MiB part each (the first ones were taken before all
    # four were in flight, which the gate holds back until they are).
    assert counting.peak <= 4
    assert counting.out == 0  # every buffer given back
    for i in range(4):
        assert store.get_bytes(f"many-{i}") == data
    assert store.get_bytes("alone") == data


@pytest.mark.parametrize(
    ("size", "known"),
    [
        (0, True),
        (1, False),
        (5 * MiB, True),  # exactly one part: one PUT
        (5 * MiB, False),  # exactly one part, length unknown: a multipart of one
        (10 * MiB, False),
        (12 * MiB + 3, True),
        (12 * MiB + 3, False),
    ],
)
@pytest.mark.parametrize("reader", [io.BytesIO, ReadOnly])
def test_every_size_and_reader_stores_the_stream_byte_for_byte(
    make_store: type[S3Store], size: int, known: bool, reader: type
) -> None:
    store = make_store(part_size=5 * MiB, parallel_uploads=2)
    data = os.urandom(size)
    store.put_stream("obj", reader(data), size if known else -1)
    assert store.get_bytes("obj") == data


@pytest.mark.parametrize(("announced", "sent"), [(MiB, MiB + 1), (11 * MiB, 11 * MiB + 1)])
def test_a_stream_longer_than_announced_is_refused_and_nothing_stored(
    make_store: type[S3Store], announced: int, sent: int
) -> None:
    store = make_store(part_size=5 * MiB, parallel_uploads=2)
    with pytest.raises(StoreError, match="expected"):
        store.put_stream("long", io.BytesIO(os.urandom(sent)), announced)
    assert store.get_bytes("long") is None
