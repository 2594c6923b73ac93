"""Bounded, expiring bookkeeping: failed-attempt limits and the used-sid set. No I/O.

Both are fed from the network, so both have a hard size cap and forget by time; neither can
grow without bound however much junk arrives. Time comes from an injected clock.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable


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
        now = self._clock()
        with self._lock:
            entry = self._counts.get(key)
            if entry is None:
                return None
            start, count = entry
            if now - start >= self._window:
                del self._counts[key]
                return None
            if count < self._limit:
                return None
            return max(1, math.ceil(start + self._window - now))

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
