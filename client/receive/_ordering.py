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
`max_pending_bytes` of their payloads are held in memory and at most `max_spool_bytes` in
spool files (placeholders naming one large payload again and again filled the disk while the
application read nothing: issue 26 item 6). The worker waits for room
before it takes the next message, so a slow reader or a stalled lane slows intake instead
of growing memory; a lane exists only while it holds a slot, so the number of lanes is
bounded by `max_pending` too.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core._message import Message, MessageError

Delivery = Message | MessageError

log = logging.getLogger("client")


@dataclass(eq=False, slots=True)
class Slot:
    """One message's place in its lane; `delivery` is set once it is ready."""

    lane: str
    weight: int
    disk: int = 0  # bytes of spool file the delivery holds
    topic: str = ""
    message_id: str | None = None
    url: str | None = None  # a placeholder's, while its payload is fetched
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
        max_spool_bytes: int | None = None,
        arrival_order: bool = False,
    ) -> None:
        self._deliveries = deliveries
        self._max_pending = max_pending
        self._max_bytes = max_pending_bytes
        self._max_disk = max_spool_bytes
        self._disk = 0
        self._disk_full_logged = False
        self._arrival = arrival_order
        self._lanes: dict[str, deque[Slot]] = {}
        self._count = 0
        self._bytes = 0
        # Weights (memory, disk) and `on_consumed` of each delivery handed to the application,
        # for `consumed`.
        self._queued: dict[int, tuple[int, int, Callable[[], None] | None]] = {}
        self._cond = threading.Condition()

    @property
    def outstanding(self) -> tuple[int, int]:
        """(deliveries, bytes) outstanding now."""
        with self._cond:
            return self._count, self._bytes

    @property
    def spooled(self) -> int:
        """Bytes of spool files that outstanding deliveries hold (or have reserved)."""
        with self._cond:
            return self._disk

    def _room(self, weight: int, disk: int) -> bool:
        if not self._count:
            return True  # one message is always admitted
        if self._count >= self._max_pending or self._bytes + weight > self._max_bytes:
            return False
        if self._max_disk is not None and self._disk + disk > self._max_disk:
            if not self._disk_full_logged:
                self._disk_full_logged = True
                log.warning(
                    "spool full (%d bytes held, max_spool_bytes %d): waiting for the "
                    "application to take messages",
                    self._disk,
                    self._max_disk,
                )
            return False
        self._disk_full_logged = False
        return True

    def reserve(
        self,
        topic: str,
        weight: int,
        stop: threading.Event | None = None,
        *,
        disk: int = 0,
        message_id: str | None = None,
        url: str | None = None,
        on_consumed: Callable[[], None] | None = None,
    ) -> Slot | None:
        """Take the next place in `topic`'s lane, waiting for room within the bounds.

        Args:
            topic: the message's topic.
            weight: payload bytes the delivery will hold in memory (0 when spooled).
            stop: give up (None) once this is set.
            disk: bytes of spool file the delivery will hold (`max_spool_bytes` counts them).
            message_id: the message's id, when known (named by :meth:`unfinished`).
            url: the payload URL, for a placeholder (named by :meth:`unfinished`).
            on_consumed: called (outside the lock) when the application takes the delivery
                or the slot is skipped: a persistent session acknowledges the message then.
        """
        lane = "" if self._arrival else topic
        with self._cond:
            while not self._room(weight, disk):
                if stop is not None and stop.is_set():
                    return None
                self._cond.wait(0.25)
            slot = Slot(lane, weight, disk, topic, message_id, url, on_consumed=on_consumed)
            self._lanes.setdefault(lane, deque()).append(slot)
            self._count += 1
            self._bytes += weight
            self._disk += disk
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
                weight, disk = _weight(delivery), _on_disk(delivery)
                self._bytes += weight - slot.weight  # the real sizes, now they are known
                self._disk += disk - slot.disk
                slot.weight, slot.disk = weight, disk
            lane = self._lanes.get(slot.lane)
            while lane and (lane[0].delivery is not None or lane[0].skipped):
                head = lane.popleft()
                if head.skipped:
                    self._release(head.weight, head.disk)
                    if head.on_consumed is not None:
                        done.append(head.on_consumed)
                else:
                    assert head.delivery is not None
                    self._queued[id(head.delivery)] = (head.weight, head.disk, head.on_consumed)
                    self._deliveries.put(head.delivery)
            if lane is not None and not lane:
                del self._lanes[slot.lane]
        for callback in done:
            callback()

    def unfinished(self) -> list[Slot]:
        """Placeholders whose payload is still being fetched (or waits for a fetch thread)."""
        with self._cond:
            return [
                slot
                for lane in self._lanes.values()
                for slot in lane
                if slot.url is not None and slot.delivery is None and not slot.skipped
            ]

    def consumed(self, delivery: Delivery) -> None:
        """The application took `delivery` from the queue: its room is free again."""
        with self._cond:
            queued = self._queued.pop(id(delivery), None)
            if queued is None:
                return
            self._release(queued[0], queued[1])
        if queued[2] is not None:
            queued[2]()

    def _release(self, weight: int, disk: int) -> None:
        self._count -= 1
        self._bytes -= weight
        self._disk -= disk
        self._cond.notify_all()


def _weight(delivery: Delivery) -> int:
    """Bytes a delivery holds in memory (a spooled payload holds none)."""
    if isinstance(delivery, Message) and delivery.body.path is None:
        return delivery.body.size
    return 0


def _on_disk(delivery: Delivery) -> int:
    """Bytes of spool file a delivery holds (an in-memory payload holds none)."""
    if isinstance(delivery, Message) and delivery.body.path is not None:
        return delivery.body.size
    return 0


class FetchPool:
    """A fixed set of daemon threads running fetch jobs, at most `per_key` of them per key.

    The key is the origin a placeholder points at: four placeholders at one slow origin
    (a publisher may point them at any allow-listed origin that trickles) may hold at most
    `per_key` threads, and the rest keep fetching from every other origin (issue 26 item 4).
    A job whose key is at its limit waits in the queue while later jobs for other keys run;
    jobs of one key start in the order they came. The queue's length is bounded by the
    :class:`Sequencer` (every job holds a reserved slot).

    Args:
        workers: number of threads (the `fetch_concurrency` bound).
        per_key: jobs of one key running at once (default: all workers).
        name: thread name prefix.
    """

    def __init__(
        self, workers: int, per_key: int | None = None, name: str = "offload-fetch"
    ) -> None:
        self._per_key = per_key or workers
        self._jobs: deque[tuple[str, Callable[[], None]]] = deque()
        self._running: dict[str, int] = {}
        self._closing = False
        self._cond = threading.Condition()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, job: Callable[[], None], key: str = "") -> None:
        """Run `job` on a pool thread (it must not raise: it fills its slot either way).

        Args:
            job: the fetch.
            key: what the per-key limit counts (the origin fetched from).
        """
        with self._cond:
            self._jobs.append((key, job))
            self._cond.notify()

    @property
    def running(self) -> dict[str, int]:
        """Jobs running now, per key."""
        with self._cond:
            return dict(self._running)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the threads after the jobs already queued."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)

    def _take(self) -> tuple[str, Callable[[], None]] | None:
        """The first queued job whose key is under its limit (waits for one); None: closed."""
        with self._cond:
            while True:
                for index, (key, job) in enumerate(self._jobs):
                    if self._running.get(key, 0) < self._per_key:
                        del self._jobs[index]
                        self._running[key] = self._running.get(key, 0) + 1
                        return key, job
                if self._closing and not self._jobs:
                    return None
                self._cond.wait()

    def _run(self) -> None:
        while (taken := self._take()) is not None:
            key, job = taken
            try:
                job()
            finally:
                with self._cond:
                    left = self._running[key] - 1
                    if left:
                        self._running[key] = left
                    else:
                        del self._running[key]
                    self._cond.notify_all()
