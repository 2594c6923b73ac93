"""The proxy's pools (proxy/_shares.py): a total, a share per account and per address;
refused at once or waited for, room going round the accounts and addresses in turn."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from client.protocol import address_key
from proxy._shares import Holder, Limits, Pool, PoolFull


def test_a_take_now_beyond_a_share_is_refused_and_says_which() -> None:
    full: list[str] = []
    pool = Pool(Limits(total=4, per_user=2, per_address=3), on_full=full.append)
    a1, a2 = Holder("10.0.0.1", "alice"), Holder("10.0.0.2", "alice")
    pool.take_now(a1)
    pool.take_now(a2)
    with pytest.raises(PoolFull, match="user"):
        pool.take_now(Holder("10.0.0.3", "alice"))  # alice's two, from any address
    anon = Holder("10.0.0.1")
    pool.take_now(anon)
    pool.take_now(anon)
    with pytest.raises(PoolFull, match="total"):
        pool.take_now(Holder("10.0.0.9", "bob"))
    assert full == ["user", "total"]
    assert pool.held_by(user="alice") == 2 and pool.held_by(address="10.0.0.1") == 3


def test_a_slot_taken_before_the_login_counts_against_the_account_once_claimed() -> None:
    """A connection's slot is taken when it is accepted (its address's share) and claimed
    for its account once the broker accepted the login: beyond the account's share the
    claim is refused and the slot stays the address's; given back, both shares free up."""
    full: list[str] = []
    pool = Pool(Limits(total=8, per_user=2, per_address=8), on_full=full.append)
    slots = [pool.take_now(Holder(f"10.0.0.{i}")) for i in range(3)]
    slots[0].claim("alice")
    slots[1].claim("alice")
    with pytest.raises(PoolFull, match="user"):
        slots[2].claim("alice")
    assert full == ["user"] and pool.held_by(user="alice") == 2 and pool.used == 3
    assert pool.held_by(address="10.0.0.2") == 1  # still held, as the address's
    slots[0].give_back()
    assert pool.held_by(user="alice") == 1 and pool.used == 2
    slots[2].claim("alice")
    assert pool.held_by(user="alice") == 2


def test_a_wrong_or_unaccepted_user_name_is_no_account() -> None:
    """Before the broker accepted a login its user name is a claim: the Holder has none."""
    pool = Pool(Limits(total=8, per_user=1, per_address=8))
    pool.take_now(Holder("10.0.0.1", "alice"))
    pool.take_now(Holder("10.0.0.2", None))  # not alice's share
    assert pool.held_by(user="alice") == 1


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),  # the same /64: one share
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("unknown", "unknown"),
    ],
)
def test_an_ipv6_address_counts_by_its_64(address: str, key: str) -> None:
    assert address_key(address) == key


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_waiter_whose_account_is_full_never_holds_up_another_account() -> None:
    async def main() -> list[str]:
        pool = Pool(Limits(total=4, per_user=1, per_address=4))
        alice = Holder("10.0.0.1", "alice")
        first = await pool.take(alice)
        order: list[str] = []

        async def wait(who: Holder, name: str) -> None:
            taken = await pool.take(who)
            order.append(name)
            await asyncio.sleep(3600)
            taken.give_back()

        blocked = asyncio.create_task(wait(Holder("10.0.0.2", "alice"), "alice-2"))
        await asyncio.sleep(0)
        bob = asyncio.create_task(wait(Holder("10.0.0.3", "bob"), "bob"))
        await asyncio.sleep(0.01)
        assert order == ["bob"]  # alice's second waits for alice's share, bob does not
        first.give_back()
        await asyncio.sleep(0.01)
        for task in (blocked, bob):
            task.cancel()
        return order

    assert run(main()) == ["bob", "alice-2"]


def test_room_goes_round_the_accounts_in_turn() -> None:
    """The total full: each slot given back goes to the next account in turn, not all to
    the account that queued first."""

    async def main() -> list[str]:
        pool = Pool(Limits(total=2, per_user=10, per_address=10))
        held = [await pool.take(Holder("10.9.9.9", "other")) for _ in range(2)]
        order: list[str] = []

        async def one(user: str, address: str) -> None:
            taken = await pool.take(Holder(address, user))
            order.append(user)
            taken.give_back()

        tasks = [asyncio.create_task(one("a", f"10.0.0.{i}")) for i in range(3)]
        tasks += [asyncio.create_task(one("b", f"10.0.1.{i}")) for i in range(3)]
        await asyncio.sleep(0)
        held[0].give_back()
        await asyncio.gather(*tasks)
        held[1].give_back()
        return order

    assert run(main()) == ["a", "b", "a", "b", "a", "b"]


def test_a_cancelled_waiter_leaves_nothing_held() -> None:
    async def main() -> Pool:
        pool = Pool(Limits(total=1, per_user=1, per_address=1))
        first = await pool.take(Holder("10.0.0.1"))
        waiter = asyncio.create_task(pool.take(Holder("10.0.0.2")))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.sleep(0)
        first.give_back()
        taken = await pool.take(Holder("10.0.0.3"))  # the cancelled waiter took nothing
        taken.give_back()
        return pool

    assert run(main()).used == 0


def test_many_waiters_of_one_account_cost_a_release_a_few_steps() -> None:
    """Ten thousand subscribers of one account waiting on its share: a slot another
    account gives back costs a few checks, not one per waiter."""

    async def main() -> int:
        pool = Pool(Limits(total=64, per_user=8, per_address=64))
        held = [await pool.take(Holder(f"10.0.0.{i}", "crowd")) for i in range(8)]
        waiters = [
            asyncio.create_task(pool.take(Holder(f"10.1.{i // 250}.{i % 250}", "crowd")))
            for i in range(10_000)
        ]
        await asyncio.sleep(0)
        other = await pool.take(Holder("10.2.0.1", "other"))
        checks = 0
        full = pool._full

        def counted(who: Holder, amount: int) -> str | None:
            nonlocal checks
            checks += 1
            return full(who, amount)

        pool._full = counted  # type: ignore[method-assign]
        other.give_back()
        for task in waiters:
            task.cancel()
        for taken in held:
            taken.give_back()
        return checks

    assert 1 <= run(main()) <= 4


def test_an_address_at_its_share_never_holds_up_its_accounts_other_addresses() -> None:
    async def main() -> list[str]:
        pool = Pool(Limits(total=4, per_user=4, per_address=1))
        first = await pool.take(Holder("10.0.0.1", "alice"))
        order: list[str] = []

        async def wait(who: Holder) -> None:
            taken = await pool.take(who)
            order.append(who.address)
            await asyncio.sleep(3600)
            taken.give_back()

        same = asyncio.create_task(wait(Holder("10.0.0.1", "alice")))  # its address is full
        await asyncio.sleep(0)
        other = asyncio.create_task(wait(Holder("10.0.0.2", "alice")))  # queued behind it
        await asyncio.sleep(0.01)
        assert order == ["10.0.0.2"]
        first.give_back()
        await asyncio.sleep(0.01)
        for task in (same, other):
            task.cancel()
        return order

    assert run(main()) == ["10.0.0.2", "10.0.0.1"]
