"""HTTP authentication and topic authorization from mosquitto's own password and ACL files.

The one stateful object of the package: it owns the watched files, the failure limits and
the used-sid set, and turns an ``Authorization`` header into :class:`Authenticated` or
:class:`Challenge`. Framework-free; ``gateway._authz`` adapts it.

Schemes:

* ``SCRAM-SHA-512`` (RFC 7804), always offered when a password file is set. Users whose entry
  cannot do SCRAM (``$6$``, or fewer than 4096 iterations) fail it like a wrong password; the
  log names them and the fix.
* ``Basic``, only when the gateway is reached over TLS (``tls=True``): the password then
  crosses the wire, which plain HTTP must not carry. Works for every user in the file and is
  the only way in for the users SCRAM cannot serve.
* ``Bearer``, only over TLS and with a tokens file (see ``_tokens.py``); with a tokens file
  and no password file it is the only scheme ("tokens only").

Without a password file and without a tokens file nobody is served, unless anonymous
access was asked for by name (``allow_anonymous``): a gateway that publishes with its own
broker account must not become an open door to the broker's topics by omission.

Failed attempts are counted per source address and per (user, address) pair; past the
limit the answer is 429 with ``Retry-After`` instead of a challenge, which tells a person
at a terminal what is going on and costs an attacker a wait. While a pair is blocked even
the right password is refused from that address, otherwise the block would not slow
guessing down. There is deliberately no per-user limit across addresses: it would let
anyone who knows a user name lock that user out of the gateway, and it would buy little,
since the broker itself (mosquitto) never limits CONNECT attempts for the same password
file. A guesser spread over many addresses is slowed only by the password's strength.

Replay protection of SCRAM finals keys on the server nonce inside the verified sid, so no
re-spelling of the sid (or of anything else in the header) makes a captured final new.
It is per process: another replica accepts a captured final once, within the sid's
lifetime (60 s by default) - use TLS.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ._acl import READ, WRITE, Acl, AclSyntaxError, base_topic, parse_acl
from ._decisions import CLOSED_DETAIL, Authenticated, AuthMode, Challenge
from ._exceptions import AuthConfigError
from ._files import WatchedFile
from ._limits import FailureLimiter, ReplayGuard
from ._passwd import (
    SCRAM_MIN_ITERATIONS,
    UPGRADE_HINT,
    PasswordEntry,
    PasswordFile,
    ScramKeys,
    parse_password_file,
)
from ._scram import (
    MECHANISM,
    ScramFailure,
    SidState,
    b64decode_text,
    b64encode_text,
    open_sid,
    parse_authorization,
    seal_sid,
    server_final,
    server_first,
)
from ._tokens import parse_tokens_file, token_digest

log = logging.getLogger("gateway.auth")

MIN_SECRET_BYTES = 16
# SCRAM auth-params a client may send (RFC 7804: realm, data, sid); anything else is junk.
_SCRAM_PARAMS = frozenset({"realm", "data", "sid"})
# Hashed when a Basic user does not exist, so that the answer takes as long as for one who does.
_DUMMY = PasswordEntry("-", "sha512-pbkdf2", b"\0" * 12, b"\0" * 64, SCRAM_MIN_ITERATIONS)


def _parse_acl_file(text: str) -> Acl:
    try:
        return parse_acl(text)
    except AclSyntaxError as exc:
        raise AuthConfigError(str(exc)) from exc


class Authenticator:
    """Authentication and authorization against mosquitto's files. Thread-safe."""

    def __init__(
        self,
        *,
        password_file: Path | None,
        acl_file: Path | None,
        realm: str,
        secret: bytes,
        tls: bool,
        allow_anonymous: bool,
        tokens_file: Path | None = None,
        clock: Callable[[], float] = time.time,
        sid_lifetime: float = 60.0,
        max_failures_per_user: int = 10,
        max_failures_per_address: int = 50,
        failure_window: float = 60.0,
        tracked_keys: int = 10_000,
        replay_capacity: int = 100_000,
    ) -> None:
        """Load the files (re-read later whenever they change).

        Args:
            password_file: mosquitto's ``password_file``; with neither it nor ``tokens_file``
                every request is refused unless ``allow_anonymous``.
            acl_file: mosquitto's ``acl_file``; None lets every caller who gets in read and
                write everything (as mosquitto does without one).
            realm: the ``realm`` of the challenges.
            secret: signs SCRAM sids; the same value on every replica, at least 16 bytes.
            tls: clients reach the gateway over TLS (directly or through a proxy); enables
                Basic and Bearer.
            allow_anonymous: requests without credentials pass as user None (and the ACL's
                anonymous rules apply); the only way to serve without credentials files.
            tokens_file: bearer tokens (``user:<sha256 hex>``); alone, the gateway takes
                bearer tokens only, which needs ``tls``.
            clock: wall-clock seconds, common to the replicas (sid expiry crosses them).
            sid_lifetime: seconds a client has between server-first and client-final.
            max_failures_per_user: failures per (user, address) and window before 429.
            max_failures_per_address: failures per source address and window before 429.
            failure_window: seconds of the failure-counting window.
            tracked_keys: most users/addresses whose failures are remembered at once.
            replay_capacity: most used sids remembered at once.

        Raises:
            AuthConfigError: a file is missing or invalid, or tokens only without ``tls``.
            ValueError: bad arguments (short secret, realm with a quote, ...).
        """
        if '"' in realm or "\\" in realm or not realm.isprintable():
            raise ValueError("realm must be printable and hold no quote or backslash")
        if password_file is not None and len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"the secret must be at least {MIN_SECRET_BYTES} bytes")
        if tokens_file is not None and password_file is None and not tls:
            # Bearer tokens never cross plain HTTP, so this gateway could serve nobody.
            raise AuthConfigError(
                "a tokens file without a password file takes bearer tokens only, and those "
                "are refused without TLS: set OFFLOAD_TLS=true (HTTPS proxy in front) or "
                "OFFLOAD_TLS_CERT_FILE, or add OFFLOAD_PASSWORD_FILE for SCRAM",
                path=tokens_file,
            )
        self.realm = realm
        self.tls = tls
        self.allow_anonymous = allow_anonymous
        self._secret = secret
        self._clock = clock
        self._sid_lifetime = sid_lifetime
        self._warned: set[str] = set()
        self._passwords = (
            WatchedFile(
                password_file,
                parse_password_file,
                fallback=PasswordFile({}),
                on_load=self._loaded_passwords,
            )
            if password_file is not None
            else None
        )
        self._acl = (
            WatchedFile(acl_file, _parse_acl_file, fallback=Acl()) if acl_file is not None else None
        )
        no_tokens: Mapping[str, str] = {}
        self._tokens = (
            WatchedFile(tokens_file, parse_tokens_file, fallback=no_tokens)
            if tokens_file is not None
            else None
        )
        self._users = FailureLimiter(
            limit=max_failures_per_user, window=failure_window, capacity=tracked_keys, clock=clock
        )
        self._addresses = FailureLimiter(
            limit=max_failures_per_address,
            window=failure_window,
            capacity=tracked_keys,
            clock=clock,
        )
        self._replays = ReplayGuard(capacity=replay_capacity, clock=clock)
        schemes = [MECHANISM] if password_file is not None else []
        if tls and password_file is not None:
            schemes.append("Basic")
        if tls and tokens_file is not None:
            schemes.append("Bearer")
        self.mechanisms: tuple[str, ...] = tuple(schemes)
        self._www_authenticate = ", ".join(f'{s} realm="{realm}"' for s in schemes)
        if password_file is not None:
            self.mode = AuthMode.PASSWORDS
        elif tokens_file is not None:
            self.mode = AuthMode.TOKENS
        else:
            self.mode = AuthMode.ANONYMOUS if allow_anonymous else AuthMode.CLOSED

    def __repr__(self) -> str:
        return (
            f"Authenticator(realm={self.realm!r}, mechanisms={self.mechanisms!r}, "
            f"tls={self.tls}, allow_anonymous={self.allow_anonymous}, mode={self.mode.value})"
        )

    @property
    def enabled(self) -> bool:
        """Whether credentials are checked at all (a password or tokens file is set)."""
        return self.mode in (AuthMode.PASSWORDS, AuthMode.TOKENS)

    def describe(self) -> str:
        """One line for the start-up log: who gets in and how."""
        if self.mode is AuthMode.CLOSED:
            return f"authentication: closed, every request is refused ({CLOSED_DETAIL})"
        if self.mode is AuthMode.ANONYMOUS:
            acl = "the ACL file's anonymous rules" if self._acl is not None else "no ACL"
            return (
                "authentication: OFF (OFFLOAD_ALLOW_ANONYMOUS=true), every request is "
                f"served as anonymous under {acl}"
            )
        schemes = ", ".join(self.mechanisms) or "none over plain HTTP"
        anonymous = "allowed" if self.allow_anonymous else "refused"
        acl = "ACL file" if self._acl is not None else "no ACL file (full access when in)"
        return f"authentication: {self.mode.value} ({schemes}); anonymous {anonymous}; {acl}"

    # -- file events ---------------------------------------------------------------------

    def _loaded_passwords(self, passwords: PasswordFile) -> None:
        self._warned.clear()
        for problem in passwords.problems:
            log.warning("password file: %s", problem)
        weak = passwords.weak_users
        if weak:
            log.warning(
                "password file: %d user(s) cannot use SCRAM-SHA-512 (sha512 entries or fewer "
                "than %d iterations): %s; they can only use HTTP Basic over TLS. Fix: %s",
                len(weak),
                SCRAM_MIN_ITERATIONS,
                ", ".join(weak),
                UPGRADE_HINT,
            )

    # -- the public API ------------------------------------------------------------------

    def challenge(self, reason: str = "credentials required") -> Challenge:
        """A 401 offering every scheme this gateway accepts.

        Args:
            reason: for the log.
        """
        if self.mode is AuthMode.CLOSED:  # no scheme to offer: say what to configure
            return Challenge(401, {}, reason, CLOSED_DETAIL)
        return Challenge(401, {"WWW-Authenticate": self._www_authenticate}, reason)

    def authenticate(self, authorization: str | None, *, client: str) -> Authenticated | Challenge:
        """Decide about one request's credentials. Never raises.

        Args:
            authorization: the ``Authorization`` header, None when absent.
            client: the source address, for the failure limits.
        """
        if self.mode is AuthMode.ANONYMOUS:
            return Authenticated(None)
        if self.mode is AuthMode.CLOSED:
            return self.challenge("no credentials configured")
        if not authorization:
            if self.allow_anonymous:
                return Authenticated(None)
            return self.challenge()
        try:
            return self._authenticate(authorization, client)
        except Exception:  # the boundary: no input from the network may escape as an error
            log.exception("unexpected error while authenticating a request from %s", client)
            self._addresses.failed(f"addr:{client}")
            return self.challenge("malformed credentials")

    def can_read(self, user: str | None, topic: str) -> bool:
        """Whether ``user`` may fetch messages of ``topic`` (``+oversized`` is ignored).

        Args:
            user: from :class:`Authenticated`; None for anonymous.
            topic: the MQTT topic.
        """
        return self._allows(user, topic, READ)

    def can_write(self, user: str | None, topic: str) -> bool:
        """Whether ``user`` may upload messages for ``topic`` (``+oversized`` is ignored).

        Args:
            user: from :class:`Authenticated`; None for anonymous.
            topic: the MQTT topic.
        """
        return self._allows(user, topic, WRITE)

    def _allows(self, user: str | None, topic: str, access: int) -> bool:
        if self._acl is None:
            return True
        return self._acl.get().allows(user, base_topic(topic), access)

    # -- schemes -------------------------------------------------------------------------

    def _refuse(self, reason: str, *, client: str, user: str | None = None) -> Challenge:
        self._addresses.failed(f"addr:{client}")
        if user is not None:
            self._users.failed(_user_key(user, client))
        return self.challenge(reason)

    def _blocked(self, client: str, user: str | None) -> Challenge | None:
        wait = self._addresses.retry_after(f"addr:{client}")
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

    def _authenticate(self, authorization: str, client: str) -> Authenticated | Challenge:
        blocked = self._blocked(client, None)
        if blocked is not None:
            return blocked
        try:
            credentials = parse_authorization(authorization)
        except ValueError as exc:
            return self._refuse(f"malformed Authorization header: {exc}", client=client)
        scheme = credentials.scheme
        if scheme not in {s.upper() for s in self.mechanisms}:
            why = "refused without TLS" if scheme in ("BASIC", "BEARER") else "not offered"
            return self._refuse(f"scheme {scheme[:32]!r} {why}", client=client)
        if scheme == MECHANISM:
            if credentials.token68 or not credentials.params.keys() <= _SCRAM_PARAMS:
                return self._refuse("SCRAM with unknown auth-params", client=client)
            return self._scram(credentials.params, client)
        if credentials.params or not credentials.token68:
            return self._refuse(f"{scheme} without a token68 credential", client=client)
        if scheme == "BASIC":
            return self._basic(credentials.token68, client)
        return self._bearer(credentials.token68, client)

    def _scram(self, params: Mapping[str, str], client: str) -> Authenticated | Challenge:
        data = params.get("data")
        if data is None:
            return self._refuse("SCRAM without data", client=client)
        try:
            message = b64decode_text(data)
        except ValueError as exc:
            return self._refuse(f"SCRAM data: {exc}", client=client)
        sid = params.get("sid")
        if sid is None:
            return self._scram_first(message, client)
        return self._scram_final(sid, message, client)

    def _scram_first(self, client_first: str, client: str) -> Challenge:
        try:
            user, nonce, message = server_first(client_first, self._keys_for)
        except ScramFailure as exc:
            return self._refuse(f"SCRAM client-first: {exc}", client=client)
        blocked = self._blocked(client, user)
        if blocked is not None:
            return blocked
        state = SidState(user, client_first, nonce, self._clock() + self._sid_lifetime)
        sid = seal_sid(state, self._secret)
        header = f"{MECHANISM} sid={sid}, data={b64encode_text(message)}"
        # Only the SCRAM challenge here: hop-client matches this header as a whole.
        return Challenge(401, {"WWW-Authenticate": header}, "SCRAM server-first")

    def _scram_final(self, sid: str, client_final: str, client: str) -> Authenticated | Challenge:
        try:
            state = open_sid(sid, self._secret, self._clock())
        except ValueError as exc:
            return self._refuse(f"SCRAM sid: {exc}", client=client)
        # The nonce was signed by this gateway's secret: it names the exchange, however the
        # client spelled the sid around it.
        replay_key = hashlib.sha256(state.server_nonce.encode("utf-8")).hexdigest()
        if self._replays.seen(replay_key):
            return self._refuse("SCRAM final replayed", client=client, user=state.user)
        blocked = self._blocked(client, state.user)
        if blocked is not None:
            return blocked
        try:
            message = server_final(state, client_final, self._keys_for)
        except ScramFailure as exc:
            refusal = self._refuse(
                f"SCRAM user {state.user!r}: {exc}", client=client, user=state.user
            )
            error = exc.error or "other-error"
            info = f"sid={sid}, data={b64encode_text(f'e={error}')}"
            # The RFC 5802 server-error lets the client say "invalid-proof" rather than
            # complain about a missing server-final.
            return Challenge(401, {**refusal.headers, "Authentication-Info": info}, refusal.reason)
        claimed = self._replays.claim(replay_key, state.expires)
        if claimed is False:
            return self._refuse("SCRAM final replayed", client=client, user=state.user)
        if claimed is not True:
            return Challenge(429, {"Retry-After": str(claimed)}, "replay guard full")
        self._users.reset(_user_key(state.user, client))
        info = f"sid={sid}, data={b64encode_text(message)}"
        return Authenticated(state.user, {"Authentication-Info": info}, MECHANISM)

    def _basic(self, token: str, client: str) -> Authenticated | Challenge:
        try:
            user, sep, password = b64decode_text(token).partition(":")
        except ValueError as exc:
            return self._refuse(f"Basic: {exc}", client=client)
        if not sep or not user:
            return self._refuse("Basic without user:password", client=client)
        blocked = self._blocked(client, user)
        if blocked is not None:
            return blocked
        assert self._passwords is not None  # only called with authentication on
        entry = self._passwords.get().get(user)
        if entry is None:
            _DUMMY.verify(password)
            return self._refuse(f"Basic: unknown user {user!r}", client=client, user=user)
        if not entry.verify(password):
            return self._refuse(f"Basic: wrong password for {user!r}", client=client, user=user)
        self._users.reset(_user_key(user, client))
        return Authenticated(user, {}, "Basic")

    def _bearer(self, token: str, client: str) -> Authenticated | Challenge:
        assert self._tokens is not None
        # A dict lookup by the token's SHA-256: its timing says nothing about stored tokens.
        user = self._tokens.get().get(token_digest(token)) if token else None
        if user is None:
            return self._refuse("Bearer: unknown token", client=client)
        return Authenticated(user, {}, "Bearer")

    # -- SCRAM keys ----------------------------------------------------------------------

    def _keys_for(self, user: str) -> ScramKeys:
        assert self._passwords is not None
        passwords = self._passwords.get()
        entry = passwords.get(user)
        keys = entry.scram_keys() if entry is not None else None
        if keys is not None:
            return keys
        if entry is not None and user not in self._warned:
            self._warned.add(user)
            log.warning(
                "user %r tried SCRAM-SHA-512 but its password entry cannot do it "
                "(%s, %d iterations); %s",
                user,
                entry.scheme,
                entry.iterations,
                UPGRADE_HINT,
            )
        # Decoy keys, stable per user, so a probe cannot tell unknown users from known ones.
        seed = hmac.digest(self._secret, b"decoy\0" + user.encode("utf-8"), "sha512")
        return ScramKeys(seed[:12], passwords.typical_iterations, seed, seed[::-1])


def _user_key(user: str, client: str) -> str:
    return f"user:{client}\0{user}"
