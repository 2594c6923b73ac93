"""The gateway side of discovery: keep a retained, expiring record on the discovery topic.

Every replica publishes the same bytes (the record serialises deterministically), so replicas
behind one URL never fight: whichever wrote last, the record is identical. Each publish
carries a Message Expiry Interval of several refresh periods; a replica never clears the
record on shutdown (others may still serve), so when the last gateway is gone the broker
lets the record expire and clients stop offloading.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future

from client.protocol import DiscoveryRecord

log = logging.getLogger("discovery")

# publish(topic, payload, retain, message_expiry_interval) -> future done when acknowledged
Publish = Callable[[str, bytes, bool, int], "Future[None]"]


class Advertiser:
    """Publish `record` on `topic` now, then every `interval` seconds, until stopped.

    Args:
        publish: how to publish (the gateway's broker connection); injected, so this module
            does no MQTT itself.
        record: what to advertise.
        topic: the discovery topic.
        interval: seconds between refreshes.
        expiry_factor: the Message Expiry Interval is `interval * expiry_factor` seconds.
    """

    def __init__(
        self,
        publish: Publish,
        record: DiscoveryRecord,
        *,
        topic: str,
        interval: float = 30.0,
        expiry_factor: int = 3,
    ) -> None:
        self._publish = publish
        self.record = record
        self.topic = topic
        self.interval = interval
        self.expiry = max(1, int(interval * expiry_factor + 0.999))
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.published = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="discovery-advertiser", daemon=True)
        self._thread.start()

    def refresh_now(self) -> None:
        """Publish at once (after a reconnect the broker may have lost the record)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def publish_once(self) -> bool:
        try:
            self._publish(self.topic, self.record.to_json(), True, self.expiry).result(timeout=10)
        except Exception as exc:  # the broker is down: retry at the next tick
            log.debug("discovery publish failed: %s", exc)
            return False
        self.published += 1
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            ok = self.publish_once()
            # Retry soon after a failure, otherwise wait for the next refresh.
            self._wake.wait(self.interval if ok else min(1.0, self.interval))
            self._wake.clear()
