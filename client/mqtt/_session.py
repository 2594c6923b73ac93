"""Persistent MQTT sessions: the CONNECT flags they need and the subscriptions a broker kept.

Pure bookkeeping, no paho: :mod:`client.mqtt._paho` asks here what to put in CONNECT and which
subscriptions to send again after a CONNACK.

A session is persistent when `session_expiry` is positive: MQTT 5 connects with Clean Start
0 and a Session Expiry Interval of that many seconds, MQTT 3.1.1 with Clean Session 0 (3.1.1
has no expiry: the broker keeps the session until its own `persistent_client_expiration`).
The broker then keeps the subscriptions and queues QoS 1/2 messages while the client is away,
across a reconnect and across a restart of the process, as long as the client id is the same:
so a persistent session needs an explicit `client_id`.

When CONNACK says the session is present, the broker still has every subscription whose
SUBACK the client saw: only the others (made while disconnected, or whose SUBACK never came)
are sent again. Re-sending all of them would be harmless for the queue but makes the broker
send every retained message once more.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..core._exceptions import ConfigError

__all__ = ["MAX_SESSION_EXPIRY", "SessionFlags", "Subscriptions", "session_flags"]

#: MQTT 5's largest Session Expiry Interval (4 bytes); it means "never expires".
MAX_SESSION_EXPIRY = 0xFFFFFFFF
#: SUBACKs kept that came before their SUBSCRIBE was recorded (beyond: the oldest go).
MAX_EARLY_ACKS = 256


@dataclass(frozen=True, slots=True)
class SessionFlags:
    """What CONNECT carries for a session choice."""

    #: MQTT 5 Clean Start / MQTT 3.1.1 Clean Session.
    clean: bool
    #: MQTT 5 Session Expiry Interval property (None: not sent, the broker's 0).
    expiry: int | None


def session_flags(session_expiry: int, client_id: str) -> SessionFlags:
    """The CONNECT flags for `session_expiry` seconds (0: a clean session, the default).

    Args:
        session_expiry: seconds the broker keeps the session after a disconnect.
        client_id: the MQTT client id; a persistent session needs one.

    Raises:
        ConfigError: a negative or too large expiry, or a persistent session without a
            client id (the broker would assign a new id, so a new session, every time).
    """
    if not 0 <= session_expiry <= MAX_SESSION_EXPIRY:
        raise ConfigError(
            f"session_expiry must be 0-{MAX_SESSION_EXPIRY} seconds, got {session_expiry}"
        )
    if session_expiry == 0:
        return SessionFlags(clean=True, expiry=None)
    if not client_id:
        raise ConfigError(
            "session_expiry needs a client_id: the broker finds a session by its client id"
        )
    return SessionFlags(clean=False, expiry=session_expiry)


class Subscriptions:
    """The subscriptions to keep, and which of them the broker confirmed (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wanted: dict[str, int] = {}
        self._confirmed: set[str] = set()
        self._sent: dict[int, str] = {}
        # SUBACKs that came before their SUBSCRIBE was recorded: paho's thread can read the
        # answer before the caller's thread is back from sending (granted or not, by mid).
        self._early: dict[int, bool] = {}

    def add(self, topic_filter: str, qos: int) -> None:
        """Keep `topic_filter` at `qos` from now on."""
        with self._lock:
            if self._wanted.get(topic_filter) != qos:
                self._confirmed.discard(topic_filter)
            self._wanted[topic_filter] = qos

    def remove(self, topic_filter: str) -> None:
        """Stop keeping `topic_filter`."""
        with self._lock:
            self._wanted.pop(topic_filter, None)
            self._confirmed.discard(topic_filter)

    def qos(self, topic_filter: str) -> int:
        """The QoS `topic_filter` is kept at (0 when it is not kept)."""
        with self._lock:
            return self._wanted.get(topic_filter, 0)

    def sent(self, mid: int, topic_filter: str) -> None:
        """A SUBSCRIBE for `topic_filter` went out as packet `mid`."""
        with self._lock:
            ok = self._early.pop(mid, None)
            if ok is None:
                self._sent[mid] = topic_filter
            elif ok and topic_filter in self._wanted:
                self._confirmed.add(topic_filter)

    def acknowledged(self, mid: int, ok: bool) -> None:
        """The SUBACK for packet `mid` came (`ok`: granted): the broker has the filter."""
        with self._lock:
            topic_filter = self._sent.pop(mid, None)
            if topic_filter is None:  # its SUBSCRIBE is about to be recorded
                if len(self._early) >= MAX_EARLY_ACKS:  # or never will be: a broker's
                    del self._early[next(iter(self._early))]  # mids are not ours to trust
                self._early[mid] = ok
            elif ok and topic_filter in self._wanted:
                self._confirmed.add(topic_filter)

    def to_restore(self, session_present: bool) -> list[tuple[str, int]]:
        """The subscriptions to send after a CONNACK.

        Args:
            session_present: CONNACK's Session Present flag: the broker kept the session,
                with every subscription it acknowledged. Without it, every one is sent.
        """
        with self._lock:
            self._sent.clear()  # SUBACKs of the old connection will not come
            self._early.clear()
            if not session_present:
                self._confirmed.clear()
            return [(f, q) for f, q in self._wanted.items() if f not in self._confirmed]
