"""The broker URL: where to connect, whether over TLS, and as whom.

One value for the client, the CLI and the gateway's broker link.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from ..core._exceptions import ConfigError

#: scheme: (TLS, WebSocket, default port)
_SCHEMES = {
    "mqtt": (False, False, 1883),
    "tcp": (False, False, 1883),
    "mqtts": (True, False, 8883),
    "ssl": (True, False, 8883),
    "ws": (False, True, 80),
    "wss": (True, True, 443),
}
#: the path of a `ws://` URL that names none (mosquitto's, mqtt.js's and paho's habit).
DEFAULT_WS_PATH = "/mqtt"


@dataclass(frozen=True, slots=True)
class BrokerUrl:
    """`mqtt://[user:pass@]host[:port]` (1883) or `mqtts://...` (TLS, 8883); over WebSocket
    `ws://host[:port][/path]` (80) or `wss://...` (TLS, 443), path `/mqtt` unless named."""

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    #: the WebSocket request path (with its query), None for plain MQTT over TCP.
    ws_path: str | None = None

    @property
    def websocket(self) -> bool:
        """Whether MQTT travels in WebSocket frames (`ws://`, `wss://`)."""
        return self.ws_path is not None

    @classmethod
    def parse(cls, url: str) -> BrokerUrl:
        """Parse a broker URL.

        Args:
            url: `mqtt://` or `mqtts://` URL (`tcp://`/`ssl://` are accepted as aliases), or
                `ws://` / `wss://` with a path.

        Raises:
            ConfigError: not a usable broker URL.
        """
        if "://" not in url and "/" in url:  # `host[:port]` alone has no slash
            raise ConfigError(_no_scheme_separator(url))
        parts = urlsplit(url if "://" in url else f"mqtt://{url}")
        if parts.scheme not in _SCHEMES:
            raise ConfigError(
                f"broker URL must be mqtt:// or mqtts:// (or ws://, wss://), got {parts.scheme!r}"
            )
        tls, websocket, default_port = _SCHEMES[parts.scheme]
        ws_path = None
        if websocket:
            ws_path = (parts.path or DEFAULT_WS_PATH) + (f"?{parts.query}" if parts.query else "")
            if any(ord(c) < 0x21 or ord(c) == 0x7F for c in ws_path):
                raise ConfigError("broker URL path must not hold spaces or control characters")
        elif parts.path.strip("/") or parts.query:
            raise ConfigError(f"a path is for ws:// and wss:// broker URLs only: {url!r}")
        try:
            port = parts.port or default_port
        except ValueError as exc:
            raise ConfigError(f"broker URL has a bad port: {exc}") from exc
        if not parts.hostname:
            raise ConfigError("broker URL has no host")
        user = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else None
        return cls(parts.hostname, port, tls, user, password, ws_path)

    def with_login(self, username: str | None, password: str | None) -> BrokerUrl:
        """This URL with `username` / `password` in place of the URL's (None keeps those)."""
        return dataclasses.replace(
            self,
            username=username if username is not None else self.username,
            password=password if password is not None else self.password,
        )

    def __str__(self) -> str:  # for log lines: never the password
        if self.ws_path is not None:
            path = self.ws_path.split("?", 1)[0]  # a query may carry a token
            return f"{'wss' if self.tls else 'ws'}://{self.host}:{self.port}{path}"
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


def _no_scheme_separator(url: str) -> str:
    """What is wrong with a broker URL that has a slash but no `://` (`mqtt//host:1883`)."""
    scheme = url.split("/", 1)[0].split(":", 1)[0]
    if scheme.lower() in _SCHEMES:
        rest = url[len(scheme) :].lstrip(":/")
        return (
            f"broker URL {url!r} has no '://' after its scheme: did you mean '{scheme}://{rest}'?"
        )
    return f"broker URL must be mqtt://host[:port] (or mqtts://, ws://, wss://), got {url!r}"
