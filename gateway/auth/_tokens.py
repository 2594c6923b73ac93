"""The bearer tokens file: ``user:<sha256 hex of the token>`` per line. Pure.

Only the SHA-256 of a token is stored, so the file is no more secret than the password file.
Make an entry with::

    token=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')
    printf '%s:%s\\n' alice "$(printf %s "$token" | sha256sum | cut -d' ' -f1)" >> tokens

Blank lines and lines starting with ``#`` are skipped; any other line that is not
``user:<64 hex digits>`` makes the whole file invalid. A user may hold several tokens.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

_LINE = re.compile(r"([^:\s][^:]*):([0-9a-fA-F]{64})")


def token_digest(token: str) -> str:
    """The lower-case hex SHA-256 of a token, as the tokens file stores it.

    Args:
        token: the bearer token as sent.
    """
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse_tokens_file(text: str) -> Mapping[str, str]:
    """Map token digest -> user.

    Args:
        text: the whole file.

    Raises:
        ValueError: a line that is not ``user:<sha256 hex>``, or a digest listed twice.
    """
    users: dict[str, str] = {}
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            raise ValueError(f"line {number}: expected user:<sha256 hex of the token>")
        digest = match.group(2).lower()
        if digest in users:
            raise ValueError(f"line {number}: the same token is listed twice")
        users[digest] = match.group(1).strip()
    return users
