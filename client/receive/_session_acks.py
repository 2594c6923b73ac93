"""When a received QoS 1/2 message is acknowledged to the broker.

A clean session (the default) acknowledges a message as soon as the receive worker takes it
from the hand-off queue: that is flow control (the broker may send one more), and a message
not yet delivered when the process ends is lost with the session anyway.

A persistent session (`session_expiry` > 0) promises more: whatever the broker queued for the
client reaches the application, across a reconnect and a restart of the process. So a message
is acknowledged only once the application took its delivery (:meth:`Client.next_message`,
the `messages()` iterators) or the client decided to skip it (`ignore_payload_not_found`).
A message still being fetched or waiting in the delivery queue when the process dies is
sent again by the broker on the next connect: at least once, never lost.

Chunks of an ADR-23 message are held the same way, as one: a chunk's acknowledgement waits
until its message is whole (or failed) and the application took that delivery, so a process
restarted mid-message with the same session gets the earlier chunks again
(:class:`ChunkAcks`). Held chunks occupy the broker's window (Receive Maximum) without being
deliveries the application can take, and the window must never fill with them: else the next
chunk could never come. So at most half the window is held; a message of more chunks than
that, or the oldest partial messages when newer ones need the room, are acknowledged at once
instead: those messages survive a reconnect (the partial is still in this process's memory)
but not a restart of the process (docs/connections.md says when each applies). Every
acknowledgement goes out in the order its message came (MQTT 5 4.6.0-2,
:class:`client.mqtt._acks.InOrder`), so a held chunk also holds back the acknowledgements
of every message after it: the receive worker gives up the oldest holding as soon as the
connection's unacknowledged messages pass the same half window (:meth:`ChunkAcks.release_oldest`).
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

from ..config._settings import ClientSettings
from ..mqtt._paho import Incoming, MqttConnection
from ..protocol._chunkstores import PartialKey

Ack = Callable[[], None]
#: Message ids whose holding was given up, remembered so their later chunks go at once.
REMEMBER_RELEASED = 1024


def acknowledge_taken(
    conn: MqttConnection, incoming: Incoming, settings: ClientSettings
) -> Callable[[], None] | None:
    """The worker took `incoming`: acknowledge it now, or return the ack for later.

    Args:
        conn: the connection it came on.
        incoming: the message.
        settings: the client's settings (`session_expiry`, `protocol`).

    Returns:
        None when it was acknowledged now; else the call that acknowledges it, for when
        the application takes its delivery.
    """
    if settings.session_expiry and incoming.qos:
        return functools.partial(conn.ack, incoming)
    conn.ack(incoming)
    return None


def combined(acks: Iterable[Ack | None]) -> Ack | None:
    """One call that makes every ack in `acks` (None when there is none)."""
    todo = [ack for ack in acks if ack is not None]
    if not todo:
        return None
    if len(todo) == 1:
        return todo[0]

    def all_of_them() -> None:
        for ack in todo:
            ack()

    return all_of_them


class ChunkAcks:
    """The held acknowledgements of partial chunked messages, at most `limit` of them.

    The receive worker calls :meth:`hold` for each chunk that its message still needs,
    :meth:`done` when the message is done (whole or failed), attaching what that returns to
    the delivery, and :meth:`late` for a chunk of a message already done. Used by the worker
    alone, except the call :meth:`done` returns (the application's thread).

    Args:
        limit: most chunk acknowledgements held at once; below the broker's window (Receive
            Maximum), so the broker can always send the next message. 0 holds nothing.
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("limit must not be negative")
        self.limit = limit
        self._held: OrderedDict[PartialKey, dict[int, Ack]] = OrderedDict()  # oldest first
        self._count = 0
        self._given_up: OrderedDict[PartialKey, None] = OrderedDict()
        # Messages done whose delivery the application has not taken: their acks so far.
        self._awaiting: dict[PartialKey, list[Ack]] = {}
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Chunk acknowledgements held now."""
        return self._count

    def hold(self, key: PartialKey, index: int, ack: Ack | None, total: int | None) -> None:
        """Hold chunk `index` of message `key` until :meth:`release`, or acknowledge it now.

        Now, when holding cannot make the message survive a restart: its `total` (once chunk
        0 told it) exceeds the limit, or its holding was given up before. Holding past the
        limit gives up the oldest messages' holding (this one's too when it is alone).
        A chunk held twice (the broker sent it again, e.g. after a reconnect) keeps the new
        acknowledgement and makes the old one (a no-op when its connection is gone).

        Args:
            key: (topic, message id).
            index: the chunk's index.
            ack: its acknowledgement; None when there is none to make (QoS 0, acknowledged).
            total: the message's chunk count, None until chunk 0 arrived.
        """
        if ack is None:
            return
        if key in self._given_up or (total is not None and total > self.limit):
            self._give_up(key)
            ack()
            return
        chunks = self._held.setdefault(key, {})
        old = chunks.pop(index, None)
        chunks[index] = ack
        if old is not None:
            old()
        else:
            self._count += 1
        while self._count > self.limit:
            self._give_up(next(iter(self._held)))

    def done(self, key: PartialKey | None, ack: Ack | None) -> Ack | None:
        """Message `key` is done (whole or failed): the acknowledgement of its delivery.

        The returned call (None when there is nothing to acknowledge) makes the held chunks'
        acknowledgements, `ack` (the chunk that finished the message) and those of chunks
        sent again until the application takes the delivery (:meth:`late`).

        Args:
            key: (topic, message id); None when the `__chunk` value named none.
            ack: the current chunk's acknowledgement, if any.
        """
        acks = self._release(key)
        if ack is not None:
            acks.append(ack)
        if key is None:
            return combined(acks)
        with self._lock:
            self._awaiting[key] = acks

        def consumed() -> None:
            with self._lock:
                if self._awaiting.get(key) is acks:
                    del self._awaiting[key]
                todo = list(acks)
            for each in todo:
                each()

        return consumed

    def release_oldest(self) -> bool:
        """Give up holding the oldest partial message's chunks (their acknowledgements are
        made now); whether there was one."""
        if not self._held:
            return False
        self._give_up(next(iter(self._held)))
        return True

    def late(self, key: PartialKey, ack: Ack | None) -> None:
        """A chunk of a message already done came again (a resend after a reconnect).

        Acknowledged with the message's delivery while the application has not taken it
        (a process that dies before gets the message again), else now.
        """
        if ack is None:
            return
        with self._lock:
            waiting = self._awaiting.get(key)
            if waiting is not None:
                waiting.append(ack)
                return
        ack()

    def _release(self, key: PartialKey | None) -> list[Ack]:
        if key is None:
            return []
        self._given_up.pop(key, None)
        chunks = self._held.pop(key, {})
        self._count -= len(chunks)
        return list(chunks.values())

    def _give_up(self, key: PartialKey) -> None:
        for ack in self._release(key):
            ack()
        self._given_up[key] = None
        while len(self._given_up) > REMEMBER_RELEASED:
            self._given_up.popitem(last=False)
