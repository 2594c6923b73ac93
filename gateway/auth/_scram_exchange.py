"""The two HTTP round trips of SCRAM-SHA-512 (RFC 7804), with the replay guard and the throttle.

``_scram`` holds the pure message arithmetic (client-first -> server-first, client-final ->
server-final, the signed sid). This module turns it into the gateway's answers: a 401
carrying server-first and a sealed sid, then `Authenticated` with server-final in
``Authentication-Info`` - or, on a wrong proof, a 401 that still carries an RFC 5802
server-error, because hop-client reads that header before the status.

The gateway keeps no per-exchange state: the sid carries it, sealed with the shared secret,
so any replica can finish an exchange another one began. What it does keep is the used-sid
set. Replay protection of SCRAM finals keys on the server nonce inside the verified sid, so
no re-spelling of the sid (or of anything else in the header) makes a captured final new.
It is per process: another replica accepts a captured final once, within the sid's
lifetime (60 s by default) - use TLS.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

from ._decisions import Authenticated, Challenge
from ._limits import ReplayGuard
from ._passwd import ScramKeys
from ._scram import (
    MECHANISM,
    ScramFailure,
    SidState,
    b64decode_text,
    b64encode_text,
    open_sid,
    seal_sid,
    server_final,
    server_first,
)
from ._throttle import Throttle

# SCRAM auth-params a client may send (RFC 7804: realm, data, sid); anything else is junk.
SCRAM_PARAMS = frozenset({"realm", "data", "sid"})


class ScramExchange:
    """Answers each step of a SCRAM-SHA-512 exchange. Thread-safe, stateless but for replays."""

    def __init__(
        self,
        *,
        keys_for: Callable[[str], ScramKeys],
        secret: bytes,
        throttle: Throttle,
        replays: ReplayGuard,
        clock: Callable[[], float],
        sid_lifetime: float,
        instead: Callable[[str], Challenge | None] = lambda user: None,
        paid_ahead: Callable[[], bool] = lambda: False,
    ) -> None:
        """Wire the exchange to its key source and bookkeeping.

        Args:
            keys_for: a user's SCRAM keys (decoys for unknown users).
            instead: the answer to a client-first for a user SCRAM cannot serve, when the
                gateway may say so (another scheme to use); None to go on with decoys.
            paid_ahead: whether a client-first is charged to its address until the
                login's next step settles it (`Throttle.charge`): where the gateway may
                answer `instead`, every client-first tells something a failed login tells.
            secret: seals and opens sids; the same on every replica.
            throttle: counts failures and blocks guessers.
            replays: the finals already accepted, until their sid expires.
            clock: wall-clock seconds, common to the replicas.
            sid_lifetime: seconds a client has between server-first and client-final.
        """
        self._keys_for = keys_for
        self._instead = instead
        self._paid_ahead = paid_ahead
        self._secret = secret
        self._throttle = throttle
        self._replays = replays
        self._clock = clock
        self._sid_lifetime = sid_lifetime

    def step(self, params: Mapping[str, str], client: str) -> Authenticated | Challenge:
        """Answer a client-first (no ``sid``) or a client-final (with the ``sid`` we sent).

        Args:
            params: the auth-params of the ``Authorization`` header, already checked to be
                among `SCRAM_PARAMS`.
            client: the source address.
        """
        data = params.get("data")
        if data is None:
            why = f"malformed Authorization header: {MECHANISM} needs data=<base64>"
            return self._throttle.refuse("SCRAM without data", client=client, detail=why)
        try:
            message = b64decode_text(data)
        except ValueError as exc:
            why = f"malformed Authorization header: {MECHANISM} data: {exc}"
            return self._throttle.refuse(why, client=client, detail=why)
        sid = params.get("sid")
        if sid is None:
            return self._first(message, client)
        return self._final(sid, message, client)

    def _first(self, client_first: str, client: str) -> Challenge:
        try:
            user, nonce, message = server_first(client_first, self._keys_for)
        except ScramFailure as exc:  # a malformed message: it holds no secret
            why = f"SCRAM client-first: {exc}"
            return self._throttle.refuse(why, client=client, detail=why)
        blocked = self._throttle.blocked(client, user)
        if blocked is not None:
            return blocked
        if self._paid_ahead():  # the offer and the server-first alike: one tells the other
            self._throttle.charge(client, user)
        instead = self._instead(user)
        if instead is not None:
            return instead
        state = SidState(user, client_first, nonce, self._clock() + self._sid_lifetime)
        sid = seal_sid(state, self._secret)
        header = f"{MECHANISM} sid={sid}, data={b64encode_text(message)}"
        # Only the SCRAM challenge here: hop-client matches this header as a whole.
        return Challenge(401, {"WWW-Authenticate": header}, "SCRAM server-first")

    def _final(self, sid: str, client_final: str, client: str) -> Authenticated | Challenge:
        try:
            state = open_sid(sid, self._secret, self._clock())
        except ValueError as exc:
            why = f"SCRAM sid refused ({exc}): start the exchange again"
            return self._throttle.refuse(f"SCRAM sid: {exc}", client=client, detail=why)
        # The nonce was signed by this gateway's secret: it names the exchange, however the
        # client spelled the sid around it.
        replay_key = hashlib.sha256(state.server_nonce.encode("utf-8")).hexdigest()
        if self._replays.seen(replay_key):
            return self._throttle.refuse("SCRAM final replayed", client=client, user=state.user)
        # The exchange's next step: its first leg is paid for from here on by what this
        # one costs (checked after, so that logins under way at the limit still finish).
        self._throttle.settle(client, state.user)
        blocked = self._throttle.blocked(client, state.user)
        if blocked is not None:
            return blocked
        try:
            message = server_final(state, client_final, self._keys_for)
        except ScramFailure as exc:
            return self._wrong_proof(sid, state.user, exc, client)
        claimed = self._replays.claim(replay_key, state.expires)
        if claimed is False:
            return self._throttle.refuse("SCRAM final replayed", client=client, user=state.user)
        if claimed is not True:
            return Challenge(429, {"Retry-After": str(claimed)}, "replay guard full")
        self._throttle.succeeded(state.user, client)
        info = f"sid={sid}, data={b64encode_text(message)}"
        return Authenticated(state.user, {"Authentication-Info": info}, MECHANISM)

    def _wrong_proof(self, sid: str, user: str, exc: ScramFailure, client: str) -> Challenge:
        refusal = self._throttle.refuse(f"SCRAM user {user!r}: {exc}", client=client, user=user)
        error = exc.error or "other-error"
        info = f"sid={sid}, data={b64encode_text(f'e={error}')}"
        # The RFC 5802 server-error lets the client say "invalid-proof" rather than
        # complain about a missing server-final.
        return Challenge(401, {**refusal.headers, "Authentication-Info": info}, refusal.reason)
