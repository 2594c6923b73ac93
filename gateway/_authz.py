"""Identity and topic rules for each request: the broker's own password and ACL files.

Adapts `gateway.auth.Authenticator` to the routes' `Context.authorize_*` seam. Denials
become 401 (with the SCRAM challenge) for anonymous callers, who may hold credentials
they did not send yet, and 403 for authenticated ones.
"""

from __future__ import annotations

import logging
import secrets

from fastapi import Request

from client.protocol import Topic

from ._errors import Forbidden, TooManyRequests, Unauthorized
from ._executors import WorkerPool
from ._settings import Settings
from .auth import Authenticator, AuthMode, Challenge
from .auth._fastapi import STATE_KEY

log = logging.getLogger("gateway.auth")


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
    )
    mode = authenticator.mode
    level = logging.WARNING if mode in (AuthMode.CLOSED, AuthMode.ANONYMOUS) else logging.INFO
    log.log(level, "%s", authenticator.describe())
    return authenticator


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

    async def authorize(self, request: Request, topic: Topic, *, write: bool) -> None:
        client = request.client.host if request.client is not None else ""
        header = request.headers.get("authorization")
        # Off the event loop: HTTP Basic costs a 4096-round PBKDF2.
        result = await self.hashing.run(self.authenticator.authenticate, header, client=client)
        if isinstance(result, Challenge):
            raise _refuse(result)
        # Who this is, for resources that belong to a principal (resumable uploads).
        request.state.offload_principal = result.user
        extra = dict(result.response_headers)
        if extra:  # SCRAM's server-final reaches the client on every answer (middleware)
            setattr(request.state, STATE_KEY, extra)
        check = self.authenticator.can_write if write else self.authenticator.can_read
        if check(result.user, topic.value):
            return
        access = "write" if write else "read"
        if result.user is None and self.authenticator.enabled:
            raise _refuse(self.authenticator.challenge(f"anonymous may not {access} {topic}"))
        raise Forbidden(f"not allowed to {access} topic {topic.value!r}", extra)
