"""Identity and topic rules for each request: the broker's own password and ACL files.

Adapts `gateway.auth.Authenticator` to the routes' `Context.authorize_*` seam: the one HTTP
adapter of `gateway.auth`. Denials become 401 (with the SCRAM challenge) for anonymous
callers, who may hold credentials they did not send yet, and 403 for authenticated ones.

``Authentication-Info`` (SCRAM's server-final) must reach the client on every answer to a
SCRAM final, errors included: hop-client checks it before it even looks at the status, and
without it reports a broken handshake instead of the route's 403 or 404. `BrokerRules`
leaves it in ``request.state``, where `AuthenticationInfoMiddleware` adds it to every answer.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from client.protocol import Topic

from ..auth import (
    RELOAD_WAIT,
    Authenticated,
    Authenticator,
    AuthMode,
    Challenge,
    JwtVerifier,
    key_sources,
)
from ..core import Forbidden, Settings, TooManyRequests, Unauthorized, WorkerPool
from ..middleware import USER_SLOT_KEY, UserSlot

log = logging.getLogger("gateway.auth")

STATE_KEY = "auth_response_headers"
# Where `BrokerRules` leaves the authenticated user for the rest of the request.
_PRINCIPAL = "offload_principal"
# Where it keeps the whole decision: a SCRAM final is good for one check, so a route that
# authenticates before it reads its body (to learn the topic) is not asked twice.
_AUTHENTICATED = "offload_authenticated"


def principal_of(request: Request) -> str | None:
    """The user `BrokerRules.authorize` admitted for this request, None when anonymous."""
    principal = getattr(request.state, _PRINCIPAL, None)
    return principal if isinstance(principal, str) else None


def build_authenticator(settings: Settings) -> Authenticator:
    """The authenticator the settings ask for, and one line in the log saying which mode.

    Without a password file and a tokens file it refuses every request, unless
    `OFFLOAD_ALLOW_ANONYMOUS=true` was set (see `gateway.auth.AuthMode`).

    Raises:
        AuthConfigError: a file is missing or invalid, or bearer tokens only without TLS.
    """
    if settings.auth_secret is not None:
        secret = settings.auth_secret.get_secret_value().encode("utf-8")
    else:
        # Fine for one replica; several need the same secret to finish each other's SCRAM.
        if settings.password_file is not None:
            log.warning("OFFLOAD_AUTH_SECRET is not set: SCRAM sessions work on this replica only")
        secret = secrets.token_bytes(32)
    authenticator = Authenticator(
        password_file=settings.password_file,
        acl_file=settings.acl_file,
        realm=settings.auth_realm,
        secret=secret,
        tls=settings.tls or settings.tls_cert_file is not None,
        allow_anonymous=settings.allow_anonymous,
        tokens_file=settings.tokens_file,
        dynsec_file=settings.dynsec_file,
        dynsec_substitute=settings.dynsec_substitute,
        jwt=build_jwt_verifier(settings),
    )
    mode = authenticator.mode
    level = logging.WARNING if mode in (AuthMode.CLOSED, AuthMode.ANONYMOUS) else logging.INFO
    log.log(level, "%s", authenticator.describe())
    return authenticator


def build_jwt_verifier(settings: Settings) -> JwtVerifier | None:
    """The JWT verifier the settings ask for; None without any key source.

    Raises:
        AuthConfigError: a key file cannot be read or parsed, or the URL is not http(s).
    """
    sources = key_sources(
        jwks_file=settings.jwks_file,
        jwks_url=settings.jwks_url,
        secret_file=settings.jwt_secret_file,
        refresh=settings.jwks_refresh,
    )
    if not sources:
        return None
    return JwtVerifier(
        sources,
        issuer=settings.jwt_issuer,
        audience=settings.jwt_audience,
        leeway=settings.jwt_leeway,
        username_claim=settings.jwt_username_claim,
        acl_claim=settings.jwt_acl_claim,
        require_exp=settings.jwt_require_exp,
    )


def _refuse(challenge: Challenge, client: str = "") -> Unauthorized | TooManyRequests:
    if challenge.status == 429:
        log.info("refused %s: %s", client or "a request", challenge.reason)
        return TooManyRequests(challenge.detail, dict(challenge.headers))
    return Unauthorized(challenge.detail, dict(challenge.headers))


class BrokerRules:
    """The `Authorizer` the routes call: authenticate, then check the ACL for the topic."""

    def __init__(self, authenticator: Authenticator, *, hashing: WorkerPool) -> None:
        self.authenticator = authenticator
        self.hashing = hashing  # its own pool: a login flood never starves store calls

    async def authenticate(self, request: Request) -> str | None:
        """Who sent `request` (401 with the challenge, or 429, otherwise); decided once.

        Routes whose topic is inside their body (`/direct/commit`) call this before reading
        it, so SCRAM's body-less first round trip gets its challenge, not a 400.
        """
        return (await self._authenticated(request)).user

    async def _authenticated(self, request: Request) -> Authenticated:
        done = getattr(request.state, _AUTHENTICATED, None)
        if isinstance(done, Authenticated):
            return done
        client = request.client.host if request.client is not None else ""
        header = request.headers.get("authorization")
        await self._reloaded()
        # Off the event loop only when it may hash a password (HTTP Basic: a 4096-round
        # PBKDF2). Anything else decides in microseconds, less than a thread hop costs.
        authenticate = self.authenticator.authenticate
        if self.authenticator.hashes(header):
            result = await self.hashing.run(authenticate, header, client=client)
        else:
            result = authenticate(header, client=client)
        if isinstance(result, Challenge):
            raise _refuse(result)
        # Who this is, for resources that belong to a principal (resumable uploads).
        setattr(request.state, _PRINCIPAL, result.user)
        setattr(request.state, _AUTHENTICATED, result)
        if result.response_headers:  # SCRAM's server-final reaches the client on every answer
            setattr(request.state, STATE_KEY, dict(result.response_headers))
        # An upload counts against its user too, from whichever address (middleware/_limits).
        slot = getattr(request.state, USER_SLOT_KEY, None)
        if isinstance(slot, UserSlot) and result.user is not None and not slot.take(result.user):
            log.info("refused %s: too many uploads by %r under way", client, result.user)
            raise TooManyRequests(
                f"too many concurrent uploads by user {result.user!r}", {"Retry-After": "1"}
            )
        return result

    async def _reloaded(self) -> None:
        """Wait, off the event loop, for the reloads of changed credentials files (small
        ones: a large one decides by its last version meanwhile, `gateway.auth._files`)."""
        pending = self.authenticator.reloading()
        if pending:
            await asyncio.wait([asyncio.wrap_future(f) for f in pending], timeout=RELOAD_WAIT)

    async def authorize(self, request: Request, topic: Topic, *, write: bool) -> None:
        result = await self._authenticated(request)
        extra = dict(result.response_headers)
        if self.authenticator.allows(result, topic.value, write=write):
            return
        access = "write" if write else "read"
        if result.user is None and self.authenticator.enabled:
            raise _refuse(self.authenticator.challenge(f"anonymous may not {access} {topic}"))
        # A read is of a stored message, whose topic the caller need not know (it may hold
        # just the id): the refusal does not name it. A write names the caller's own topic.
        what = f"topic {topic.value!r}" if write else "this message's topic"
        rules = self.authenticator.rules_in_force(result)
        raise Forbidden(f"not allowed to {access} {what} (decided by {rules})", extra)


class AuthenticationInfoMiddleware:
    """Adds the authentication's response headers to answers that lack them (errors)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # One dict shared with the request, which may be a copy of this scope.
        state: dict[str, Any] = scope.setdefault("state", {})

        async def send_with_headers(message: Message) -> None:
            extra = state.get(STATE_KEY)
            if message["type"] == "http.response.start" and extra:
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                for name, value in extra.items():
                    if name.lower().encode("latin-1") not in present:
                        headers.append((name.encode("latin-1"), value.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
