"""The account a device's shares count against (:mod:`proxy._shares`).

With a password login it is the CONNECT's user name, which the broker checked with the
password. With a JWT as the password (EMQX, HiveMQ, mosquitto-go-auth: the device's login
for the gateway is then the same token, :func:`proxy._gateway.credentials`) the user name
is whatever the device wrote: such brokers check the token and may ignore the name. So the
account is the token's user claim, as the gateway reads it (`OFFLOAD_JWT_USERNAME_CLAIM`,
`sub` by default), never a name a device with its own valid token could borrow to spend
another account's share. The token is read without checking its signature: it counts only
once the broker accepted the login (:attr:`proxy._state.Conn.holder`), and the gateway
verifies it on every request.
"""

from __future__ import annotations

import base64
import binascii
import json

import httpx

from client import BearerAuth

from .protocol import Connect

#: An account name longer than this is no account (the gateway's bound on a token's user).
MAX_ACCOUNT = 1024


def token_claim(token: str, claim: str) -> str | None:
    """The string ``claim`` of a compact JWS's payload, unverified; None if there is none.

    Args:
        token: ``header.payload.signature``, base64url parts.
        claim: the claim's name.
    """
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    value = payload.get(claim) if isinstance(payload, dict) else None
    return value if isinstance(value, str) and 0 < len(value) <= MAX_ACCOUNT else None


def account(connect: Connect, auth: httpx.Auth | None, claim: str) -> str | None:
    """Whose share a connection's transfers count against, once its login is accepted.

    Args:
        connect: the CONNECT, with its password.
        auth: the login the gateway gets for it (a bearer token: the password is a JWT).
        claim: the token claim naming the user.
    """
    if isinstance(auth, BearerAuth) and connect.password is not None:
        subject = token_claim(connect.password.decode("utf-8", "replace"), claim)
        if subject is not None:
            return subject
    return connect.username
