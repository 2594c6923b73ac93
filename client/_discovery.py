"""The client's live view of the discovery topic: fed on paho's thread, read by every other.

Whoever can write the discovery topic writes what this module reads, so :meth:`feed` never
raises (paho stops its loop on a callback exception) and a bad record is ignored with one
warning per spell of bad records, not one per re-delivery: a retained one comes back on
every re-subscription. A bad or refused record also removes the endpoint in force: a spoofed
record must not leave an older endpoint in place either. A broker that refuses the
subscription itself (a role without the discovery topic) is said once too, and then nobody
waits for a record.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future

from .config._settings import ClientSettings
from .mqtt._acks import SubscriptionRefused
from .protocol import DiscoveryRecord, EndpointCache

log = logging.getLogger("client")


class DiscoveryView:
    """The record in force, and a way to wait briefly for it after a (re)subscription.

    Args:
        settings: `discovery_wait` and `discovery_allowlist` are read from it.
    """

    def __init__(self, settings: ClientSettings) -> None:
        self._settings = settings
        self._cache = EndpointCache()
        self._cond = threading.Condition()
        self._since = 0.0
        self._seen = False
        self._warned = False
        self._refused: str | None = None

    @property
    def refused(self) -> str | None:
        """Why the broker refused the subscription to the discovery topic, if it did."""
        return self._refused

    def subscribed(self, answer: Future[None]) -> None:
        """The discovery subscription's SUBACK came (paho's thread: never raises): a
        refusal is said once, and nobody waits for a record that cannot come."""
        failure = answer.exception() if not answer.cancelled() else None
        if not isinstance(failure, SubscriptionRefused):
            return  # granted, or the connection went first (the next one subscribes again)
        topic = self._settings.discovery_topic
        with self._cond:
            first = self._refused is None
            self._refused = f"the broker refused the subscription to {topic!r} ({failure.reason})"
            self._seen = True
            self._cond.notify_all()
        if first:
            log.warning(
                "%s: no gateway can be discovered, so a message over the broker's packet "
                "limit goes in chunks and a placeholder cannot be fetched; give this user "
                "subscribe access to %r (docs/authentication.md) or name the gateway "
                "(--endpoint, OFFLOAD_ENDPOINT)",
                self._refused,
                topic,
            )

    def current(self) -> DiscoveryRecord | None:
        """The record in force now, if any."""
        with self._cond:
            return self._cache.current(time.monotonic())

    def resubscribed(self) -> None:
        """The broker is about to re-send the retained record: let waiters wait for it."""
        with self._cond:
            self._since = time.monotonic()
            self._seen = False

    def wait(self, timeout: float) -> DiscoveryRecord | None:
        """Wait up to `timeout` seconds for a record; the record or None."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                record = self._cache.current(time.monotonic())
                left = deadline - time.monotonic()
                if record is not None or left <= 0 or self._refused is not None:
                    return record
                self._cond.wait(left)

    def settled(self) -> DiscoveryRecord | None:
        """The record, waiting up to `discovery_wait` after a (re)subscription for the first.

        Used before a large publish and before trusting a fetch: a retained placeholder may
        arrive just before the retained record it points at.
        """
        with self._cond:
            while True:
                now = time.monotonic()
                record = self._cache.current(now)
                left = self._since + self._settings.discovery_wait - now
                if record is not None or self._seen or left <= 0:
                    return record
                self._cond.wait(left)

    # -- the endpoint in force: configured, else discovered ----------------------------------

    def endpoint(self) -> str | None:
        """The configured endpoint, else the current record's (or None)."""
        if self._settings.endpoint is not None:
            return self._settings.endpoint
        record = self.current()
        return record.endpoint if record else None

    def settled_endpoint(self) -> str | None:
        """The configured endpoint, else the record's once settled (see :meth:`settled`).

        Also the trusted origin for fetches: a retained placeholder may arrive just before
        the retained discovery record it points at.
        """
        if self._settings.endpoint is not None:
            return self._settings.endpoint
        record = self.settled()
        return record.endpoint if record else None

    def direct_store(self) -> str | None:
        """The store origin the current record advertises for direct transfers, if any.

        Only a discovered endpoint's: with a configured endpoint the client knows no
        record of that gateway's and uploads through it.
        """
        if self._settings.endpoint is not None:
            return None
        record = self.current()
        return record.direct_store if record else None

    def wait_endpoint(self, timeout: float) -> str | None:
        """Wait up to `timeout` seconds for a record; its endpoint, else the configured one."""
        record = self.wait(timeout)
        return record.endpoint if record else self._settings.endpoint

    def feed(self, payload: bytes, expiry_interval: int | None) -> None:
        """Take one message from the discovery topic (paho's thread: never raises).

        Args:
            payload: the message payload, as anyone who may write the topic wrote it.
            expiry_interval: its remaining Message Expiry Interval, if any.
        """
        try:
            self._feed(payload, expiry_interval)
        except Exception:  # a bug must not stop paho's loop: log it and carry on
            log.exception("ignoring a discovery record that could not be handled")

    def _feed(self, payload: bytes, expiry_interval: int | None) -> None:
        settings = self._settings
        with self._cond:
            record = self._cache.feed(
                payload, expiry_interval=expiry_interval, now=time.monotonic()
            )
            refused = record is not None and not settings.endpoint_allowed(record.endpoint)
            if refused:
                self._cache.clear()
            self._seen = True
            error = self._cache.last_error
            self._cond.notify_all()
        if error is not None:
            self._warn("ignoring malformed discovery record: %s", str(error)[:300])
        elif refused:
            assert record is not None
            self._warn(
                "ignoring discovery record: endpoint %s is not in discovery_allowlist %s",
                record.endpoint,
                ", ".join(settings.discovery_allowlist),
            )
        else:
            # An empty payload (record deleted) neither ends nor starts a bad spell.
            self._warned = record is None and self._warned
            log.debug("discovery record: %s", record)

    def _warn(self, text: str, *args: object) -> None:
        if self._warned:
            log.debug(text, *args)
            return
        self._warned = True
        log.warning(text, *args)
