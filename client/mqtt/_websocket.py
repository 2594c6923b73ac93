"""MQTT over WebSocket (`ws://`, `wss://` broker URLs): the upgrade request's extra headers.

paho carries the transport (`transport="websockets"`); this module only turns the
`websocket_headers` setting into the headers it sends, refusing anything that would let a
value end the header line (a CR or LF would inject headers of its own).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..core._exceptions import ConfigError

__all__ = ["parse_header_lines", "websocket_headers"]

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: Headers paho writes itself: a second copy would make the upgrade request malformed.
_RESERVED = {
    "host",
    "upgrade",
    "connection",
    "origin",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
}


def parse_header_lines(text: str) -> tuple[str, ...]:
    """The environment / config-file form: one `Name: value` per line."""
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def websocket_headers(entries: Iterable[str]) -> dict[str, str]:
    """`Name: value` entries as the dict paho sends with the upgrade request.

    Raises:
        ConfigError: an entry without a colon, a name that is not an HTTP token or that
            paho sets itself, or a value with a control character.
    """
    headers: dict[str, str] = {}
    for entry in entries:
        name, colon, value = entry.partition(":")
        name, value = name.strip(), value.strip()
        if not colon or not _TOKEN.fullmatch(name):
            raise ConfigError(f"websocket_headers: {entry[:40]!r} is not 'Name: value'")
        if name.lower() in _RESERVED:
            raise ConfigError(f"websocket_headers: {name} is set by the WebSocket handshake")
        if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in value):
            raise ConfigError(f"websocket_headers: the value of {name} has a control character")
        headers[name] = value
    return headers
