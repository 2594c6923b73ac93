"""Pools every connection draws from, each with a total and a share per account and per
device address, so that no account or address can take what the rest of the fleet needs.

A pool is counted in units: slots (uploads, fetches) or bytes (what connections hold before
their login: :data:`proxy._state.Services.logins`). Who takes from it is a :class:`Holder`:
the device's address (:attr:`proxy._state.Conn.peer`, the one place it is known) and its
account, the CONNECT's user name, but only once the broker accepted the login (anything
else could take another account's share with a wrong password). An anonymous device has
no account: it is held to its address's share alone. An IPv6 address counts by its /64
(:func:`client.protocol.address_key`, as at the gateway): one subscriber's prefix holds
2^64 addresses.

A taker either is refused at once (:meth:`Pool.take_now`: uploads, which the device may
retry after its 0x97) or waits its turn (:meth:`Pool.take`: fetches, which delay only the
connection that waits). Waiters are queued per account and, within it, per address; room
goes round the accounts and their addresses in turn, and one whose share is full is passed
over as a whole: it waits for its own share to free up, never in front of the others. So a
release costs a few steps however many wait (ten thousand subscribers of one account
waiting on its share are one skipped queue).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Holder:
    """Who takes from a pool: the device's address (its share's key, :func:`address_key`)
    and its accepted account (None: anonymous, or not accepted yet)."""

    address: str
    user: str | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    """A pool's total and the most one account and one address may hold of it."""

    total: int
    per_user: int
    per_address: int


class PoolFull(Exception):
    """Nothing can be taken now; `share` says which bound holds (total, user, address)."""

    def __init__(self, share: str) -> None:
        super().__init__(f"the {share} share is taken")
        self.share = share


_Waiter = tuple[int, "asyncio.Future[None]"]


class Pool:
    """Units of one kind, with a share per account and per address.

    Args:
        limits: the total and the shares.
        on_full: told the bound (`total`, `user`, `address`) each time one refuses or
            makes a taker wait (a metric).
        on_change: told what is in use after each change (a gauge).
    """

    def __init__(
        self,
        limits: Limits,
        on_full: Callable[[str], None] = lambda share: None,
        on_change: Callable[[int], None] = lambda used: None,
    ) -> None:
        self.limits = limits
        self.used = 0
        self.peak = 0  # the most in use since the last reset_peak()
        self._users: collections.Counter[str] = collections.Counter()
        self._addresses: collections.Counter[str] = collections.Counter()
        # account -> address -> waiters, each level in the order room goes round
        self._queues: dict[str | None, dict[str, collections.deque[_Waiter]]] = {}
        self._waiting = 0
        self._on_full = on_full
        self._on_change = on_change

    def _full(self, who: Holder, amount: int) -> str | None:
        """Which bound `amount` more for `who` would pass, None when it fits."""
        limits = self.limits
        if self.used + amount > limits.total:
            return "total"
        if who.user is not None and self._users[who.user] + amount > limits.per_user:
            return "user"
        if self._addresses[who.address] + amount > limits.per_address:
            return "address"
        return None

    def _add(self, who: Holder, amount: int) -> None:
        self.used += amount
        self.peak = max(self.peak, self.used)
        if who.user is not None:
            self._users[who.user] += amount
        self._addresses[who.address] += amount
        self._on_change(self.used)

    def take_now(self, who: Holder, amount: int = 1) -> Taken:
        """Take `amount` at once.

        Raises:
            PoolFull: the total, the account's or the address's share would be passed.
        """
        share = self._full(who, amount)
        if share is not None:
            self._on_full(share)
            raise PoolFull(share)
        self._add(who, amount)
        return Taken(self, who, amount)

    def claim(self, who: Holder, user: str, amount: int) -> Holder:
        """What `who` (no account yet) holds, counted against `user`'s share as well; the
        holder it is now (:meth:`Taken.claim`).

        Raises:
            PoolFull: `user`'s share has no room for it.
        """
        assert who.user is None, "an account already"
        if self._users[user] + amount > self.limits.per_user:
            self._on_full("user")
            raise PoolFull("user")
        self._users[user] += amount
        return Holder(who.address, user)

    async def take(self, who: Holder, amount: int = 1) -> Taken:
        """Take `amount`, waiting for room in the total and in `who`'s shares."""
        share = self._full(who, amount)
        if share is None and not self._waiting:
            self._add(who, amount)
            return Taken(self, who, amount)
        if share is not None:
            self._on_full(share)
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(who.user, {}).setdefault(who.address, collections.deque())
        self._queues[who.user][who.address].append((amount, granted))
        self._waiting += 1
        self._serve()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.give(who, amount)  # granted as it was cancelled: hand it on
            # else: its queue drops it when it comes to it (see _grant)
            raise
        return Taken(self, who, amount)

    def give(self, who: Holder, amount: int = 1) -> None:
        """Return what `who` took."""
        self.used -= amount
        if who.user is not None:
            self._users[who.user] -= amount
            if not self._users[who.user]:
                del self._users[who.user]
        self._addresses[who.address] -= amount
        if not self._addresses[who.address]:
            del self._addresses[who.address]
        self._on_change(self.used)
        self._serve()

    def _serve(self) -> None:
        """Grant waiters while there is room: one per account in turn, each account's
        addresses in turn; an account or an address whose share is full is passed over."""
        granted = True
        while granted and self._waiting and self.used < self.limits.total:
            granted = False
            for user in list(self._queues):
                if self._grant(user):
                    granted = True
                    if user in self._queues:  # waiters left: to the back of the round
                        self._queues[user] = self._queues.pop(user)
                if self.used >= self.limits.total:
                    return

    def _grant(self, user: str | None) -> bool:
        """Grant the first waiter of `user`'s queues that fits; whether one was."""
        addresses = self._queues[user]
        granted = False
        for address in list(addresses):
            queue = addresses[address]
            while queue and queue[0][1].done():  # cancelled while it waited
                queue.popleft()
                self._waiting -= 1
            if queue:
                amount, future = queue[0]
                who = Holder(address, user)
                share = self._full(who, amount)
                if share is None:
                    queue.popleft()
                    self._waiting -= 1
                    self._add(who, amount)
                    future.set_result(None)
                    granted = True
            if not queue:
                del addresses[address]
            elif granted:
                addresses[address] = addresses.pop(address)  # to the back of the round
            if granted or (queue and share in ("user", "total")):
                break
        if not addresses:
            del self._queues[user]
        return granted

    @contextlib.asynccontextmanager
    async def held(self, who: Holder, amount: int = 1, *, wait: bool) -> AsyncIterator[None]:
        """`amount` held for the block: waited for (`wait`), or taken at once.

        Raises:
            PoolFull: not `wait`, and nothing can be taken now.
        """
        taken = await self.take(who, amount) if wait else self.take_now(who, amount)
        try:
            yield
        finally:
            taken.give_back()

    def reset_peak(self) -> int:
        """The peak since the last call; from now on, the peak is what is in use."""
        peak, self.peak = self.peak, self.used
        return peak

    def held_by(self, *, user: str | None = None, address: str | None = None) -> int:
        """What an account or an address holds now (metrics, tests)."""
        if user is not None:
            return self._users[user]
        return self._addresses[address] if address is not None else self.used


class Taken:
    """What one taker holds of a pool, until :meth:`give_back` (once; again does nothing)."""

    def __init__(self, pool: Pool, who: Holder, amount: int) -> None:
        self._pool: Pool | None = pool
        self._who = who
        self._amount = amount

    def more(self, amount: int) -> None:
        """Take `amount` more for the same holder (given back with the rest).

        Raises:
            PoolFull: no room for it (what was held stays held).
        """
        assert self._pool is not None, "given back already"
        self._pool.take_now(self._who, amount)
        self._amount += amount

    def claim(self, user: str) -> None:
        """Count what is held against `user`'s share too: an account known only now (the
        broker accepted the login of a connection that took its slot when it was accepted).

        Raises:
            PoolFull: the account's share is taken (what was held stays held, as it was).
        """
        assert self._pool is not None, "given back already"
        self._who = self._pool.claim(self._who, user, self._amount)

    def give_back(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.give(self._who, self._amount)
