"""JWT bearer tokens: who a token names and what it may do, or why it is refused.

PyJWT does every signature and registered-claim check; this module only picks the key and
reads the claims the gateway needs. What is checked, in order:

* the shape and header (three base64url parts, JSON header with ``alg``); ``alg`` must be
  one the keys verify: HS256 only with the secret file, the others only with the JWKS
  key that names them (``none`` never, an HS256 token never against a public key);
* the signature, with the key of the header's ``kid`` (without a ``kid``: each key of the
  header's algorithm, when there are at most three);
* ``exp`` (required unless told otherwise), ``nbf``, ``iat``, and ``iss`` / ``aud`` when the
  gateway is given an issuer / audience (a token with an ``aud`` is refused by a gateway
  given none), all with ``leeway`` seconds of clock skew; ``exp``, ``nbf`` and ``iat`` must be
  JSON numbers (RFC 7519's NumericDate: PyJWT also takes ``"1767225600"`` and ``true``);
* the user name claim (default ``sub``): a non-empty string;
* the ``acl`` claim when present (`_claim_acl`): a malformed one refuses the token rather
  than fall back to other rules.

Refusals are :class:`JwtRefused` with a reason for the log; nothing from the token is
trusted before its signature is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jwt

from ._claim_acl import ClaimAcl, parse_claim_acl
from ._jwks import KeySet, KeySource, merged

MAX_USER = 1024
#: Keys of one algorithm tried for a token without ``kid`` (a key set in rotation holds 2-3).
MAX_KIDLESS = 3
#: The claims RFC 7519 makes NumericDates: JSON numbers, never strings or booleans.
NUMERIC_DATES = ("exp", "nbf", "iat")


class JwtRefused(ValueError):
    """A token that does not authenticate anyone. The message says why (for the log)."""


@dataclass(frozen=True, slots=True)
class JwtIdentity:
    """What a verified token says: the user, its client id claim, and its ACL claim."""

    user: str
    client_id: str | None
    acl: ClaimAcl | None


def looks_like_jwt(token: str) -> bool:
    """Whether a bearer credential has a JWS compact shape (three base64url parts)."""
    parts = token.split(".")
    return len(parts) == 3 and all(parts[:2]) and token[:2] == "ey"


class JwtVerifier:
    """Verifies tokens against the keys of its sources. Thread-safe."""

    def __init__(
        self,
        sources: tuple[KeySource, ...],
        *,
        issuer: str | None,
        audience: str | None,
        leeway: float,
        username_claim: str,
        acl_claim: str,
        require_exp: bool = True,
    ) -> None:
        """Set the rules; keys come from ``sources`` at each check.

        Args:
            sources: where keys come from (`_jwks`).
            issuer: the ``iss`` every token must carry; None: not checked.
            audience: an ``aud`` every token must name; None: tokens must carry none.
            leeway: seconds of clock skew allowed on ``exp``, ``nbf`` and ``iat``.
            username_claim: the claim naming the user.
            acl_claim: the claim carrying topic permissions.
            require_exp: refuse tokens without ``exp``.
        """
        self.sources = sources
        self._issuer = issuer
        self._audience = audience
        self._leeway = leeway
        self._username_claim = username_claim
        self.acl_claim = acl_claim
        self._require = ["exp"] if require_exp else []

    def problems(self) -> list[str]:
        """Why keys in force may be stale (a file or URL that went bad)."""
        return [s.problem for s in self.sources if s.problem is not None]

    def verify(self, token: str) -> JwtIdentity:
        """The identity a token proves.

        Args:
            token: the Bearer credential.

        Raises:
            JwtRefused: anything wrong with it, with the reason.
        """
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise JwtRefused(f"not a JWT ({exc})") from exc
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or (kid is not None and not isinstance(kid, str)):
            raise JwtRefused("malformed JWT header (alg, kid)")
        keys = merged(self.sources)
        claims = self._decode(token, alg, kid, keys)
        for name in NUMERIC_DATES:
            value = claims.get(name)
            if name in claims and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise JwtRefused(f"the {name!r} claim is not a NumericDate (a JSON number)")
        user = claims.get(self._username_claim)
        if not isinstance(user, str) or not user or len(user) > MAX_USER:
            raise JwtRefused(f"the {self._username_claim!r} claim is not a user name")
        client_id = claims.get("clientid")
        acl = None
        if self.acl_claim in claims:
            try:
                acl = parse_claim_acl(claims[self.acl_claim])
            except ValueError as exc:
                why = f"user {user!r}: unusable {self.acl_claim!r} claim: {exc}"
                raise JwtRefused(why) from exc
        return JwtIdentity(user, client_id if isinstance(client_id, str) else None, acl)

    def _decode(self, token: str, alg: str, kid: str | None, keys: KeySet) -> dict[str, Any]:
        if alg == "HS256" and keys.secret is not None:
            candidates: tuple[Any, ...] = (keys.secret,)
        else:
            found = keys.candidates(alg, kid)
            if not found:
                if kid is not None and not keys.knows(kid):
                    for source in self.sources:
                        source.unknown_kid()
                    raise JwtRefused(f"no key {kid!r} for {alg} (keys are fetched again soon)")
                raise JwtRefused(f"algorithm {alg!r} is not accepted with these keys")
            if kid is None and len(found) > MAX_KIDLESS:
                # Each try is a signature check on the event loop: bounded per request.
                raise JwtRefused(
                    f"no kid, and {len(found)} keys for {alg}: the token must name one"
                )
            candidates = tuple(key.key for key in found)
        error: jwt.PyJWTError | None = None
        for key in candidates:
            try:
                return jwt.decode(
                    token,
                    key,
                    algorithms=[alg],
                    audience=self._audience,
                    issuer=self._issuer,
                    leeway=self._leeway,
                    options={"require": self._require},
                )
            except jwt.InvalidSignatureError as exc:
                error = exc  # maybe another key of the same algorithm
            except jwt.ExpiredSignatureError as exc:
                raise JwtRefused("it has expired (exp): the device needs a new token") from exc
            except jwt.ImmatureSignatureError as exc:
                raise JwtRefused("it is not valid yet (nbf)") from exc
            except jwt.PyJWTError as exc:
                raise JwtRefused(str(exc) or type(exc).__name__) from exc
        raise JwtRefused(f"bad signature ({error})")
