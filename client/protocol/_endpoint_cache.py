"""The client's view of the discovery topic: the current record and when it expires. Pure.

The client feeds every message it receives on the discovery topic (retained or live) into
:class:`EndpointCache`; the cache keeps the latest usable record until the message's Message
Expiry Interval (the broker's *remaining* interval at delivery, MQTT-3.3.2-6) runs out. An empty
payload (the retained record was deleted) or a malformed one means "no offload available":
a bad record must never leave an older endpoint in place.

No clock of its own and no locking: callers pass `now` (monotonic seconds) and serialise access.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._discovery import DiscoveryRecord
from ._errors import MalformedDiscoveryRecord


@dataclass(frozen=True, slots=True)
class CachedRecord:
    """A record and the monotonic time after which it no longer counts (None: never)."""

    record: DiscoveryRecord
    expires_at: float | None

    def valid(self, now: float) -> bool:
        return self.expires_at is None or now < self.expires_at


class EndpointCache:
    """Latest discovery record, with expiry."""

    __slots__ = ("_current", "last_error", "updates")

    def __init__(self) -> None:
        self._current: CachedRecord | None = None
        self.last_error: MalformedDiscoveryRecord | None = None
        #: How many discovery messages were fed (lets a waiter know one has arrived).
        self.updates = 0

    def feed(
        self, payload: bytes, *, expiry_interval: int | None, now: float
    ) -> DiscoveryRecord | None:
        """Take one discovery message; returns the record now in force, if any.

        Args:
            payload: the message payload; empty means the retained record was cleared.
            expiry_interval: the message's remaining Message Expiry Interval in seconds,
                None when it has none.
            now: current monotonic time in seconds.
        """
        self.updates += 1
        self.last_error = None
        if not payload:
            self._current = None
            return None
        try:
            record = DiscoveryRecord.from_json(payload)
        except MalformedDiscoveryRecord as exc:
            self._current = None
            self.last_error = exc
            return None
        expires = None if expiry_interval is None else now + max(expiry_interval, 0)
        self._current = CachedRecord(record, expires)
        return record if self._current.valid(now) else None

    def current(self, now: float) -> DiscoveryRecord | None:
        """The record in force at `now`, None when there is none or it expired.

        Args:
            now: current monotonic time in seconds.
        """
        if self._current is None or not self._current.valid(now):
            return None
        return self._current.record

    def clear(self) -> None:
        """Forget the record (e.g. the discovery topic was unsubscribed)."""
        self._current = None
