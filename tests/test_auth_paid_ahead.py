"""Where the gateway takes Basic, a SCRAM client-first is paid ahead (gateway/auth/_throttle.py).

The answer to a client-first tells an entry SCRAM cannot use (a 401 offering Basic) from
every other (a server-first). Each client-first is therefore charged to its address as a
failed login is, until the login's next step from there settles it: a caller that only
asks gets 429 after as many questions as failed Basic logins allow (50 a minute), a real
client's logins cost nothing in the end. The real gateway over TLS: tests/test_e2e_dynsec_cli.py
and tests/test_gateway_forwarded.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from scramp import ScramClient
from test_auth_authenticator import Clock, b64, final_header, make, passwd

from gateway.auth import Authenticated, Authenticator, Challenge
from gateway.auth._limits import Charges, wait_below

PER_ADDRESS = 50  # the Authenticator's default: failures per address and minute


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "passwd"
    passwd(path, "alice", "alice-pw", "-I", "4096")
    passwd(path, "weak", "weak-pw")  # mosquitto_passwd's default: 101 iterations
    return path


def ask(auth: Authenticator, user: str, client: str) -> tuple[int, str]:
    """A client-first alone, as an enumerator sends it: the status and what is offered."""
    scram = ScramClient(["SCRAM-SHA-512"], user, "x")
    answer = auth.authenticate(f"SCRAM-SHA-512 data={b64(scram.get_client_first())}", client=client)
    assert isinstance(answer, Challenge)
    return answer.status, answer.headers.get("WWW-Authenticate", "").partition(" ")[0]


def basic(auth: Authenticator, user: str, password: str, client: str) -> Authenticated | Challenge:
    return auth.authenticate("Basic " + b64(f"{user}:{password}"), client=client)


def names(count: int) -> list[str]:
    """An enumerator's list: the weak entry, an unknown name and a SCRAM-capable one in turn."""
    return [("weak", f"nobody-{n}", "alice")[n % 3] for n in range(count)]


def test_an_enumerator_gets_429_after_as_many_questions_as_basic_guesses(
    password_file: Path,
) -> None:
    """Without the charge every answer below tells `weak` from the others, for ever."""
    auth = make(password_file, tls=True)
    answers = [ask(auth, user, "192.0.2.1") for user in names(PER_ADDRESS + 10)]
    told = answers[:PER_ADDRESS]
    assert told[::3] == [(401, "Basic")] * 17  # weak: told
    assert set(told[1::3] + told[2::3]) == {(401, "SCRAM-SHA-512")}  # unknown, alice: alike
    assert answers[PER_ADDRESS:] == [(429, "")] * 10, answers[PER_ADDRESS:]
    # A Basic guess from there is held too (its timing would tell the same) ...
    held = basic(auth, "someone", "guess", "192.0.2.1")
    assert isinstance(held, Challenge) and held.status == 429
    # ... but for a name asked about it is the step the question paid for: it counts as a
    # failure instead, and the address stays at the limit.
    paid = basic(auth, "weak", "guess", "192.0.2.1")
    assert isinstance(paid, Challenge) and paid.status == 401
    assert ask(auth, "weak", "192.0.2.1") == (429, "")
    # Questions and guesses share the one budget.
    for n in range(PER_ADDRESS // 2):
        assert ask(auth, f"asked-{n}", "192.0.2.2")[0] == 401
        guess = basic(auth, f"guessed-{n}", "guess", "192.0.2.2")
        assert isinstance(guess, Challenge) and guess.status == 401
    assert ask(auth, "weak", "192.0.2.2") == (429, "")
    # Another address is not held, and over plain HTTP nothing is told, so nothing charged.
    assert ask(auth, "weak", "192.0.2.3") == (401, "Basic")
    plain = make(password_file)
    assert {ask(plain, user, "192.0.2.1") for user in names(3 * PER_ADDRESS)} == {
        (401, "SCRAM-SHA-512")
    }


def test_a_real_clients_logins_settle_what_they_were_charged(password_file: Path) -> None:
    """The offer and the Basic login it invites, or a SCRAM login, cost nothing in the end,
    however often; and logins under way when the address reaches the limit still finish."""
    auth = make(password_file, tls=True)
    for _ in range(3 * PER_ADDRESS):
        assert ask(auth, "weak", "192.0.2.1") == (401, "Basic")
        assert isinstance(basic(auth, "weak", "weak-pw", "192.0.2.1"), Authenticated)
        assert isinstance(login(auth, "alice", "alice-pw", "192.0.2.1"), Authenticated)
    # A fleet behind one address: PER_ADDRESS logins under way at once fill the budget; the
    # next one waits, but each of those finishes (its step settles before it is checked).
    offers = [ask(auth, "weak", "192.0.2.9") for _ in range(PER_ADDRESS // 2)]
    exchanges = [begin(auth, "alice", "alice-pw", "192.0.2.9") for _ in range(PER_ADDRESS // 2)]
    assert offers == [(401, "Basic")] * (PER_ADDRESS // 2)
    assert ask(auth, "alice", "192.0.2.9") == (429, "")
    for scram, challenge in exchanges:
        final = auth.authenticate(final_header(scram, challenge), client="192.0.2.9")
        assert isinstance(final, Authenticated)
    for _ in offers:
        assert isinstance(basic(auth, "weak", "weak-pw", "192.0.2.9"), Authenticated)
    assert ask(auth, "weak", "192.0.2.9") == (401, "Basic")


def test_a_failed_next_step_counts_once_and_settles_only_its_own_users_charge(
    password_file: Path,
) -> None:
    """A guess after the offer costs one failure in all, as a Basic guess alone does; a
    success settles only charges of its own user: an enumerator who owns an account cannot
    buy its questions back with its own logins."""
    auth = make(password_file, tls=True)
    for n in range(10):  # the user's own limit from an address: 10 a minute
        assert ask(auth, "weak", "192.0.2.1") == (401, "Basic")
        guess = basic(auth, "weak", f"guess-{n}", "192.0.2.1")
        assert isinstance(guess, Challenge) and guess.status == 401
    assert [ask(auth, f"nobody-{n}", "192.0.2.1")[0] for n in range(PER_ADDRESS - 10 + 1)] == [
        401
    ] * (PER_ADDRESS - 10) + [429]
    owner = make(password_file, tls=True)
    for n in range(PER_ADDRESS - 1):
        assert ask(owner, f"nobody-{n}", "192.0.2.2")[0] == 401
        assert isinstance(basic(owner, "weak", "weak-pw", "192.0.2.2"), Authenticated)
    assert ask(owner, "nobody", "192.0.2.2")[0] == 401
    assert ask(owner, "nobody-else", "192.0.2.2") == (429, "")


def test_replicas_settle_each_others_charges(password_file: Path) -> None:
    """A login whose first leg reaches one replica (or worker) and whose final another: a
    final that finds nothing owed leaves a credit that the next first leg of that user
    there uses, so that a client moving between replicas is not held back."""
    clock = Clock()
    one, two = make(password_file, clock, tls=True), make(password_file, clock, tls=True)
    assert isinstance(login(one, "alice", "alice-pw", "192.0.2.1"), Authenticated)
    for _ in range(30):  # begun at two, finished at one
        scram, challenge = begin(two, "alice", "alice-pw", "192.0.2.1")
        assert isinstance(
            one.authenticate(final_header(scram, challenge), client="192.0.2.1"), Authenticated
        )
    for _ in range(PER_ADDRESS + 10):  # begun at one, finished at two
        scram, challenge = begin(one, "alice", "alice-pw", "192.0.2.1")
        assert isinstance(
            two.authenticate(final_header(scram, challenge), client="192.0.2.1"), Authenticated
        )
    # The credit is its user's alone: other names from there are charged as before.
    answers = [ask(one, f"nobody-{n}", "192.0.2.1")[0] for n in range(PER_ADDRESS)]
    assert 429 in answers


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


def begin(auth: Authenticator, user: str, password: str, client: str) -> tuple[ScramClient, str]:
    scram = ScramClient(["SCRAM-SHA-512"], user, password)
    answer = auth.authenticate(f"SCRAM-SHA-512 data={b64(scram.get_client_first())}", client=client)
    assert isinstance(answer, Challenge) and answer.status == 401, answer
    return scram, answer.headers["WWW-Authenticate"]


def login(auth: Authenticator, user: str, password: str, client: str) -> Authenticated | Challenge:
    scram, challenge = begin(auth, user, password, client)
    return auth.authenticate(final_header(scram, challenge), client=client)
