"""The bookkeeping of attempts paid ahead (gateway/auth/_limits.py: Charges, wait_below).

Charges count per key in fixed windows under tickets, each taken back by a later step of its
ticket; wait_below adds such counts to a key's failures to say how long the key must wait.
"""

from __future__ import annotations

import pytest
from test_auth_authenticator import Clock

from gateway.auth._limits import Charges, wait_below


def test_charges_are_bounded_and_forgotten_with_their_window() -> None:
    clock = Clock()
    charges = Charges(window=60, capacity=100, credit=5, clock=clock)
    for n in range(10_000):
        charges.charge(f"addr:{n}", "u")
    assert len(charges) == 100 and charges.tickets == 100
    charges.charge("a", "u")
    charges.charge("a", "u")
    charges.settle("a", "v")  # another ticket: a credit for it, nothing of u's taken back
    assert charges.standing("a") == (2, clock.now + 60)
    charges.settle("a", "u")
    for _ in range(20):  # credit beyond what was charged, up to 5
        charges.settle("a", "u")
    for _ in range(7):
        charges.charge("a", "u")
    assert charges.standing("a")[0] == 2  # 5 of the 7 were paid by the credit
    clock.now += 60
    assert charges.standing("a") == (0, 0.0)
    charges.settle("b", "u")  # nothing charged in a window: no credit either
    charges.charge("b", "u")
    assert charges.standing("b")[0] == 1
    clock.now += 61
    charges.charge("b", "u")  # a new window: the old one's ticket is void
    charges.settle("b", "u")
    charges.settle("b", "u")  # a credit now, not a charge of the old window taken back
    assert charges.standing("b")[0] == 0
    charges.charge("b", "u")
    assert charges.standing("b")[0] == 0


@pytest.mark.parametrize(
    ("standings", "wait"),
    [
        ([], None),
        ([(49, 1060.0)], None),
        ([(50, 1060.0)], 60),
        ([(30, 1010.0), (30, 1050.0)], 10),  # the first window over leaves 30
        ([(50, 1050.0), (10, 1010.0)], 50),  # the failures alone block until their end
        ([(60, 1005.0), (60, 1030.0)], 30),
        ([(80, 999.0), (10, 1020.0)], None),  # a window already over counts nothing
    ],
)
def test_the_wait_is_until_the_counts_add_up_to_less_than_the_limit(
    standings: list[tuple[int, float]], wait: int | None
) -> None:
    assert wait_below(50, 1000.0, standings) == wait
