"""Which mode and schemes a gateway's configured files and flags give it, checked before any
file is read. Pure: the authenticator asks these once, at construction."""

from __future__ import annotations

from pathlib import Path

from ._decisions import AuthMode
from ._exceptions import AuthConfigError
from ._scram import MECHANISM

MIN_SECRET_BYTES = 16


def check_options(
    *,
    realm: str,
    secret: bytes,
    tls: bool,
    password_file: Path | None,
    tokens_file: Path | None,
    dynsec_file: Path | None,
    acl_file: Path | None,
    jwt: bool,
) -> None:
    """Refuse, before any file is read, a configuration that could not work as written."""
    if '"' in realm or "\\" in realm or not realm.isprintable():
        raise ValueError("realm must be printable and hold no quote or backslash")
    if dynsec_file is not None and (password_file is not None or acl_file is not None):
        raise AuthConfigError(
            "the dynamic security file holds the users and the rules: set it alone, not "
            "with OFFLOAD_PASSWORD_FILE or OFFLOAD_ACL_FILE",
            path=dynsec_file,
        )
    passwords = password_file is not None or dynsec_file is not None
    if passwords and len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the secret must be at least {MIN_SECRET_BYTES} bytes")
    if (tokens_file is not None or jwt) and not passwords and not tls:
        # Bearer tokens never cross plain HTTP, so this gateway could serve nobody.
        raise AuthConfigError(
            "bearer tokens (a tokens file, JWT keys) without a password source are the only "
            "way in, and those are refused without TLS: set OFFLOAD_TLS=true (HTTPS proxy "
            "in front) or OFFLOAD_TLS_CERT_FILE, or add OFFLOAD_PASSWORD_FILE or "
            "OFFLOAD_DYNSEC_FILE for SCRAM",
            path=tokens_file,
        )


def offered_schemes(*, passwords: bool, tokens: bool, tls: bool) -> tuple[str, ...]:
    """The schemes a challenge offers: neither a password nor a token crosses plain HTTP."""
    schemes = [MECHANISM] if passwords else []
    if tls and passwords:
        schemes.append("Basic")
    if tls and tokens:
        schemes.append("Bearer")
    return tuple(schemes)


def mode(*, passwords: bool, tokens: bool, allow_anonymous: bool) -> AuthMode:
    """The mode the configured files and flag put a gateway in (see `AuthMode`)."""
    if passwords:
        return AuthMode.PASSWORDS
    if tokens:
        return AuthMode.TOKENS
    return AuthMode.ANONYMOUS if allow_anonymous else AuthMode.CLOSED
