"""`discovery_allowlist`: which gateway origins a client trusts besides the one in force.

The list decides two things that an attacker on the broker would like to decide instead:
which discovery record may move the client to another gateway, and which origins a
placeholder may make it fetch from (with its credentials). Entries are parsed strictly, so a
typo fails at start-up rather than opening or closing the list silently.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from ..core._exceptions import ConfigError
from ..protocol._bounded import Origin, http_origin


def parse_origin(entry: str) -> tuple[str, str, int | None]:
    """`scheme://host[:port]` of an allow-list entry (host may be `*.domain`).

    Raises:
        ConfigError: not an http(s) origin.
    """
    parts = urlsplit(entry)
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"discovery_allowlist entry {entry!r}: {exc}") from exc
    if parts.scheme not in ("http", "https") or not host or parts.path not in ("", "/"):
        raise ConfigError(f"discovery_allowlist entries are http(s)://host[:port], got {entry!r}")
    return parts.scheme, host, port


def origin_listed(allowlist: Iterable[str], origin: Origin) -> bool:
    """Whether `origin` matches an entry (an empty list matches nothing).

    An entry without a port matches the scheme's default port and any port named
    explicitly: the entry names a host, not a listener.
    """
    for entry in allowlist:
        scheme, pattern, want_port = parse_origin(entry)
        if origin.scheme != scheme or (want_port is not None and origin.port != want_port):
            continue
        host = origin.host
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]) and len(host) > len(pattern) - 1:
                return True
        elif host == pattern.lower():
            return True
    return False


def url_listed(allowlist: Iterable[str], url: str) -> bool:
    """Whether the origin of `url` matches an entry; a malformed URL never does."""
    try:
        return origin_listed(allowlist, http_origin(url))
    except ValueError:
        return False
