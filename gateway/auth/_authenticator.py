"""HTTP authentication and topic authorization from mosquitto's own password and ACL files.

The package's facade: it turns an ``Authorization`` header into :class:`Authenticated` or
:class:`Challenge`, and answers the ACL for a topic. Framework-free; ``gateway.http._authz``
adapts it. The stateful parts live in their own modules: the watched credentials files
(``_credentials``), the lockout policy (``_throttle``, which explains why failures count
per address and per (user, address) but never per user alone) and the SCRAM round trips
with the replay guard (``_scram_exchange``). This class picks the mode and the schemes from
what is configured, sends each header to its scheme, and keeps every error from the
network inside :meth:`Authenticator.authenticate`.

Schemes:

* ``SCRAM-SHA-512`` (RFC 7804), always offered when a password file is set. Users whose entry
  cannot do SCRAM (``$6$``, or fewer than 4096 iterations) fail it like a wrong password over
  plain HTTP; where Basic is taken (TLS) their client-first gets a 401 offering Basic alone,
  so that a client can find the way in (`Authenticator._basic_instead` says why that tells
  nothing Basic does not, at no lower price: there every client-first is charged to its
  address until the login's next step). The log names them and the fix.
* ``Basic``, only when the gateway is reached over TLS (``tls=True``): the password then
  crosses the wire, which plain HTTP must not carry. Works for every user in the file and is
  the only way in for the users SCRAM cannot serve. Sent over plain HTTP it is refused with a
  ``detail`` saying why and what to do instead (``PLAIN_HTTP_DETAIL``), not checked.
* ``Bearer``, only over TLS and with a tokens file (see ``_tokens.py``) or JWT keys (see
  ``_jwt.py``: a credential shaped like a JWT goes to the verifier, anything else to the
  tokens file); with those and no password source it is the only scheme ("tokens only").

The passwords come from mosquitto's ``password_file`` or from the dynamic security
plugin's file (``_dynsec.py``), never both; the topic rules from its ``acl_file`` or the
same dynamic security file. A JWT with an ``acl`` claim carries its own rules, which then
decide alone.

Without a password source and without tokens nobody is served, unless anonymous
access was asked for by name (``allow_anonymous``): a gateway that publishes with its own
broker account must not become an open door to the broker's topics by omission.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ._acl import READ, WRITE, base_topic
from ._credentials import Credentials
from ._decisions import CLOSED_DETAIL, Authenticated, AuthMode, Challenge
from ._jwt import JwtRefused, JwtVerifier, looks_like_jwt
from ._limits import ReplayGuard
from ._modes import check_options, mode, offered_schemes
from ._scram import MECHANISM, b64decode_text, parse_authorization
from ._scram_exchange import SCRAM_PARAMS, ScramExchange
from ._throttle import Throttle

log = logging.getLogger("gateway.auth")

# What a client sending a secret in clear over plain HTTP is told (the 401's `detail`):
# a person trying `curl -u` learns why, and what works instead.
PLAIN_HTTP_DETAIL = {
    "BASIC": "HTTP Basic authentication is refused over plain HTTP (the password would "
    "cross the network in clear): use HTTPS, or SCRAM-SHA-512 (the offload CLI's "
    "--username/--password and hop-client speak it); if a TLS-terminating proxy serves this "
    "gateway over HTTPS, set OFFLOAD_TLS=true on the gateway",
    "BEARER": "Bearer tokens are refused over plain HTTP (the token would cross the network "
    "in clear): use HTTPS; if a TLS-terminating proxy serves this gateway over HTTPS, set "
    "OFFLOAD_TLS=true on the gateway",
}


# What a SCRAM client-first for a user whose entry cannot do SCRAM is told, over TLS.
SCRAM_IMPOSSIBLE_DETAIL = (
    "this user's password entry cannot do SCRAM-SHA-512 (fewer than 4096 PBKDF2 iterations, "
    "as mosquitto_ctrl and mosquitto_passwd write by default): log in with HTTP Basic over "
    "HTTPS (the offload client's default login does so by itself; OFFLOAD_HTTP_LOGIN=basic "
    "names it), or give the user a password hashed with 4096 or more iterations"
)

_BASIC_SHAPE = "malformed Authorization header: Basic takes base64 of UTF-8 `user:password`"


class Authenticator:
    """Authentication and authorization against mosquitto's files. Thread-safe.

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
        dynsec_file: the dynamic security plugin's file: users and rules (instead of
            ``password_file`` and ``acl_file``).
        dynsec_substitute: expand ``%c``/``%u`` in its ACLs (mosquitto 2.1).
        jwt: verifies JWT bearer tokens; like a tokens file, it needs ``tls``. Closed
            with the authenticator (:meth:`close`).
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
        dynsec_file: Path | None = None,
        dynsec_substitute: bool = False,
        jwt: JwtVerifier | None = None,
        clock: Callable[[], float] = time.time,
        sid_lifetime: float = 60.0,
        max_failures_per_user: int = 10,
        max_failures_per_address: int = 50,
        failure_window: float = 60.0,
        tracked_keys: int = 10_000,
        replay_capacity: int = 100_000,
    ) -> None:
        """Load the files (re-read later whenever they change)."""
        check_options(
            realm=realm,
            secret=secret,
            tls=tls,
            password_file=password_file,
            tokens_file=tokens_file,
            dynsec_file=dynsec_file,
            acl_file=acl_file,
            jwt=jwt is not None,
        )
        self.realm = realm
        self.tls = tls
        self.allow_anonymous = allow_anonymous
        self._jwt = jwt
        self._credentials = Credentials(
            password_file=password_file,
            acl_file=acl_file,
            tokens_file=tokens_file,
            secret=secret,
            dynsec_file=dynsec_file,
            dynsec_substitute=dynsec_substitute,
        )
        self._dynsec = dynsec_file is not None
        self._source = "dynamic security file" if self._dynsec else "ACL file"
        self._throttle = Throttle(
            challenge=self.challenge,
            max_failures_per_user=max_failures_per_user,
            max_failures_per_address=max_failures_per_address,
            failure_window=failure_window,
            tracked_keys=tracked_keys,
            clock=clock,
        )
        self._replays = ReplayGuard(capacity=replay_capacity, clock=clock)
        self._scram = ScramExchange(
            keys_for=self._credentials.scram_keys,
            secret=secret,
            throttle=self._throttle,
            replays=self._replays,
            clock=clock,
            sid_lifetime=sid_lifetime,
            instead=self._basic_instead,
            paid_ahead=self._takes_basic,
        )
        self._offer(
            passwords=password_file is not None or dynsec_file is not None,
            tokens=tokens_file is not None or jwt is not None,
        )

    def _offer(self, *, passwords: bool, tokens: bool) -> None:
        """The schemes and the mode the configured sources give (`_modes`)."""
        files = {"passwords": passwords, "tokens": tokens}
        self.mechanisms: tuple[str, ...] = offered_schemes(**files, tls=self.tls)
        # Offered over TLS but not here: refused with a reason that says so.
        self._tls_only = set(offered_schemes(**files, tls=True)) - set(self.mechanisms)
        self._www_authenticate = ", ".join(f'{s} realm="{self.realm}"' for s in self.mechanisms)
        self.mode = mode(**files, allow_anonymous=self.allow_anonymous)

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
        has_acl = self._credentials.has_acl
        if self.mode is AuthMode.CLOSED:
            return f"authentication: closed, every request is refused ({CLOSED_DETAIL})"
        if self.mode is AuthMode.ANONYMOUS:
            acl = "the ACL file's anonymous rules" if has_acl else "no ACL"
            return (
                "authentication: OFF (OFFLOAD_ALLOW_ANONYMOUS=true), every request is "
                f"served as anonymous under {acl}"
            )
        schemes = ", ".join(self.mechanisms) or "none over plain HTTP"
        anonymous = "allowed" if self.allow_anonymous else "refused"
        acl = self._source if has_acl else "no ACL file (full access when in)"
        jwt = "; JWT bearer tokens" if self._jwt is not None else ""
        return f"authentication: {self.mode.value} ({schemes}); anonymous {anonymous}; {acl}{jwt}"

    def problems(self) -> list[str]:
        """Why rules or keys in force are not those on disk or at the URL (for /healthz)."""
        jwt = self._jwt.problems() if self._jwt is not None else []
        return self._credentials.problems() + jwt

    def reloading(self) -> list[Future[Any]]:
        """The reloads of changed credentials files to wait for before deciding.

        Each file is parsed on a thread of its own when it changes (`_files.WatchedFile`);
        a caller on an event loop awaits these first (without blocking the loop), so that
        the decision uses the new version. A large file is not among them: it is decided
        by its last version until parsed.
        """
        keys = self._jwt.sources if self._jwt is not None else ()
        found: list[Future[Any]] = list(self._credentials.reloading())
        for source in keys:
            reload = source.reloading()
            if reload is not None:
                found.append(reload)
        return found

    def close(self) -> None:
        """Stop fetching JWT keys (a JWKS URL's thread)."""
        for source in self._jwt.sources if self._jwt is not None else ():
            source.close()

    # -- the public API ------------------------------------------------------------------

    def challenge(
        self, reason: str = "credentials required", detail: str | None = None
    ) -> Challenge:
        """A 401 offering every scheme this gateway accepts.

        Args:
            reason: for the log.
            detail: what the client is told, when it may know why (a credential it holds
                that is good but refused, such as an expired token); else the default.
        """
        if self.mode is AuthMode.CLOSED:  # no scheme to offer: say what to configure
            return Challenge(401, {}, reason, CLOSED_DETAIL)
        headers = {"WWW-Authenticate": self._www_authenticate}
        if detail is None:
            return Challenge(401, headers, reason)
        return Challenge(401, headers, reason, detail)

    def rules_in_force(self, who: Authenticated) -> str:
        """What decided (or would decide) the topic access of ``who``, in words for a 403.

        Args:
            who: the decision for this request.
        """
        if who.acl is not None and who.user is not None:
            claim = self._jwt.acl_claim if self._jwt is not None else "acl"
            return f"the token's {claim!r} claim"
        return "the dynamic security file's roles" if self._dynsec else "the ACL file"

    @staticmethod
    def hashes(authorization: str | None) -> bool:
        """Whether deciding about `authorization` may take a password hash (HTTP Basic: a
        PBKDF2 of thousands of rounds), so belongs off the event loop. Everything else
        (none, Bearer, SCRAM, anything malformed) is a few HMACs or a lookup at most.

        Args:
            authorization: the ``Authorization`` header, None when absent.
        """
        if not authorization:
            return False
        return authorization.lstrip(" \t")[:6].lower() == "basic "

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
            return self._throttle.refuse("malformed credentials", client=client)

    def can_read(self, user: str | None, topic: str) -> bool:
        """Whether ``user`` may fetch messages of ``topic`` (``+oversized`` is ignored).

        Args:
            user: from :class:`Authenticated`; None for anonymous.
            topic: the MQTT topic.
        """
        return self._credentials.allows(user, topic, READ)

    def can_write(self, user: str | None, topic: str) -> bool:
        """Whether ``user`` may upload messages for ``topic`` (``+oversized`` is ignored).

        Args:
            user: from :class:`Authenticated`; None for anonymous.
            topic: the MQTT topic.
        """
        return self._credentials.allows(user, topic, WRITE)

    def allows(self, who: Authenticated, topic: str, *, write: bool) -> bool:
        """Whether the caller ``authenticate`` admitted may upload (``write``) or fetch ``topic``.

        A JWT's ``acl`` claim decides alone; without one, the rules in force.

        Args:
            who: the decision for this request.
            topic: the MQTT topic (``+oversized`` is ignored).
            write: upload rather than fetch.
        """
        if who.acl is not None and who.user is not None:
            return who.acl.allows(who.user, base_topic(topic), write=write, client_id=who.client_id)
        access = WRITE if write else READ
        return self._credentials.allows(who.user, topic, access, client_id=who.client_id)

    # -- schemes -------------------------------------------------------------------------

    def _authenticate(self, authorization: str, client: str) -> Authenticated | Challenge:
        refuse = self._throttle.refuse
        # Failures only: a login's next step must settle its first leg before the charges
        # count (`_throttle`), or logins under way at the limit could never finish.
        blocked = self._throttle.blocked(client, None, charges=False)
        if blocked is not None:
            return blocked
        try:
            credentials = parse_authorization(authorization)
        except ValueError as exc:
            why = f"malformed Authorization header: {exc}"
            return refuse(why, client=client, detail=why)
        scheme = credentials.scheme
        if scheme not in {s.upper() for s in self.mechanisms}:
            if scheme in {s.upper() for s in self._tls_only}:
                why = PLAIN_HTTP_DETAIL[scheme]
                return refuse(f"scheme {scheme!r} refused without TLS", client=client, detail=why)
            offered = ", ".join(self.mechanisms)
            return refuse(
                f"scheme {scheme[:32]!r} not offered",
                client=client,
                detail=f"the Authorization scheme {scheme[:32]!r} is not offered here; this "
                f"gateway takes {offered}",
            )
        if scheme == MECHANISM:
            if credentials.token68 or not credentials.params.keys() <= SCRAM_PARAMS:
                why = f"malformed Authorization header: {MECHANISM} takes data, sid and realm"
                return refuse("SCRAM with unknown auth-params", client=client, detail=why)
            return self._scram.step(credentials.params, client)
        if credentials.params or not credentials.token68:
            why = f"malformed Authorization header: {scheme.title()} takes one token68 credential"
            return refuse(f"{scheme} without a token68 credential", client=client, detail=why)
        if scheme == "BASIC":
            return self._basic(credentials.token68, client)
        return self._bearer(credentials.token68, client)

    def _takes_basic(self) -> bool:
        return "Basic" in self.mechanisms

    def _basic_instead(self, user: str) -> Challenge | None:
        """The answer to a SCRAM client-first for a user whose entry cannot do SCRAM, when
        this gateway takes HTTP Basic (over TLS): a 401 offering Basic alone, so that a
        client finds the way that works (the offload client's default login does). None
        otherwise: over plain HTTP such a user gets decoys, as an unknown one does.

        It tells who has such an entry, which Basic over TLS tells too, by its timing (101
        PBKDF2 rounds against the 4096 an unknown user's check costs), as the broker does
        by its CONNECT timing (mosquitto hashes nothing for an unknown user); it never
        tells an unknown user from a SCRAM-capable one. Asking costs what a failed Basic
        login costs: here every client-first is charged to its address until the login's
        next step settles it (`_throttle`), so a caller that only asks gets 429 as soon as
        one guessing Basic passwords would.
        """
        if not self._takes_basic() or not self._credentials.scram_impossible(user):
            return None
        return Challenge(
            401,
            {"WWW-Authenticate": f'Basic realm="{self.realm}"'},
            f"SCRAM user {user!r}: its password entry cannot do SCRAM-SHA-512, Basic offered",
            SCRAM_IMPOSSIBLE_DETAIL,
        )

    def _basic(self, token: str, client: str) -> Authenticated | Challenge:
        refuse = self._throttle.refuse
        try:
            user, sep, password = b64decode_text(token).partition(":")
        except ValueError as exc:  # not echoed: the bytes may be a password
            return refuse(f"Basic: {exc}", client=client, detail=_BASIC_SHAPE)
        if not sep or not user:
            return refuse("Basic without user:password", client=client, detail=_BASIC_SHAPE)
        self._throttle.settle(client, user)  # the step a Basic offer invites (if one was made)
        blocked = self._throttle.blocked(client, user)
        if blocked is not None:
            return blocked
        matches = self._credentials.check_password(user, password)
        if matches is None:
            return refuse(f"Basic: unknown user {user!r}", client=client, user=user)
        if not matches:
            return refuse(f"Basic: wrong password for {user!r}", client=client, user=user)
        self._throttle.succeeded(user, client)
        return Authenticated(user, {}, "Basic")

    def _bearer(self, token: str, client: str) -> Authenticated | Challenge:
        if self._jwt is not None and (looks_like_jwt(token) or not self._credentials.has_tokens):
            return self._verify_jwt(self._jwt, token, client)
        user = self._credentials.token_user(token)
        if user is None:
            why = "the bearer token was refused: not a token this gateway knows"
            return self._throttle.refuse("Bearer: unknown token", client=client, detail=why)
        if self._credentials.disabled(user):
            return self._disabled(user, "a bearer token", client)
        return Authenticated(user, {}, "Bearer")

    def _disabled(self, user: str, how: str, client: str) -> Challenge:
        """A valid login of a client the dynamic security file disables: refused, whoever
        vouches for it (not counted as a failure: the credential itself is good)."""
        log.info("refused %s from %s: client %r is disabled", how, client, user)
        why = f"client {user!r} is disabled (in the dynamic security file)"
        return self.challenge(f"{how}: disabled client {user!r}", why)

    def _verify_jwt(
        self, verifier: JwtVerifier, token: str, client: str
    ) -> Authenticated | Challenge:
        try:
            identity = verifier.verify(token)
        except JwtRefused as exc:
            # Not counted as a failed attempt: a signature cannot be guessed, and a fleet's
            # expired tokens behind one proxy address must not lock the others out.
            log.info("refused a JWT from %s: %s", client, exc)
            # The holder of a token may learn why it is refused (expired, another audience):
            # nothing here is secret, and "log in with a password" would be the wrong advice.
            return self.challenge(f"JWT: {exc}", f"the bearer token (a JWT) was refused: {exc}")
        if self._credentials.disabled(identity.user):
            # Disabling a client in the dynamic security file shuts it out whoever vouches.
            return self._disabled(identity.user, "a JWT", client)
        return Authenticated(
            identity.user, {}, "Bearer", acl=identity.acl, client_id=identity.client_id
        )
