"""Pure helpers of the MQTT adapter (:mod:`client.mqtt._paho`): acks and pre-queue checks.

No paho here: acknowledgement bookkeeping is plain threading, and the check that keeps a
PUBLISH a broker would disconnect us for out of paho's queue is pure.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from ..core._exceptions import ProtocolError
from ..protocol import PublishProperties, Topic
from ..protocol._props import publish_properties_problem

#: MQTT's remaining-length cap, less room for the fixed and variable headers.
_MAX_PAYLOAD = 268_435_455 - 65_535 * 2


class InvalidPublish(ProtocolError):
    """A publish that breaks the MQTT rules a broker enforces; refused before it is queued."""


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


class Acks:
    """Futures keyed by packet id, tolerant of an ack that arrives before registration.

    paho may process a PUBACK on its thread before `publish()` has returned the mid to us;
    our lock is never held while calling into paho, so ordering is resolved here instead.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, Future[Any]] = {}
        self._early: dict[int, Any] = {}
        self._unwritten: set[int] = set()  # QoS 0 mids: their future completes when written

    def register(self, mid: int, future: Future[Any], *, qos0: bool = False) -> None:
        with self._lock:
            if mid in self._early:
                outcome = self._early.pop(mid)
            else:
                self._waiting[mid] = future
                if qos0:
                    self._unwritten.add(mid)
                return
        _settle(future, outcome)

    def settle(self, mid: int, outcome: Any) -> None:
        with self._lock:
            future = self._waiting.pop(mid, None)
            if future is None:
                self._early[mid] = outcome
                return
            self._unwritten.discard(mid)
        _settle(future, outcome)

    def fail_unwritten(self, exc: BaseException) -> int:
        """Fail every QoS 0 publish not yet written (the connection dropped: paho discards
        them at the reconnect and never reports them); how many."""
        with self._lock:
            lost = [self._waiting.pop(mid) for mid in self._unwritten if mid in self._waiting]
            self._unwritten.clear()
        for future in lost:
            _settle(future, exc)
        return len(lost)

    def fail_all(self, exc: BaseException) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, {}
            self._unwritten.clear()
        for future in waiting.values():
            _settle(future, exc)


def _settle(future: Future[Any], outcome: Any) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
