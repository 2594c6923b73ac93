"""Bounded readers for foreign JSON and URLs: checked before anything parses them. Pure.

Every placeholder and discovery record comes from whoever can publish on a topic, so it is
hostile until read. `json.loads` recurses once per nesting level (64 KiB of `[` is a
RecursionError, not a ValueError), and `urlsplit` / httpx raise a zoo of exceptions on odd
URLs. The functions here bound size and depth *before* the decoder runs and turn every
failure into one `ValueError` with a reason, which callers wrap in their own error type.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

#: Deepest JSON nesting a placeholder or discovery record may have (both are flat objects).
MAX_JSON_DEPTH = 16
#: Longest URL accepted from a placeholder or discovery record.
MAX_URL_LENGTH = 2048

# A JSON string (escapes included) or one bracket: strings are skipped whole, so brackets
# inside them do not count towards the depth.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)
_OPEN = frozenset(b"[{")
# Host labels as resolvers take them; `_` allowed because container service names use it.
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")


def json_depth_exceeds(data: bytes, max_depth: int) -> bool:
    """Whether `data` nests arrays/objects deeper than `max_depth`, without decoding it.

    Args:
        data: JSON text as bytes (UTF-8; any other encoding the caller rejects anyway).
        max_depth: the deepest nesting allowed.
    """
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return False  # the cheap common case: not enough brackets to be too deep
    depth = 0
    for match in _TOKENS.finditer(data):
        token = match.group()
        if len(token) != 1:
            continue
        if token[0] in _OPEN:
            depth += 1
            if depth > max_depth:
                return True
        else:
            depth = max(depth - 1, 0)
    return False


def loads_object(data: bytes, *, max_bytes: int, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """Decode a JSON object from foreign bytes, bounded in size and depth first.

    Args:
        data: the bytes.
        max_bytes: longest input accepted.
        max_depth: deepest nesting accepted.

    Raises:
        ValueError: too long, too deep, not UTF-8 JSON, or not an object.
    """
    if len(data) > max_bytes:
        raise ValueError(f"{len(data)} bytes is more than {max_bytes}")
    if json_depth_exceeds(data, max_depth):
        raise ValueError(f"nested deeper than {max_depth} levels")
    try:
        doc = json.loads(data.decode("utf-8"))
    except RecursionError as exc:  # unreachable after the depth check; kept as a backstop
        raise ValueError("nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


@dataclass(frozen=True, slots=True)
class Origin:
    """Scheme, lower-case host and port (defaulted) of an http(s) URL: what trust is keyed on."""

    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def http_origin(url: object) -> Origin:
    """The origin of an absolute http(s) URL taken from foreign input, checked strictly.

    Refused: anything but a str of printable ASCII (no space, tab or control character),
    longer than :data:`MAX_URL_LENGTH`, another scheme, user info (httpx would send it as
    Basic credentials), a missing or malformed host (labels of 1-63 characters, 253 in all,
    or an IP literal), and a port outside 1-65535.

    Args:
        url: the URL.

    Raises:
        ValueError: the URL is not acceptable, with the reason.
    """
    if not isinstance(url, str):
        raise ValueError("URL must be a string")
    if len(url) > MAX_URL_LENGTH:
        raise ValueError(f"URL longer than {MAX_URL_LENGTH} characters")
    if not url.isascii() or not url.isprintable() or " " in url:
        raise ValueError(f"URL has a space, control or non-ASCII character: {url[:100]!r}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"unparsable URL {url[:100]!r}: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"URL must be http or https: {url[:100]!r}")
    if "@" in parts.netloc:
        raise ValueError("URL must not carry user info")
    host = (parts.hostname or "").lower()
    if not host:
        raise ValueError(f"URL has no host: {url[:100]!r}")
    _check_host(host, bracketed=parts.netloc.startswith("["))
    if port == 0:
        raise ValueError("URL port must be 1-65535")
    return Origin(parts.scheme, host, port or (443 if parts.scheme == "https" else 80))


def _check_host(host: str, *, bracketed: bool) -> None:
    if bracketed:
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError as exc:
            raise ValueError(f"bad IPv6 literal {host[:100]!r}") from exc
        return
    if len(host) > 253:
        raise ValueError("host name longer than 253 characters")
    labels = host.removesuffix(".").split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"bad host name {host[:100]!r}")
