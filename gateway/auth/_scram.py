"""SCRAM-SHA-512 over HTTP (RFC 7804) without server-side session state. Pure, no I/O.

The exchange hop-client performs (``hop/http_scram.py``)::

    C: Authorization: SCRAM-SHA-512 data=<b64 client-first>       (first request: "shortcut")
    S: 401  WWW-Authenticate: SCRAM-SHA-512 sid=<sid>, data=<b64 server-first>
    C: Authorization: SCRAM-SHA-512 sid=<sid>,data=<b64 client-final>
    S: 2xx  Authentication-Info: sid=<sid>, data=<b64 server-final>

The server's state between the two round trips travels in the sid itself: the client-first
message, the server nonce and an expiry time, HMAC-SHA256-signed with a secret that every
gateway replica shares. Any replica can then finish an exchange another one started. The
RFC 5802 message checks and the proof arithmetic are scramp's (re-run from the sid's state:
the server-first message is a pure function of it and the password file).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from scramp import ScramException, ScramMechanism

from ._passwd import ScramKeys

MECHANISM = "SCRAM-SHA-512"
SID_VERSION = "v1"
MAX_HEADER = 4096
_SID_TAG = b"mqtt-offload scram sid v1\0"


class ScramFailure(ValueError):
    """The exchange cannot go on. ``.error`` is an RFC 5802 server-error value or None."""

    def __init__(self, message: str, error: str | None = None, user: str | None = None) -> None:
        super().__init__(message)
        self.error = error
        self.user = user


@dataclass(frozen=True, slots=True)
class Credentials:
    """An Authorization header, split: ``params`` for auth-param lists, else ``token68``."""

    scheme: str
    params: dict[str, str] = field(default_factory=dict)
    token68: str = ""


# RFC 9110 5.6.2 token characters; auth-param values here may also hold "/" and "=", which
# unquoted base64 needs (hop-client sends ``data=<base64>`` without quotes).
_TCHAR = r"!#$%&'*+\-.^_`|~0-9A-Za-z"
_TOKEN = re.compile(f"[{_TCHAR}]+")
_TOKEN68 = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_PARAM = re.compile(f'([{_TCHAR}]+)[ \t]*=[ \t]*(?:([{_TCHAR}/=]+)|"((?:[^"\\\\]|\\\\.)*)")[ \t]*')
_QUOTED_PAIR = re.compile(r"\\(.)")
_B64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
_B64URL = re.compile(r"[A-Za-z0-9_-]*")


def _header_text(value: str) -> bool:
    """Visible ASCII, blanks and tabs only (what RFC 9110 lets a client put in a header)."""
    return value.isascii() and all(" " <= ch < "\x7f" or ch == "\t" for ch in value)


def parse_authorization(value: str) -> Credentials:
    """Split an Authorization header into scheme and parameters, strictly (RFC 9110 11.4).

    Accepts hop-client's ``sid=...,data=...`` (no blank after the comma) as well as blanks
    and quoted values. The scheme is upper-cased, parameter names lower-cased. Anything
    else - non-ASCII or control characters, a name given twice, an empty list element,
    junk between parameters - is refused rather than guessed at: the parts of this header
    are what a replay guard and the proof checks key on, so one request must have one
    reading.

    Args:
        value: the header value.

    Raises:
        ValueError: empty, over MAX_HEADER characters, or not of that syntax.
    """
    if len(value) > MAX_HEADER:
        raise ValueError("Authorization header too long")
    if not _header_text(value):
        raise ValueError("Authorization header holds non-ASCII or control characters")
    scheme, _, rest = value.strip(" \t").partition(" ")
    if not scheme or _TOKEN.fullmatch(scheme) is None:
        raise ValueError("bad authentication scheme")
    rest = rest.strip(" \t")
    if not rest:
        return Credentials(scheme.upper())
    if _TOKEN68.fullmatch(rest) is not None:
        return Credentials(scheme.upper(), token68=rest)
    params: dict[str, str] = {}
    position = 0
    while True:
        match = _PARAM.match(rest, position)
        if match is None:
            raise ValueError("bad auth-param list")
        name = match.group(1).lower()
        if name in params:
            raise ValueError(f"auth-param {name[:32]!r} given twice")
        token, quoted = match.group(2), match.group(3)
        params[name] = token if token is not None else _QUOTED_PAIR.sub(r"\1", quoted)
        position = match.end()
        if position == len(rest):
            return Credentials(scheme.upper(), params=params)
        if rest[position] != ",":
            raise ValueError("bad auth-param list")
        position += 1
        while position < len(rest) and rest[position] in " \t":
            position += 1


def strict_b64decode(data: str) -> bytes:
    """Standard base64 with canonical padding and trailing bits; ValueError otherwise.

    ``base64.b64decode`` also takes missing or extra padding and non-zero trailing bits, so
    several spellings decode to one value. Only the one spelling ``b64encode`` produces
    passes here (checked by encoding again).
    """
    if _B64.fullmatch(data) is None:
        raise ValueError("bad base64 data")
    raw = base64.b64decode(data, validate=True)
    if base64.b64encode(raw).decode("ascii") != data:
        raise ValueError("non-canonical base64 data")
    return raw


def b64decode_text(data: str) -> str:
    """Strict base64 (:func:`strict_b64decode`) of UTF-8 text; ValueError for anything else."""
    try:
        return strict_b64decode(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"base64 data is not UTF-8: {exc}") from exc


def b64encode_text(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    """The inverse of :func:`_b64url`, refusing every other spelling of the same bytes."""
    if _B64URL.fullmatch(text) is None or len(text) % 4 == 1:
        raise ValueError("bad sid encoding")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError("bad sid encoding") from exc
    if _b64url(raw) != text:
        raise ValueError("non-canonical sid encoding")
    return raw


@dataclass(frozen=True, slots=True)
class SidState:
    """What the server must remember between server-first and client-final."""

    user: str
    client_first: str = field(repr=False)
    server_nonce: str = field(repr=False)
    expires: float


def seal_sid(state: SidState, secret: bytes) -> str:
    """Encode and sign the state: ``v1.<payload>.<mac>``, URL-safe base64 (an HTTP token).

    Args:
        state: what to carry.
        secret: the key shared by every replica.
    """
    payload = json.dumps(
        [state.user, state.client_first, state.server_nonce, state.expires],
        separators=(",", ":"),
    ).encode("utf-8")
    mac = hmac.digest(secret, _SID_TAG + payload, hashlib.sha256)
    return f"{SID_VERSION}.{_b64url(payload)}.{_b64url(mac)}"


def open_sid(sid: str, secret: bytes, now: float) -> SidState:
    """Check a sid's signature and expiry and return its state.

    Args:
        sid: as the client sent it back.
        secret: the shared key.
        now: the current time on the clock the expiry was set with.

    Raises:
        ValueError: malformed, forged or expired.
    """
    if len(sid) > MAX_HEADER:
        raise ValueError("sid too long")
    parts = sid.split(".")
    if len(parts) != 3 or parts[0] != SID_VERSION or not parts[1] or not parts[2]:
        raise ValueError("malformed sid")
    _, payload_text, mac_text = parts
    payload, mac = _unb64url(payload_text), _unb64url(mac_text)
    expected = hmac.digest(secret, _SID_TAG + payload, hashlib.sha256)
    if not hmac.compare_digest(mac, expected):
        raise ValueError("sid signature does not verify")
    user, client_first, server_nonce, expires = json.loads(payload)
    if expires <= now:
        raise ValueError("sid expired")
    return SidState(user, client_first, server_nonce, float(expires))


KeyLookup = Callable[[str], ScramKeys]


class _Server:
    """A scramp server that remembers which user name the client-first message named."""

    def __init__(self, lookup: KeyLookup, server_nonce: str) -> None:
        self.user: str | None = None
        self._lookup = lookup

        def auth_fn(user: str) -> tuple[bytes, bytes, bytes, int]:
            self.user = user
            keys = lookup(user)
            return keys.salt, keys.stored_key, keys.server_key, keys.iterations

        mechanism = ScramMechanism(MECHANISM)
        self.scram = mechanism.make_server(auth_fn, s_nonce=server_nonce)


def _failure(exc: ScramException, user: str | None) -> ScramFailure:
    error = exc.server_error.value if exc.server_error is not None else None
    return ScramFailure(str(exc), error, user)


def server_first(
    client_first: str, lookup: KeyLookup, *, server_nonce: str | None = None
) -> tuple[str, str, str]:
    """Answer a client-first message.

    Args:
        client_first: the decoded client-first message.
        lookup: the user's SCRAM keys; for an unknown user it must still answer (decoy
            keys), so that the answer does not tell who exists.
        server_nonce: for tests; a fresh random one by default.

    Returns:
        (user, server nonce, server-first message).

    Raises:
        ScramFailure: a malformed message or one asking for what is not offered (channel
            binding, extensions).
    """
    nonce = server_nonce or secrets.token_urlsafe(18)
    server = _Server(lookup, nonce)
    try:
        server.scram.set_client_first(client_first)
        message = server.scram.get_server_first()
    except ScramException as exc:
        raise _failure(exc, server.user) from exc
    if server.user is None:  # pragma: no cover - scramp always asks for the user
        raise ScramFailure("no user in client-first")
    return server.user, nonce, message


def server_final(state: SidState, client_final: str, lookup: KeyLookup) -> str:
    """Check a client-final message against the state of its sid.

    Args:
        state: from :func:`open_sid`.
        client_final: the decoded client-final message.
        lookup: as for :func:`server_first`; must answer the same keys as then.

    Returns:
        The server-final message (``v=<server signature>``).

    Raises:
        ScramFailure: ``error="invalid-proof"`` for a wrong password (or unknown user).
    """
    server = _Server(lookup, state.server_nonce)
    try:
        server.scram.set_client_first(state.client_first)
        server.scram.get_server_first()
        server.scram.set_client_final(client_final)
        message: str = server.scram.get_server_final()
    except ScramException as exc:
        raise _failure(exc, state.user) from exc
    return message
