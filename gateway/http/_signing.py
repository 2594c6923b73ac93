"""HMAC signing shared by presigned download URLs and direct-upload grants. Pure.

Both are stateless: any replica holding the same `OFFLOAD_AUTH_SECRET` checks what another
signed, so nothing is kept between a grant and its commit, or a URL and its use. Each use
has its own key derived from the secret (HMAC of a purpose string), so a signature made
for one can never pass as the other.

Separate from `gateway.http._presign` (the routes) so that `gateway.http._context` can name the
signer without importing a module that imports it back.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import re
import secrets
from typing import Any
from urllib.parse import urlencode

log = logging.getLogger("gateway")

_PURPOSE = b"mqtt-offload presigned download v1"
_GRANT_PURPOSE = b"mqtt-offload direct upload grant v1"
#: Longest grant token read (a real one is under 1 KiB).
MAX_GRANT_BYTES = 4096
# At most 12 digits: any expiry until the year 33658, and int() never sees a huge string.
_EXPIRES = re.compile(r"[0-9]{1,12}")
_SIG = re.compile(r"[A-Za-z0-9_-]{43}")  # unpadded URL-safe base64 of 32 HMAC bytes


class UrlSigner:
    """Signs and checks `(path, expires)` pairs. Pure apart from the clock passed in.

    Args:
        secret: the gateway's shared secret; a purpose-bound key is derived from it, so the
            same secret can serve SCRAM without the two uses ever sharing a key.
    """

    def __init__(self, secret: bytes) -> None:
        self._key = hmac.new(secret, _PURPOSE, hashlib.sha256).digest()
        # Direct-upload grants (gateway/direct/_transfers.py) get their own key from the same
        # secret.
        self._grant_key = hmac.new(secret, _GRANT_PURPOSE, hashlib.sha256).digest()

    def __repr__(self) -> str:  # never show the key
        return "UrlSigner(<secret>)"

    @classmethod
    def from_settings(cls, secret: str | None) -> UrlSigner:
        """From `OFFLOAD_AUTH_SECRET`, else a random per-process key (logged as a warning)."""
        if secret:
            return cls(secret.encode("utf-8"))
        log.warning(
            "OFFLOAD_AUTH_SECRET is not set: presigned URLs work on this replica only "
            "and stop working when it restarts"
        )
        return cls(secrets.token_bytes(32))

    def signature(self, path: str, expires: int) -> str:
        mac = hmac.new(self._key, f"GET\n{path}\n{expires}".encode(), hashlib.sha256)
        return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode("ascii")

    def sign(self, path: str, expires: int) -> str:
        """The query string (`expires=...&sig=...`) that grants GET on `path` until `expires`."""
        return urlencode({"expires": expires, "sig": self.signature(path, expires)})

    def problem(self, path: str, expires: str, sig: str, *, now: float) -> str | None:
        """Why `sig` does not grant `path` at time `now`, or None when it does.

        Both values come from the URL, so both are checked for shape first: ASCII digits
        only (`int()` and `str.isdigit()` also take digits such as `²`), and a
        signature of exactly the length and alphabet `signature` produces. The comparison
        is constant-time.
        """
        if _EXPIRES.fullmatch(expires) is None:
            return "presigned URL: `expires` must be a Unix time in ASCII digits"
        if _SIG.fullmatch(sig) is None:
            return "presigned URL: `sig` is malformed (truncated or altered?)"
        if int(expires) <= now:
            return "presigned URL expired"
        if not hmac.compare_digest(self.signature(path, int(expires)), sig):
            return "presigned URL invalid or altered"
        return None

    def seal(self, claims: dict[str, Any]) -> str:
        """A grant token: the claims as JSON, base64url, a dot, their HMAC (base64url)."""
        body = json.dumps(claims, sort_keys=True, separators=(",", ":")).encode("utf-8")
        mac = hmac.new(self._grant_key, body, hashlib.sha256).digest()
        return f"{_b64(body)}.{_b64(mac)}"

    def unseal(self, token: str) -> dict[str, Any] | str:
        """The claims of a token this key sealed, or why it is refused (a str).

        The token is foreign input: its length and shape are checked before it is decoded,
        and the MAC (constant-time) before its JSON is parsed.
        """
        if len(token) > MAX_GRANT_BYTES or token.count(".") != 1:
            return "upload grant is malformed"
        body_text, mac_text = token.split(".")
        try:
            body = _unb64(body_text)
            mac = _unb64(mac_text)
        except (ValueError, binascii.Error):
            return "upload grant is malformed"
        expected = hmac.new(self._grant_key, body, hashlib.sha256).digest()
        if not hmac.compare_digest(expected, mac):
            return "upload grant invalid or altered (or signed with another secret)"
        claims = json.loads(body)  # ours: we signed exactly this JSON object
        if not isinstance(claims, dict):
            return "upload grant is malformed"
        return claims


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text.isascii() or re.fullmatch(r"[A-Za-z0-9_-]*", text) is None:
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
