"""What the authenticator decides, and which mode a gateway is in. Pure values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from ._claim_acl import ClaimAcl

CLOSED_DETAIL = (
    "this gateway has no credentials configured and serves nobody: set "
    "OFFLOAD_PASSWORD_FILE or OFFLOAD_DYNSEC_FILE, and/or OFFLOAD_TOKENS_FILE or JWT keys "
    "(OFFLOAD_JWKS_FILE, OFFLOAD_JWKS_URL, OFFLOAD_JWT_SECRET_FILE), or "
    "OFFLOAD_ALLOW_ANONYMOUS=true to serve without authentication"
)


class AuthMode(Enum):
    """How a gateway decides who is calling, from which files and flags are set."""

    PASSWORDS = "passwords"  # password or dynsec file (SCRAM, Basic over TLS), maybe Bearer too
    TOKENS = "tokens"  # tokens file and/or JWT keys only: Bearer over TLS
    ANONYMOUS = "anonymous"  # no credentials files, OFFLOAD_ALLOW_ANONYMOUS=true: no checks
    CLOSED = "closed"  # no credentials files, anonymous not allowed: every request is a 401


@dataclass(frozen=True, slots=True)
class Authenticated:
    """Let the request through as ``user`` (None: anonymous) and add ``response_headers``.

    A JWT may carry its own topic rules (``acl``, which then decide alone) and a client id
    (``client_id``, for ``%c`` / ``${clientid}`` in rules).
    """

    user: str | None
    response_headers: Mapping[str, str] = field(default_factory=dict)
    mechanism: str | None = None
    acl: ClaimAcl | None = None
    client_id: str | None = None


@dataclass(frozen=True, slots=True)
class Challenge:
    """Refuse the request: ``status`` 401 (with ``WWW-Authenticate``) or 429 (``Retry-After``).

    ``reason`` is for the gateway's log; it may name a user, so it is not sent to clients.
    ``detail`` is what the client is told.
    """

    status: int
    headers: Mapping[str, str]
    reason: str
    detail: str = "authentication required"

    def __post_init__(self) -> None:
        if self.status not in (401, 429):
            raise ValueError("a challenge is a 401 or a 429")
