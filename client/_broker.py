"""The broker URL: where to connect, whether over TLS, and as whom.

One value for the client, the CLI and the gateway's broker link.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from ._exceptions import ConfigError


@dataclass(frozen=True, slots=True)
class BrokerUrl:
    """`mqtt://[user:pass@]host[:port]` (1883) or `mqtts://...` (TLS, 8883)."""

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str) -> BrokerUrl:
        """Parse a broker URL.

        Args:
            url: `mqtt://` or `mqtts://` URL; `tcp://`/`ssl://` are accepted as aliases.

        Raises:
            ConfigError: not a usable broker URL.
        """
        parts = urlsplit(url if "://" in url else f"mqtt://{url}")
        schemes = {"mqtt": False, "tcp": False, "mqtts": True, "ssl": True}
        if parts.scheme not in schemes:
            raise ConfigError(f"broker URL must be mqtt:// or mqtts://, got {parts.scheme!r}")
        tls = schemes[parts.scheme]
        try:
            port = parts.port or (8883 if tls else 1883)
        except ValueError as exc:
            raise ConfigError(f"broker URL has a bad port: {exc}") from exc
        if not parts.hostname:
            raise ConfigError("broker URL has no host")
        user = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else None
        return cls(parts.hostname, port, tls, user, password)

    def with_login(self, username: str | None, password: str | None) -> BrokerUrl:
        """This URL with `username` / `password` in place of the URL's (None keeps those)."""
        return dataclasses.replace(
            self,
            username=username if username is not None else self.username,
            password=password if password is not None else self.password,
        )

    def __str__(self) -> str:  # for log lines: never the password
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"
