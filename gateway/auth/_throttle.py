"""The lockout policy: which failed attempts count against whom, and when a caller must wait.

Failed attempts are counted per source address and per (user, address) pair (an IPv6
address by its /64, :func:`client.protocol.address_key`: one subscriber holds 2^64 of
them to rotate through); past the
limit the answer is 429 with ``Retry-After`` instead of a challenge, which tells a person
at a terminal what is going on and costs an attacker a wait. While a pair is blocked even
the right password is refused from that address, otherwise the block would not slow
guessing down. There is deliberately no per-user limit across addresses: it would let
anyone who knows a user name lock that user out of the gateway, and it would buy little,
since the broker itself (mosquitto) never limits CONNECT attempts for the same password
file. A guesser spread over many addresses is slowed only by the password's strength.

Where the gateway takes HTTP Basic, a SCRAM client-first tells something a failed login
tells: the answer for an entry SCRAM cannot use (a 401 offering Basic) differs from every
other (a server-first). So each one is paid ahead: `Throttle.charge` counts it against the
address as a failure counts, under a ticket for its user, until the login's next step from
that address settles it (`Throttle.settle`: the SCRAM final, or the Basic request the offer
invites); that step's own failure then counts as any does. A real client's login costs nothing
in the end, and one that runs into the limit with logins under way still finishes them
(its next steps are checked after they settle); a caller that only asks, name after name,
gets 429 after as many questions as failed Basic logins would have allowed it. Charges
never count per user: asking about a name again tells nothing new, and a fleet sharing
one account behind one address must not hold itself back.

Kept apart from the schemes so that every scheme applies the same policy through these
calls: `Throttle.blocked` before the costly step, `Throttle.refuse` on a failure,
`Throttle.succeeded` on a success, `Throttle.charge` / `Throttle.settle` around a first
leg that is paid ahead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from client.protocol import address_key

from ._decisions import Challenge
from ._limits import Charges, FailureLimiter, wait_below


def _address_key(client: str) -> str:
    return f"addr:{address_key(client)}"  # an IPv6 address by its /64


def _user_key(user: str, client: str) -> str:
    return f"user:{address_key(client)}\0{user}"


class Throttle:
    """Failure counts per address and per (user, address), and the answers they lead to.

    Thread-safe (the limiters are). Bounded: each limiter tracks at most ``tracked_keys``.
    """

    def __init__(
        self,
        *,
        challenge: Callable[[str], Challenge],
        max_failures_per_user: int,
        max_failures_per_address: int,
        failure_window: float,
        tracked_keys: int,
        clock: Callable[[], float],
    ) -> None:
        """Set up empty counts.

        Args:
            challenge: the 401 a refused caller gets, given the reason for the log.
            max_failures_per_user: failures per (user, address) and window before 429.
            max_failures_per_address: failures per source address and window before 429.
            failure_window: seconds of the failure-counting window.
            tracked_keys: most users/addresses whose failures are remembered at once.
            clock: seconds.
        """
        self._challenge = challenge
        self._users = FailureLimiter(
            limit=max_failures_per_user, window=failure_window, capacity=tracked_keys, clock=clock
        )
        self._addresses = FailureLimiter(
            limit=max_failures_per_address,
            window=failure_window,
            capacity=tracked_keys,
            clock=clock,
        )
        self._address_limit = max_failures_per_address
        self._charges = Charges(
            window=failure_window,
            capacity=tracked_keys,
            credit=max_failures_per_address,
            clock=clock,
        )
        self._clock = clock

    def refuse(
        self, reason: str, *, client: str, user: str | None = None, detail: str | None = None
    ) -> Challenge:
        """Count a failure from ``client`` (and against ``user`` there), answer a 401.

        Args:
            reason: for the log.
            client: the source address.
            user: the user the attempt was for, when known.
            detail: what the client is told, for a header it got wrong (never for wrong
                credentials: that answer must not tell a user or a password from another).
        """
        self._addresses.failed(_address_key(client))
        if user is not None:
            self._users.failed(_user_key(user, client))
        challenge = self._challenge(reason)
        return challenge if detail is None else replace(challenge, detail=detail)

    def blocked(self, client: str, user: str | None, *, charges: bool = True) -> Challenge | None:
        """A 429 with ``Retry-After`` while ``client`` (or ``user`` from it) must wait, else None.

        Args:
            client: the source address.
            user: the user, once the credentials name one.
            charges: count the first legs paid ahead and not yet settled (`charge`) with
                the address's failures; False only before a request's next step could
                settle its own.
        """
        key = _address_key(client)
        standings = [self._addresses.standing(key)]
        if charges:
            standings.append(self._charges.standing(key))
        wait = wait_below(self._address_limit, self._clock(), standings)
        who = f"address {client}"
        if wait is None and user is not None:
            wait = self._users.retry_after(_user_key(user, client))
            who = f"user {user!r} from {client}"
        if wait is None:
            return None
        return Challenge(
            429,
            {"Retry-After": str(wait)},
            f"too many failed attempts ({who})",
            "too many failed attempts, retry later",
        )

    def charge(self, client: str, user: str) -> None:
        """Count a SCRAM client-first for ``user`` from ``client`` against the address, as a
        failure counts, until `settle` (see the module).

        Args:
            client: the source address.
            user: the user of the client-first (the ticket the next step settles).
        """
        self._charges.charge(_address_key(client), user)

    def settle(self, client: str, user: str) -> None:
        """Take back a charge of ``user``'s from ``client``: its login took the next step.

        Args:
            client: the source address.
            user: the user the step is for.
        """
        self._charges.settle(_address_key(client), user)

    def succeeded(self, user: str, client: str) -> None:
        """Forget ``user``'s failures from ``client``: it proved who it is.

        Args:
            user: the authenticated user.
            client: the source address.
        """
        self._users.reset(_user_key(user, client))
