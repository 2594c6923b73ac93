"""The account a device's shares count against (:mod:`proxy._shares`).

With a password login it is the CONNECT's user name, which the broker checked with the
password. With a JWT as the password (EMQX, HiveMQ, mosquitto-go-auth: the device's login
for the gateway is then the same token, :func:`proxy._gateway.credentials`) the user name
is whatever the device wrote: such brokers check the token and may ignore the name. So the
account is the token's user claim, as the gateway reads it (`OFFLOAD_JWT_USERNAME_CLAIM`,
`sub` by default), never a name a device with its own valid token could borrow to spend
another account's share.

And only once the token is known to be genuine (:class:`Tokens`): a broker may accept a
login the gateway refuses (one that checks nothing, or not the signature), and 10 forged
tokens naming another device held all of that device's upload slots (issue 50). The
gateway is the authority that verifies tokens, on every request, so its answer is what
counts: a token is verified when the gateway stored an upload made with it (201), and
remembered as verified (bounded, until its `exp`) for that device's later connections.
Until then the device is held to its address's share alone, as an anonymous one. Verifying
at the proxy instead would need the gateway's keys and rules (secret, JWKS file or URL and
its rotation, issuer, audience, algorithms) kept in step with the gateway's by a second
configuration and a JOSE library, for an answer the gateway gives anyway.
"""

from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import json
import time
import weakref
from dataclasses import dataclass

import httpx

from client import BearerAuth

from .protocol import Connect

#: An account name longer than this is no account (the gateway's bound on a token's user).
MAX_ACCOUNT = 1024


#: Verified tokens remembered (the oldest forgotten first).
REMEMBERED_TOKENS = 4096


def _payload(token: str) -> dict[str, object] | None:
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def token_claim(token: str, claim: str) -> str | None:
    """The string ``claim`` of a compact JWS's payload, unverified; None if there is none.

    Args:
        token: ``header.payload.signature``, base64url parts.
        claim: the claim's name.
    """
    payload = _payload(token)
    value = payload.get(claim) if payload is not None else None
    return value if isinstance(value, str) and 0 < len(value) <= MAX_ACCOUNT else None


@dataclass(frozen=True, slots=True)
class _Claimed:
    """A token a connection logs in with: its digest, user claim and expiry (unverified)."""

    digest: bytes
    subject: str
    expires: float


class Tokens:
    """Which JWTs the gateway has accepted: their accounts count only then (see the module).

    Remembered by the token's SHA-256 (never the token), each until its `exp` (without
    one, until forgotten), at most :data:`REMEMBERED_TOKENS`, the oldest forgotten first.
    """

    def __init__(self, size: int = REMEMBERED_TOKENS) -> None:
        self._verified: collections.OrderedDict[bytes, tuple[str, float]] = (
            collections.OrderedDict()
        )
        self._size = size
        # A connection's login (its auth object, alive as long as the connection) -> claim.
        self._pending: weakref.WeakKeyDictionary[httpx.Auth, _Claimed] = weakref.WeakKeyDictionary()

    def account(self, token: str, auth: httpx.Auth, claim: str) -> str | None:
        """The token's account if the gateway has accepted the token already; else None,
        and :meth:`confirm` tells it once an upload with `auth` is stored."""
        subject = token_claim(token, claim)
        if subject is None:
            return None
        digest = hashlib.sha256(token.encode("utf-8", "replace")).digest()
        known = self._verified.get(digest)
        if known is not None and known[1] > time.time():
            self._verified.move_to_end(digest)
            return known[0]
        expires = (_payload(token) or {}).get("exp")
        until = float(expires) if isinstance(expires, int | float) else float("inf")
        self._pending[auth] = _Claimed(digest, subject, until)
        return None

    def confirm(self, auth: httpx.Auth | None) -> str | None:
        """The gateway stored an upload made with `auth`: its token is genuine. Its account,
        if it had one waiting for this."""
        claimed = self._pending.pop(auth, None) if auth is not None else None
        if claimed is None:
            return None
        self._verified[claimed.digest] = (claimed.subject, claimed.expires)
        self._verified.move_to_end(claimed.digest)
        while len(self._verified) > self._size:
            self._verified.popitem(last=False)
        return claimed.subject


def account(connect: Connect, auth: httpx.Auth | None, claim: str, tokens: Tokens) -> str | None:
    """Whose share a connection's transfers count against, once its login is accepted.

    Args:
        connect: the CONNECT, with its password.
        auth: the login the gateway gets for it (a bearer token: the password is a JWT).
        claim: the token claim naming the user.
        tokens: the tokens the gateway accepted; a JWT login not among them has no account
            until it is (:meth:`Tokens.confirm`).
    """
    if isinstance(auth, BearerAuth) and connect.password is not None:
        return tokens.account(connect.password.decode("utf-8", "replace"), auth, claim)
    return connect.username
