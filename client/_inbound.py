"""The hand-off from paho's network thread to the receive worker, bounded.

Any publisher on a subscribed topic decides how fast messages arrive; the application decides
how fast they leave. When the application falls behind, the worker waits for room in the
delivery queue (:class:`client._ordering.Sequencer`), and without a bound here every PUBLISH
paho reads would pile up in memory behind it. So this queue holds at most
`max_pending_deliveries` messages and `max_pending_bytes` payload bytes (one message is
always admitted), and at the bound paho's thread waits for room: it then reads nothing more
from the socket, TCP pushes back on the broker, and for QoS 1 and 2 nothing is acknowledged
that the client does not hold. A broker that stops hearing from a client for 1.5 keep-alive
periods closes the connection; the persistent session then redelivers what was not
acknowledged. :meth:`close` wakes a waiting thread, so closing never hangs on a full queue.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Generic, TypeVar

T = TypeVar("T")


class Closed(Exception):
    """The queue was closed while a producer waited for room."""


class InboundQueue(Generic[T]):
    """A FIFO bounded by items and by weight (payload bytes); `put` waits for room.

    Args:
        max_items: items held at most.
        max_weight: total weight held at most; an item alone is always admitted.
    """

    def __init__(self, max_items: int, max_weight: int) -> None:
        self.max_items = max_items
        self.max_weight = max_weight
        self._items: collections.deque[tuple[T, int]] = collections.deque()
        self._weight = 0
        self._closed = False
        self._wakeups = 0
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._ready = threading.Condition(self._lock)
        #: how many times a producer had to wait for room (observability and tests).
        self.waits = 0

    def _fits(self, weight: int) -> bool:
        if not self._items:
            return True
        return len(self._items) < self.max_items and self._weight + weight <= self.max_weight

    def put(self, item: T, weight: int = 0) -> None:
        """Append `item`, waiting while the queue is full.

        Raises:
            Closed: the queue was closed (before or while waiting); the item is dropped.
        """
        with self._lock:
            if not self._closed and not self._fits(weight):
                self.waits += 1
                while not self._closed and not self._fits(weight):
                    self._room.wait()
            if self._closed:
                raise Closed
            self._items.append((item, weight))
            self._weight += weight
            self._ready.notify()

    def get(self, timeout: float) -> T | None:
        """The oldest item, or None when none arrived within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            wakeups = self._wakeups
            while not self._items:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed or self._wakeups != wakeups:
                    return None
                self._ready.wait(left)
            item, weight = self._items.popleft()
            self._weight -= weight
            self._room.notify_all()
            return item

    def wake(self) -> None:
        """Make a waiting :meth:`get` return None now (the consumer is asked to stop)."""
        with self._lock:
            self._wakeups += 1
            self._ready.notify_all()

    def close(self) -> None:
        """Refuse further items and wake every waiting producer and consumer."""
        with self._lock:
            self._closed = True
            self._room.notify_all()
            self._ready.notify_all()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
