"""Pure helpers of the MQTT adapter (:mod:`client.mqtt._paho`): acks and pre-queue checks.

No paho here: acknowledgement bookkeeping is plain threading, and the check that keeps a
PUBLISH a broker would disconnect us for out of paho's queue is pure.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ..core._exceptions import ConnectionFailed, ProtocolError, PublishRejected
from ..protocol import PublishProperties, Topic
from ..protocol._props import publish_properties_problem

#: MQTT's remaining-length cap, less room for the fixed and variable headers.
_MAX_PAYLOAD = 268_435_455 - 65_535 * 2


class InvalidPublish(ProtocolError):
    """A publish that breaks the MQTT rules a broker enforces; refused before it is queued."""


class SubscriptionRefused(ConnectionFailed):
    """The broker answered a SUBSCRIBE with a failure (``reason``: its reason code's name,
    e.g. "Not authorized"), as against a connection that went away before the SUBACK."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"subscription refused: {reason}")
        self.reason = reason


def publish_problem(
    topic: str, payload: bytes, qos: int, properties: PublishProperties | None
) -> str | None:
    """Why a broker would refuse (and disconnect us for) this PUBLISH, or None. Pure."""
    try:
        Topic(topic)
    except ValueError as exc:  # InvalidTopic is a ProtocolError, a ValueError
        return str(exc)
    if qos not in (0, 1, 2):
        return f"qos must be 0, 1 or 2, not {qos!r}"
    if len(payload) > _MAX_PAYLOAD:
        return f"payload of {len(payload)} bytes exceeds MQTT's packet limit"
    return None if properties is None else publish_properties_problem(properties)


@dataclass(frozen=True)
class Refused:
    """A PUBLISH the broker refused (a failure reason code), as an outcome for
    :meth:`Acks.settle`: it fails the future with a :class:`PublishRejected` naming the
    topic registered with it (the ack names only the packet id, and may come first)."""

    reason: str


class Acks:
    """Futures keyed by packet id, tolerant of an ack that arrives before registration.

    paho may process a PUBACK on its thread before `publish()` has returned the mid to us;
    our lock is never held while calling into paho, so ordering is resolved here instead.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[Future[Any], str]] = {}
        self._early: dict[int, Any] = {}
        self._unwritten: set[int] = set()  # QoS 0 mids: their future completes when written

    def register(
        self, mid: int, future: Future[Any], *, qos0: bool = False, topic: str = ""
    ) -> None:
        """Wait for `mid`'s outcome in `future`; `topic`: what a :class:`Refused` names."""
        with self._lock:
            if mid in self._early:
                outcome = self._early.pop(mid)
            else:
                self._waiting[mid] = (future, topic)
                if qos0:
                    self._unwritten.add(mid)
                return
        _settle(future, outcome, topic)

    def settle(self, mid: int, outcome: Any) -> None:
        with self._lock:
            waiting = self._waiting.pop(mid, None)
            if waiting is None:
                self._early[mid] = outcome
                return
            self._unwritten.discard(mid)
        future, topic = waiting
        _settle(future, outcome, topic)

    def fail_unwritten(self, exc: BaseException) -> int:
        """Fail every QoS 0 publish not yet written (the connection dropped: paho discards
        them at the reconnect and never reports them); how many."""
        with self._lock:
            lost = [self._waiting.pop(mid) for mid in self._unwritten if mid in self._waiting]
            self._unwritten.clear()
        for future, topic in lost:
            _settle(future, exc, topic)
        return len(lost)

    def fail_all(self, exc: BaseException) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, {}
            self._unwritten.clear()
        for future, topic in waiting.values():
            _settle(future, exc, topic)


def _settle(future: Future[Any], outcome: Any, topic: str) -> None:
    if future.done():
        return
    if isinstance(outcome, Refused):
        outcome = PublishRejected(topic, outcome.reason)
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class InOrder:
    """The acknowledgements of received QoS 1/2 messages, sent in the order the PUBLISHes
    came (MQTT 5 4.6.0-2 for PUBACK, 4.6.0-3 for PUBREC), whatever order they are made in.

    The receive path acknowledges a message when it is done with it: a persistent session
    when the application took its delivery, a chunk when its whole message was delivered.
    Those come in another order than the messages did (a chunked message completes after a
    later plain one; one topic's fetch finishes after another's), so each acknowledgement
    made early waits here for those before it. Only this connection's messages count: a new
    connection starts afresh (the broker resends what was not acknowledged).

    Args:
        send: writes one acknowledgement, `(packet id, QoS)`; called under this object's
            lock, in arrival order (paho only queues the packet).
    """

    def __init__(self, send: Callable[[int, int], object]) -> None:
        self._send = send
        self._lock = threading.Lock()
        self._session = 0
        self._queue: deque[list[int]] = deque()  # [packet id, QoS, made] in arrival order
        self._waiting: dict[int, list[int]] = {}

    @property
    def backlog(self) -> int:
        """Messages of this connection received and not acknowledged to the broker yet
        (made or not): the places of the broker's window (Receive Maximum) they hold."""
        return len(self._queue)

    def received(self, session: int, mid: int, qos: int) -> None:
        """A QoS 1/2 PUBLISH came on connection `session` (paho's thread, in wire order)."""
        with self._lock:
            if session != self._session:
                self._session = session
                self._queue.clear()
                self._waiting.clear()
            entry = [mid, qos, 0]
            self._queue.append(entry)
            self._waiting[mid] = entry

    def made(self, session: int, mid: int) -> None:
        """Message `mid` of connection `session` may be acknowledged: it is, with every
        later one made already, once every earlier one is."""
        with self._lock:
            entry = self._waiting.get(mid) if session == self._session else None
            if entry is None:
                return
            entry[2] = 1
            while self._queue and self._queue[0][2]:
                done = self._queue.popleft()
                del self._waiting[done[0]]
                self._send(done[0], done[1])
