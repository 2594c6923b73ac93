"""Per-topic delivery order with concurrent fetches, inside fixed bounds.

MQTT promises order per topic, not across topics, so a delivery is handed to the
application as soon as every earlier message on its own topic has been: a placeholder
whose payload is still downloading holds back later messages on its topic only, and the
100-byte telemetry on another topic goes straight through. `ordering = "arrival"` keys
every message to one lane instead: strict arrival order, as before concurrent fetches.

Every message takes a :class:`Slot` in its lane when it arrives (on the receiver's worker
thread), in arrival order; the slot is filled by whoever produced the delivery (the worker
for direct messages, chunk reassembly results and errors; a fetch thread for placeholders)
and released from the head of its lane, in order, into the delivery queue.

Bounds, because a hostile publisher on a subscribed topic chooses how many messages arrive
and on how many topics: at most `max_pending` deliveries exist at once (reserved, being
fetched, waiting behind their lane's head or queued for the application), and at most
`max_pending_bytes` of their payloads are held in memory. The worker waits for room
before it takes the next message, so a slow reader or a stalled lane slows intake instead
of growing memory; a lane exists only while it holds a slot, so the number of lanes is
bounded by `max_pending` too.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ._message import Message, MessageError

Delivery = Message | MessageError


@dataclass(eq=False, slots=True)
class Slot:
    """One message's place in its lane; `delivery` is set once it is ready."""

    lane: str
    weight: int
    delivery: Delivery | None = None
    skipped: bool = False
    released: bool = field(default=False)
    #: called once the application took the delivery, or when it is skipped (its ack).
    on_consumed: Callable[[], None] | None = None


class Sequencer:
    """Orders deliveries per lane and bounds how many (and how many bytes) are outstanding.

    Args:
        deliveries: the queue the application reads.
        max_pending: most deliveries outstanding at once.
        max_pending_bytes: most payload bytes in memory outstanding at once (one message is
            always admitted when nothing else is outstanding, whatever its size).
        arrival_order: one lane for every topic (strict arrival order).
    """

    def __init__(
        self,
        deliveries: queue.SimpleQueue[Delivery | object],
        *,
        max_pending: int,
        max_pending_bytes: int,
        arrival_order: bool = False,
    ) -> None:
        self._deliveries = deliveries
        self._max_pending = max_pending
        self._max_bytes = max_pending_bytes
        self._arrival = arrival_order
        self._lanes: dict[str, deque[Slot]] = {}
        self._count = 0
        self._bytes = 0
        # Weight and `on_consumed` of each delivery handed to the application (`consumed`).
        self._queued: dict[int, tuple[int, Callable[[], None] | None]] = {}
        self._cond = threading.Condition()

    @property
    def outstanding(self) -> tuple[int, int]:
        """(deliveries, bytes) outstanding now."""
        with self._cond:
            return self._count, self._bytes

    def reserve(
        self,
        topic: str,
        weight: int,
        stop: threading.Event | None = None,
        on_consumed: Callable[[], None] | None = None,
    ) -> Slot | None:
        """Take the next place in `topic`'s lane, waiting for room within the bounds.

        Args:
            topic: the message's topic.
            weight: payload bytes the delivery will hold in memory (0 when spooled).
            stop: give up (None) once this is set.
            on_consumed: called (outside the lock) when the application takes the delivery
                or the slot is skipped: a persistent session acknowledges the message then.
        """
        lane = "" if self._arrival else topic
        with self._cond:
            while self._count and (
                self._count >= self._max_pending or self._bytes + weight > self._max_bytes
            ):
                if stop is not None and stop.is_set():
                    return None
                self._cond.wait(0.25)
            slot = Slot(lane, weight, on_consumed=on_consumed)
            self._lanes.setdefault(lane, deque()).append(slot)
            self._count += 1
            self._bytes += weight
            return slot

    def fill(self, slot: Slot, delivery: Delivery | None) -> None:
        """Set a slot's delivery (None: nothing to deliver) and release what is ready.

        Args:
            slot: a slot from :meth:`reserve`.
            delivery: the message or error; None drops the slot (e.g. a skipped message).
        """
        done: list[Callable[[], None]] = []
        with self._cond:
            if delivery is None:
                slot.skipped = True
            else:
                slot.delivery = delivery
                weight = _weight(delivery)
                self._bytes += weight - slot.weight  # the real size, now it is known
                slot.weight = weight
            lane = self._lanes.get(slot.lane)
            while lane and (lane[0].delivery is not None or lane[0].skipped):
                head = lane.popleft()
                if head.skipped:
                    self._release(head.weight)
                    if head.on_consumed is not None:
                        done.append(head.on_consumed)
                else:
                    assert head.delivery is not None
                    self._queued[id(head.delivery)] = (head.weight, head.on_consumed)
                    self._deliveries.put(head.delivery)
            if lane is not None and not lane:
                del self._lanes[slot.lane]
        for callback in done:
            callback()

    def consumed(self, delivery: Delivery) -> None:
        """The application took `delivery` from the queue: its room is free again."""
        with self._cond:
            queued = self._queued.pop(id(delivery), None)
            if queued is None:
                return
            self._release(queued[0])
        if queued[1] is not None:
            queued[1]()

    def _release(self, weight: int) -> None:
        self._count -= 1
        self._bytes -= weight
        self._cond.notify_all()


def _weight(delivery: Delivery) -> int:
    """Bytes a delivery holds in memory (a spooled payload holds none)."""
    if isinstance(delivery, Message) and delivery.body.path is None:
        return delivery.body.size
    return 0


class FetchPool:
    """A fixed set of daemon threads running fetch jobs (the `fetch_concurrency` bound).

    Jobs wait in a queue whose length the :class:`Sequencer`'s bound already limits (every
    job holds a reserved slot).

    Args:
        workers: number of threads.
        name: thread name prefix.
    """

    def __init__(self, workers: int, name: str = "offload-fetch") -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` on a pool thread (it must not raise: it fills its slot either way)."""
        self._jobs.put(job)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the threads after the jobs already queued."""
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()
