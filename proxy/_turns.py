"""The event loop's time, shared per account (STYLE 23: nginx and HAProxy bound what one
connection may do per turn of their event loop, then move on).

Everything the relay does for a packet (walk its fixed header in a run, write it, stream
its body) runs on the one event loop, so a connection that always has bytes waiting would
otherwise be served until its buffer is empty, each time, while every other connection's
packets wait behind it. So what a :class:`proxy._stream.PacketStream` hands out (a run,
a packet framed one by one, a body piece) is charged to a :class:`Turn`: the account's
(once the broker accepted its login), else the connection's own. An account's connections,
both directions of each, take at most :data:`TURN_PACKETS` packets and :data:`TURN_BYTES`
bytes together per turn of the loop (a run is cut to what is left: packets cost the walk,
bytes the write); then each waits for the account's next turn, in the order they came
(:meth:`Turn.wait`), while other accounts' packets pass. A new turn begins at the next
pass of the loop, so an account alone on the proxy loses nothing but a loop pass per turn.

Nothing is dropped or reordered: a connection that waits has its bytes left in its socket
buffers, and the kernel holds its sender back (TCP flow control).
"""

from __future__ import annotations

import asyncio
import collections
import weakref
from collections.abc import Callable, Hashable

#: Packets an account's connections may hand out together per turn of the loop: the walk
#: over a run costs per packet (0.6-1 us for a small one, bench/RESULTS.md, Round 19).
TURN_PACKETS = 256
#: Bytes an account's connections may hand out together per turn: a write costs per byte.
TURN_BYTES = 128 * 1024


def _uncounted(amount: float) -> None:
    pass


class Turn:
    """One account's share of each turn of the event loop.

    Args:
        on_wait: told each time a connection waits for the account's next turn.
    """

    __slots__ = ("__weakref__", "_next", "_on_wait", "_waiting", "packets", "size")

    def __init__(self, on_wait: Callable[[float], None] = _uncounted) -> None:
        #: What is left of this turn's share (below 1: spent). Plain attributes, read and
        #: counted down by the relay for every run (PacketStream.run): no call there.
        self.packets = TURN_PACKETS
        self.size = TURN_BYTES
        self._waiting: collections.deque[tuple[asyncio.Future[None], int]] = collections.deque()
        self._next: asyncio.Handle | None = None
        self._on_wait = on_wait

    @property
    def spent(self) -> bool:
        """Whether this turn's share is used up (the caller :meth:`wait` s)."""
        return self.packets <= 0 or self.size <= 0

    def room(self) -> tuple[int, int]:
        """Packets and bytes left of this turn's share (at least one packet)."""
        return max(self.packets, 1), max(self.size, 1)

    def charge(self, packets: int, size: int) -> None:
        """Count what was handed out; the share renews at the loop's next pass."""
        self.packets -= packets
        self.size -= size
        if self._next is None:
            self._next = asyncio.get_running_loop().call_soon(self._renew)

    async def wait(self, expect: int = 1) -> None:
        """Wait for the account's next turn (first come, first served).

        Args:
            expect: the packets the caller is likely to take (what it took last time): a
                new turn wakes as many waiters as its share may serve, not all of them.
        """
        self._on_wait(1)
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append((waiter, max(expect, 1)))
        if self._next is None:
            self._next = asyncio.get_running_loop().call_soon(self._renew)
        await waiter

    def _renew(self) -> None:
        """A new turn: the share is whole again, and the first waiters are woken, as many
        as its packets may serve (they run at the loop's next pass; another turn follows
        while any are left)."""
        self._next = None
        self.packets, self.size = TURN_PACKETS, TURN_BYTES
        room = TURN_PACKETS
        while self._waiting and room > 0:
            waiter, expect = self._waiting.popleft()
            if not waiter.done():  # (cancelled: its connection ended)
                waiter.set_result(None)
                room -= expect
        if self._waiting:
            self._next = asyncio.get_running_loop().call_soon(self._renew)


def turn_key(account: str | None, address: str) -> Hashable:
    """Whose turn a connection's packets take: its account's, or, for a login with no
    user name, its address's (`address`: :func:`client.protocol.address_key`)."""
    return ("account", account) if account is not None else ("address", address)


class Turns:
    """Each account's :class:`Turn`, kept while a connection of the account holds it.

    Args:
        on_wait: told each time a connection waits for its account's next turn.
    """

    def __init__(self, on_wait: Callable[[float], None] = _uncounted) -> None:
        self._turns: weakref.WeakValueDictionary[Hashable, Turn] = weakref.WeakValueDictionary()
        self._on_wait = on_wait

    def of(self, key: Hashable) -> Turn:
        """The turn of `key` (an account, or an address for a login with no user name)."""
        turn = self._turns.get(key)
        if turn is None:
            turn = self._turns[key] = Turn(self._on_wait)
        return turn

    def __len__(self) -> int:
        return len(self._turns)
