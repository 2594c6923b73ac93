"""The hand-off from paho's network thread to the receive worker, bounded without waiting.

Any publisher on a subscribed topic decides how fast messages arrive; the application decides
how fast they leave. When the application falls behind, the worker waits for room in the
delivery queue (:class:`client.receive._ordering.Sequencer`), and without a bound here every PUBLISH
paho reads would pile up in memory behind it. paho's thread must never wait, though: it also
reads the PUBACKs of the application's own publishes, and an application that publishes from
its message loop would wait for them for ever. So:

* QoS 0 messages ("at most once") beyond the bound (`max_pending_deliveries` messages or
  `max_pending_bytes` of payload) are shed, counted in :attr:`InboundQueue.shed` and logged
  once per spell: a QoS 0 flood cannot grow the client's memory.
* QoS 1 and 2 messages are never dropped: they are admitted beyond the bound, and kept to it
  by flow control instead. The client acknowledges each only when the worker takes it
  (`MqttConnection.ack`) and asks the broker for at most `max_pending_deliveries`
  unacknowledged (MQTT 5 Receive Maximum; under 3.1.1 the broker's inflight limit), so a
  QoS 1 flood that the application does not read waits at the broker. mosquitto 2.0.11
  was measured releasing up to a window per acknowledgement (2.0.13 lists inflight quota
  fixes, its issue 2306): there the queue stops growing once the worker stops taking, but
  grows while the application reads, up to what the broker has queued for the client.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Generic, TypeVar

T = TypeVar("T")


class InboundQueue(Generic[T]):
    """A FIFO bounded by items and by weight (payload bytes) for what may be shed.

    Args:
        max_items: items held at most (an item that may not be shed is admitted anyway).
        max_weight: total weight held at most; an item alone is always admitted.
    """

    def __init__(self, max_items: int, max_weight: int) -> None:
        self.max_items = max_items
        self.max_weight = max_weight
        self._items: collections.deque[tuple[T, int]] = collections.deque()
        self._weight = 0
        self._wakeups = 0
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        #: items refused at the bound since the queue was made.
        self.shed = 0

    def _full(self, weight: int) -> bool:
        if not self._items:
            return False
        return len(self._items) >= self.max_items or self._weight + weight > self.max_weight

    def put(self, item: T, weight: int = 0, *, sheddable: bool) -> bool:
        """Append `item` unless the queue is full and it is `sheddable`; never waits.

        Returns:
            False when the item was shed.
        """
        with self._lock:
            if sheddable and self._full(weight):
                self.shed += 1
                return False
            self._items.append((item, weight))
            self._weight += weight
            self._ready.notify()
            return True

    def get(self, timeout: float) -> T | None:
        """The oldest item, or None when none arrived within `timeout` seconds (or on wake)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            wakeups = self._wakeups
            while not self._items:
                left = deadline - time.monotonic()
                if left <= 0 or self._wakeups != wakeups:
                    return None
                self._ready.wait(left)
            item, weight = self._items.popleft()
            self._weight -= weight
            return item

    def wake(self) -> None:
        """Make a waiting :meth:`get` return None now (the consumer is asked to stop)."""
        with self._lock:
            self._wakeups += 1
            self._ready.notify_all()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
