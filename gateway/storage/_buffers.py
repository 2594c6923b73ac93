"""Part buffers for proxied multipart uploads: sized from the load, reused, bounded.

One upload alone gets the configured part size and parts in flight (8 MiB, 2: what keeps a
single upload at the store's pace). Twenty at once each holding three 8 MiB parts was 38
MiB of gateway memory per transfer (issue 31), most of it buffers that the store drained
more slowly than the clients filled them anyway. So the uploads share a memory budget
(`OFFLOAD_S3_PART_MEMORY`): each takes `budget / transfers in flight`, and within that share
the most parts it can, never fewer than one part of S3's 5 MiB minimum. Under load an
upload therefore reads a part, sends it, then reads the next (the body keeps arriving into
the pipe meanwhile); alone it overlaps as before. Parts in flight are decided again before
each part, so an upload that started alone gives memory back when others arrive.

The buffers themselves are `bytearray`s kept in a free list (`PartBuffers`) instead of
allocated per part: a new 8 MiB buffer is a fresh mapping whose 2,048 pages fault in on
first write and unmap on free (system CPU), and the list is bounded so that an idle
gateway keeps at most a few.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

MIN_PART = 5 * 1024 * 1024  # S3's minimum size of every part but the last


@dataclass(frozen=True)
class Plan:
    """How many part buffers one upload may hold right now (one being filled included)."""

    buffers: int

    @property
    def in_flight(self) -> int:
        """Parts sent at once: all buffers but the one being filled, or one with a single
        buffer (then filling and sending take turns)."""
        return max(1, self.buffers - 1)


class Load:
    """Transfers in flight through the store (uploads and downloads), counted by the store."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    @contextlib.contextmanager
    def one(self) -> Iterator[None]:
        with self._lock:
            self._count += 1
        try:
            yield
        finally:
            with self._lock:
                self._count -= 1


def plan(*, part_size: int, parallel: int, budget: int, transfers: int) -> Plan:
    """The buffers an upload of `part_size` parts may hold with `transfers` in flight.

    Alone (or while the budget allows): `parallel` parts in flight plus the one being
    filled, as configured. Else as many as `budget / transfers` holds, at least one.

    >>> plan(part_size=8 << 20, parallel=2, budget=128 << 20, transfers=1).buffers
    3
    >>> plan(part_size=8 << 20, parallel=2, budget=128 << 20, transfers=20).buffers
    1
    """
    share = budget // max(1, transfers)
    return Plan(max(1, min(parallel + 1, share // max(1, part_size))))


def part_size_under_load(base: int, *, budget: int, transfers: int) -> int:
    """The part size a new upload starts with: `base` while its share of the budget holds
    two such parts (one sent while the next fills), else the whole MiB that lets two fit,
    never under S3's 5 MiB.

    >>> part_size_under_load(8 << 20, budget=128 << 20, transfers=1) >> 20
    8
    >>> part_size_under_load(8 << 20, budget=128 << 20, transfers=9) >> 20
    7
    >>> part_size_under_load(8 << 20, budget=128 << 20, transfers=20) >> 20
    5
    """
    half = budget // max(1, transfers) // 2
    return max(MIN_PART, min(base, half >> 20 << 20))


class PartBuffers:
    """A free list of part buffers; at most `keep_bytes` of them are kept while unused.

    Args:
        keep_bytes: the most bytes of idle buffers kept for reuse (the rest are freed).
    """

    def __init__(self, keep_bytes: int) -> None:
        self._keep = keep_bytes
        self._lock = threading.Lock()
        self._free: dict[int, list[bytearray]] = {}
        self._idle = 0

    @property
    def idle_bytes(self) -> int:
        return self._idle

    def take(self, size: int) -> bytearray:
        """A buffer of exactly `size` bytes (its content is whatever it held before)."""
        with self._lock:
            free = self._free.get(size)
            if free:
                self._idle -= size
                return free.pop()
        return bytearray(size)

    def give(self, buffer: bytearray) -> None:
        """Return a buffer nobody uses any more (kept if there is room, else freed)."""
        size = len(buffer)
        with self._lock:
            if self._idle + size <= self._keep:
                self._free.setdefault(size, []).append(buffer)
                self._idle += size
