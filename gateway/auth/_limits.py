"""Bounded, expiring bookkeeping: failed-attempt limits, attempts paid ahead and the used-sid
set. No I/O.

All are fed from the network, so all have a hard size cap and forget by time; none can
grow without bound however much junk arrives. Time comes from an injected clock.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass


class FailureLimiter:
    """Counts failed attempts per key in fixed windows and blocks a key that has too many.

    At most ``capacity`` keys are tracked; beyond that the least recently touched key is
    forgotten. That lets someone flooding with fresh keys reset an old key's count, which is
    why the gateway limits per address and per user at once.
    """

    def __init__(
        self, *, limit: int, window: float, capacity: int, clock: Callable[[], float]
    ) -> None:
        """Set up an empty limiter.

        Args:
            limit: failures allowed per key and window; the next attempt is refused.
            window: seconds a window lasts, counted from its first failure.
            capacity: most keys tracked at once.
            clock: seconds, monotonic or wall clock.
        """
        if limit < 1 or window <= 0 or capacity < 1:
            raise ValueError("limit, window and capacity must be positive")
        self._limit = limit
        self._window = window
        self._capacity = capacity
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def retry_after(self, key: str) -> int | None:
        """Whole seconds until ``key`` may try again, or None when it is not blocked.

        Args:
            key: e.g. ``"user:alice"`` or ``"addr:192.0.2.1"``.
        """
        return wait_below(self._limit, self._clock(), [self.standing(key)])

    def standing(self, key: str) -> tuple[int, float]:
        """``key``'s failures in its window and when the window ends; (0, 0.0) without one.

        Args:
            key: as for :meth:`retry_after`.
        """
        now = self._clock()
        with self._lock:
            entry = self._counts.get(key)
            if entry is None:
                return 0, 0.0
            start, count = entry
            if now - start >= self._window:
                del self._counts[key]
                return 0, 0.0
            return count, start + self._window

    def failed(self, key: str) -> None:
        """Count one failed attempt for ``key``."""
        now = self._clock()
        with self._lock:
            start, count = self._counts.pop(key, (now, 0))
            if now - start >= self._window:
                start, count = now, 0
            self._counts[key] = (start, count + 1)
            while len(self._counts) > self._capacity:
                self._counts.popitem(last=False)

    def reset(self, key: str) -> None:
        """Forget ``key`` (after a success)."""
        with self._lock:
            self._counts.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._counts)


def wait_below(limit: int, now: float, standings: Sequence[tuple[int, float]]) -> int | None:
    """Whole seconds until the counts add up to less than ``limit``, None when they do now.

    Args:
        limit: the sum that blocks.
        now: the clock's reading.
        standings: (count, the time it drops to 0) each, as `FailureLimiter.standing` gives.
    """
    live = sorted((end, count) for count, end in standings if end > now)
    total = sum(count for _, count in live)
    if total < limit:
        return None
    for end, count in live:  # each window over in turn, the earliest first
        total -= count
        if total < limit:
            return max(1, math.ceil(end - now))
    raise AssertionError("unreachable: with every window over nothing is counted")


@dataclass(slots=True)
class _Charged:
    generation: int  # which window of its key: tickets name the window they were charged in
    start: float
    count: int = 0


class Charges:
    """Attempts paid ahead: counted per key in fixed windows, each under a ticket, until a
    later step of the same attempt (same key, same ticket) settles it.

    A settle that finds nothing owed on its ticket leaves a credit there (at most
    ``credit``), which the ticket's next charge uses up: an attempt whose steps reach two
    processes (replicas, workers) settles on one what it was charged on the other, and
    the two even out. A ticket is good for its key's window only; a settle alone opens no
    window (only what was charged in one can be taken back).

    Kept apart from `FailureLimiter`'s keys so that charges, which every login under way
    makes, never push out the failures of a key (each map forgets its least recently
    touched entry beyond ``capacity``). Thread-safe.
    """

    def __init__(
        self, *, window: float, capacity: int, credit: int, clock: Callable[[], float]
    ) -> None:
        """Set up with nothing charged.

        Args:
            window: seconds a key's window lasts, from its first charge.
            capacity: most keys, and most tickets, tracked at once.
            credit: most settles a ticket may hold ahead of its charges.
            clock: seconds, monotonic or wall clock.
        """
        if window <= 0 or capacity < 1 or credit < 0:
            raise ValueError("window and capacity must be positive, credit at least 0")
        self._window = window
        self._capacity = capacity
        self._credit = credit
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: OrderedDict[str, _Charged] = OrderedDict()
        # (key, ticket) -> (the key's window generation, charges owed; below 0: credit)
        self._tickets: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()
        self._generations = 0

    def charge(self, key: str, ticket: str) -> None:
        """Count one attempt for ``key`` paid ahead under ``ticket`` (or use its credit)."""
        with self._lock:
            entry = self._window_of(key, open_one=True)
            assert entry is not None
            owed = self._owed(key, ticket, entry)
            if owed >= 0:
                entry.count += 1
            self._keep(key, ticket, entry, owed + 1)

    def settle(self, key: str, ticket: str) -> None:
        """Take back one charge of ``ticket`` under ``key``: its attempt took the next step."""
        with self._lock:
            entry = self._window_of(key, open_one=False)
            if entry is None:
                return
            owed = self._owed(key, ticket, entry)
            if owed > 0:
                entry.count -= 1
            self._keep(key, ticket, entry, max(owed - 1, -self._credit))

    def standing(self, key: str) -> tuple[int, float]:
        """``key``'s charges in its window and when the window ends; (0, 0.0) without one."""
        with self._lock:
            entry = self._window_of(key, open_one=False)
            return (entry.count, entry.start + self._window) if entry else (0, 0.0)

    def __len__(self) -> int:
        with self._lock:
            return len(self._counts)

    @property
    def tickets(self) -> int:
        """Tickets tracked."""
        with self._lock:
            return len(self._tickets)

    def _window_of(self, key: str, *, open_one: bool) -> _Charged | None:
        now = self._clock()
        entry = self._counts.pop(key, None)
        if entry is not None and now - entry.start >= self._window:
            entry = None
        if entry is None and open_one:
            self._generations += 1
            entry = _Charged(self._generations, now)
        if entry is not None:
            self._counts[key] = entry
            while len(self._counts) > self._capacity:
                self._counts.popitem(last=False)
        return entry

    def _owed(self, key: str, ticket: str, entry: _Charged) -> int:
        kept = self._tickets.pop((key, ticket), None)
        return kept[1] if kept is not None and kept[0] == entry.generation else 0

    def _keep(self, key: str, ticket: str, entry: _Charged, owed: int) -> None:
        if owed:
            self._tickets[(key, ticket)] = (entry.generation, owed)
            while len(self._tickets) > self._capacity:
                self._tickets.popitem(last=False)


class ReplayGuard:
    """The sids whose final message this process has accepted, until they expire.

    Only verified finals are recorded, so junk cannot fill it. When ``capacity`` unexpired
    sids are held it refuses new ones (:meth:`claim` answers a wait) rather than forget one
    early, which would reopen a replay window.
    """

    def __init__(self, *, capacity: int, clock: Callable[[], float]) -> None:
        """Set up an empty guard.

        Args:
            capacity: most sids held at once.
            clock: the clock the sid expiry times are on.
        """
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self._capacity = capacity
        self._clock = clock
        self._lock = threading.Lock()
        self._used: OrderedDict[str, float] = OrderedDict()

    def _purge(self, now: float) -> None:
        # Sids are claimed in about the order they were issued, all with one lifetime, so
        # the oldest claims expire first; a late stray only stays a little longer.
        while self._used:
            key, expires = next(iter(self._used.items()))
            if expires > now:
                break
            del self._used[key]

    def seen(self, key: str) -> bool:
        """Whether ``key`` was already claimed and has not expired."""
        with self._lock:
            self._purge(self._clock())
            return key in self._used

    def claim(self, key: str, expires: float) -> bool | int:
        """Record ``key`` as used until ``expires``.

        Returns:
            True when claimed, False when it was already used (a replay), or the whole
            seconds to wait when the guard is full.
        """
        now = self._clock()
        with self._lock:
            self._purge(now)
            if key in self._used:
                return False
            if len(self._used) >= self._capacity:
                oldest = next(iter(self._used.values()))
                return max(1, math.ceil(oldest - now))
            self._used[key] = expires
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._used)
