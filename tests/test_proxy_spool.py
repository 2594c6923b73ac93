"""The bounds of what the proxy keeps for payloads (proxy/_spool.py, proxy/_state.py): the
shared spools' total, count, memory and shares, and the memory of failed placeholders,
whatever a publisher sends. The running proxy's use of them: tests/test_proxy_broadcast.py
and test_proxy_fleet.py."""

from __future__ import annotations

import os
import tracemalloc
import uuid
from pathlib import Path

from client.protocol import MessageId, Placeholder
from proxy._shares import Holder, Limits
from proxy._spool import Spool, SpoolBudget, SpoolLimits
from proxy._state import POISONED_IDS, Poisoned

MiB = 1 << 20


def _budget(total: int, *, per_user: int, per_address: int, memory: int, count: int) -> SpoolBudget:
    return SpoolBudget(SpoolLimits(Limits(total, per_user, per_address), memory, count), print)


def test_a_spool_is_read_at_any_offset_as_far_as_it_is_written(tmp_path: Path) -> None:
    data = os.urandom(3 * MiB + 5)
    for in_memory in (True, False):
        spool = Spool(len(data), tmp_path, in_memory=in_memory)
        assert list(tmp_path.iterdir()) == []  # a file spool leaves no name behind
        for at in range(0, len(data), 700_000):
            spool.append(data[at : at + 700_000])
            assert bytes(spool.read(0, len(data) + 1)) == data[: spool.length]
        assert bytes(spool.read(MiB + 3, 100)) == data[MiB + 3 : MiB + 103]
        spool.close()


def test_the_spools_total_count_and_memory_hold() -> None:
    budget = _budget(10 * MiB, per_user=10 * MiB, per_address=10 * MiB, memory=3 * MiB, count=3)
    assert budget.reserve(2 * MiB) is True  # in memory
    assert budget.reserve(2 * MiB) is False  # memory full: a file
    assert budget.reserve(7 * MiB) is None  # past the total
    assert budget.reserve(1 * MiB) is True
    assert budget.reserve(1) is None  # three at once
    assert (budget.used, budget.memory) == (5 * MiB, 3 * MiB)
    budget.release(2 * MiB, in_memory=True)
    assert budget.reserve(1) is True


def test_a_payload_is_charged_once_to_each_account_and_address_within_their_shares() -> None:
    budget = _budget(64 * MiB, per_user=8 * MiB, per_address=6 * MiB, memory=0, count=8)
    alice, alice_too = Holder("10.0.0.1", "alice"), Holder("10.0.0.2", "alice")
    assert budget.fits(alice, 5 * MiB, user=True, address=True)
    budget.charge(alice, 5 * MiB, user=True, address=True)
    budget.charge(alice_too, 5 * MiB, user=False, address=True)  # alice paid for it already
    assert budget.held_by(user="alice") == 5 * MiB
    assert budget.held_by(address="10.0.0.2") == 5 * MiB
    assert not budget.fits(alice, 4 * MiB, user=True, address=False)  # 9 > alice's 8
    assert not budget.fits(Holder("10.0.0.1", "bob"), 2 * MiB, user=True, address=True)
    assert budget.fits(Holder("10.0.0.3", "bob"), 6 * MiB, user=True, address=True)
    budget.discharge(alice, 5 * MiB, user=True, address=True)
    assert budget.held_by(user="alice") == 0 and budget.held_by(address="10.0.0.1") == 0


def _lie(url_length: int) -> Placeholder:
    message = MessageId.new()
    url = f"http://gw.example/msg/{message}?" + "q" * url_length
    return Placeholder(url, 1, uuid.uuid4().hex * 2, message)


def test_failed_placeholders_are_remembered_in_bounded_memory_whatever_their_urls() -> None:
    """5,000 lies whose URLs are as long as a placeholder's may be (2,048 characters): the
    memory keeps the last 4,096, each a 32-byte digest. Kept whole, their URLs alone would
    be 8 MiB."""
    poisoned = Poisoned()
    first = _lie(10)
    poisoned.add(first)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        last = None
        for _ in range(5000):
            last = _lie(1980)
            poisoned.add(last)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(poisoned) == POISONED_IDS
    assert last in poisoned and first not in poisoned  # the oldest dropped
    assert grown < 2 * MiB, grown  # kept whole: 9.8 MiB
