"""Client settings, the broker URL, and the environment / config-file layer.

Library classes take these as keyword arguments and never read the environment themselves.
:func:`load_settings` is the edge that does, used by the CLI and :meth:`Client.from_config`;
precedence, highest first: explicit keyword argument / CLI flag > environment variable
(`OFFLOAD_<NAME>`) > config file (TOML: `$OFFLOAD_CONFIG`, else
`~/.config/mqtt-offload/config.toml`, flat `name = value` keys or a `[client]` table) >
defaults.

=====================  ==============================  ===========================================
setting                environment                     meaning
=====================  ==============================  ===========================================
broker                 OFFLOAD_BROKER                  `mqtt[s]://[user:pass@]host[:port]`
username / password    OFFLOAD_USERNAME / _PASSWORD    broker credentials (override the URL's)
protocol               OFFLOAD_PROTOCOL                5 (MQTT 5) or 4 (3.1.1; "3.1.1" accepted)
endpoint               OFFLOAD_ENDPOINT                offload gateway URL; skips discovery
automatic_offload      OFFLOAD_AUTOMATIC_OFFLOAD       upload oversized messages (default true)
fetch_external         OFFLOAD_FETCH_EXTERNAL          resolve placeholders (default true)
chunking               OFFLOAD_CHUNKING                ADR-23 chunking fallback (default true)
max_packet_size        OFFLOAD_MAX_PACKET_SIZE         limit when CONNACK states none
offload_threshold      OFFLOAD_OFFLOAD_THRESHOLD       offload payloads above this even if they fit
discovery_topic        OFFLOAD_DISCOVERY_TOPIC         default `sys/metadata`
discovery_wait         OFFLOAD_DISCOVERY_WAIT          seconds a large publish waits for the record
discovery_refresh      OFFLOAD_DISCOVERY_REFRESH       seconds between re-subscriptions
chunk_timeout          OFFLOAD_CHUNK_TIMEOUT           reassembly timeout without message expiry
untrusted_endpoint     OFFLOAD_UNTRUSTED_ENDPOINT      `refuse` (default) or `anonymous`: fetch
                                                       placeholders pointing at origins that are
                                                       not the endpoint or in the allow-list
max_fetch_bytes        OFFLOAD_MAX_FETCH_BYTES         largest placeholder size fetched (5 GiB)
spool_threshold        OFFLOAD_SPOOL_THRESHOLD         payloads above this are spooled to disk;
                                                       also the RAM budget of chunk reassembly
http_timeout           OFFLOAD_HTTP_TIMEOUT            seconds per HTTP read/connect
keepalive              OFFLOAD_KEEPALIVE               MQTT keep-alive seconds
ca_file                OFFLOAD_CA_FILE                 CA bundle for mqtts:// and https:// (PEM)
http_token             OFFLOAD_HTTP_TOKEN              bearer token for the gateway instead of
                                                       SCRAM with the broker user and password
ignore_payload_not_found  OFFLOAD_IGNORE_PAYLOAD_NOT_FOUND  skip (log) placeholders whose
                                                       object is gone instead of a MessageError
discovery_allowlist    OFFLOAD_DISCOVERY_ALLOWLIST     comma-separated `scheme://host[:port]`
                                                       (host may start with `*.`); a discovered
                                                       endpoint elsewhere is ignored
max_partial_messages   OFFLOAD_MAX_PARTIAL_MESSAGES    chunked messages reassembled at once
max_buffered_bytes     OFFLOAD_MAX_BUFFERED_BYTES      chunk bytes buffered at once (RAM + disk)
max_chunk_timeout      OFFLOAD_MAX_CHUNK_TIMEOUT       cap on the reassembly time chunk 0's
                                                       Message Expiry Interval may ask for
=====================  ==============================  ===========================================

Gateway credentials: with `http_token` the client sends `Authorization: Bearer`; otherwise,
when the broker login has a user name and password, it authenticates to the gateway with
SCRAM-SHA-512 as that same user (the gateway reads the broker's password file). Either goes
only to the endpoint in force (configured, or advertised on the discovery topic) and to
origins in `discovery_allowlist`. Placeholders are fetched only from those origins unless
`untrusted_endpoint = "anonymous"` opts in to fetching any other origin without credentials.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict, get_args
from urllib.parse import unquote, urlsplit

from ._exceptions import ConfigError
from .protocol._bounded import Origin, http_origin

UntrustedPolicy = Literal["anonymous", "refuse"]
ENV_PREFIX = "OFFLOAD_"
DEFAULT_CONFIG_FILE = Path("~/.config/mqtt-offload/config.toml")


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


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """Everything a :class:`client.Client` can be told. See the module table."""

    broker: str = "mqtt://localhost:1883"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    client_id: str = ""
    protocol: int = 5
    endpoint: str | None = None
    automatic_offload: bool = True
    fetch_external: bool = True
    chunking: bool = True
    max_packet_size: int | None = None
    offload_threshold: int | None = None
    discovery_topic: str = "sys/metadata"
    discovery_wait: float = 2.0
    discovery_refresh: float = 60.0
    chunk_timeout: float = 60.0
    untrusted_endpoint: UntrustedPolicy = "refuse"
    max_fetch_bytes: int = 5 * 1024**3
    spool_threshold: int = 64 * 1024 * 1024
    http_timeout: float = 60.0
    keepalive: int = 30
    http_token: str | None = field(default=None, repr=False)
    ignore_payload_not_found: bool = False
    discovery_allowlist: tuple[str, ...] = ()
    max_partial_messages: int = 64
    max_buffered_bytes: int = 1024 * 1024 * 1024
    max_chunk_timeout: float = 3600.0
    ca_file: str | None = None

    def __post_init__(self) -> None:
        BrokerUrl.parse(self.broker)
        if self.protocol not in (4, 5):
            raise ConfigError(f"protocol must be 5 or 4 (3.1.1), got {self.protocol!r}")
        if self.untrusted_endpoint not in get_args(UntrustedPolicy):
            raise ConfigError("untrusted_endpoint must be 'anonymous' or 'refuse'")
        for name in (
            "max_partial_messages",
            "max_buffered_bytes",
            "spool_threshold",
            "max_fetch_bytes",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if isinstance(self.discovery_allowlist, str):
            object.__setattr__(self, "discovery_allowlist", _split_list(self.discovery_allowlist))
        object.__setattr__(self, "discovery_allowlist", tuple(self.discovery_allowlist))
        for entry in self.discovery_allowlist:
            _parse_origin(entry)
        for name in ("max_packet_size", "offload_threshold"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be positive, got {value}")
        for name in (
            "discovery_wait",
            "discovery_refresh",
            "chunk_timeout",
            "http_timeout",
            "max_chunk_timeout",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative")
        if self.endpoint is not None:
            parts = urlsplit(self.endpoint)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"endpoint must be an http(s) URL: {self.endpoint!r}")
            object.__setattr__(self, "endpoint", self.endpoint.rstrip("/"))

    def endpoint_allowed(self, url: str) -> bool:
        """Whether a discovered endpoint passes `discovery_allowlist` (empty: any does).

        Args:
            url: the endpoint URL from a discovery record.
        """
        if not self.discovery_allowlist:
            return True
        try:
            return self.allowlisted(http_origin(url))
        except ValueError:
            return False

    def allowlisted(self, origin: Origin) -> bool:
        """Whether `origin` matches an entry of `discovery_allowlist` (empty: none does).

        An entry without a port matches the scheme's default port and any port named
        explicitly, as before: the entry names a host, not a listener.

        Args:
            origin: scheme, host and port of a URL.
        """
        for entry in self.discovery_allowlist:
            scheme, pattern, want_port = _parse_origin(entry)
            if origin.scheme != scheme or (want_port is not None and origin.port != want_port):
                continue
            host = origin.host
            if pattern.startswith("*."):
                if host.endswith(pattern[1:]) and len(host) > len(pattern) - 1:
                    return True
            elif host == pattern.lower():
                return True
        return False

    @property
    def broker_url(self) -> BrokerUrl:
        """The parsed broker URL with explicit username/password applied over the URL's."""
        return BrokerUrl.parse(self.broker).with_login(self.username, self.password)


def _split_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.replace(" ", ",").split(",") if item.strip())


def _parse_origin(entry: str) -> tuple[str, str, int | None]:
    """`scheme://host[:port]` of an allow-list entry (host may be `*.domain`)."""
    parts = urlsplit(entry)
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"discovery_allowlist entry {entry!r}: {exc}") from exc
    if parts.scheme not in ("http", "https") or not host or parts.path not in ("", "/"):
        raise ConfigError(f"discovery_allowlist entries are http(s)://host[:port], got {entry!r}")
    return parts.scheme, host, port


_FIELDS = {f.name: f for f in dataclasses.fields(ClientSettings)}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(name: str, value: object) -> object:
    """Turn an environment string or TOML value into the field's type."""
    kind = str(_FIELDS[name].type)
    if name == "discovery_allowlist" and isinstance(value, list):
        return tuple(str(v) for v in value)
    if value is None or not isinstance(value, str):
        if "bool" in kind and not isinstance(value, bool):
            raise ConfigError(f"{name} must be a boolean, got {value!r}")
        return value
    text = value.strip()
    try:
        if kind == "bool":
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        if name == "discovery_allowlist":
            return _split_list(text)
        if name == "protocol":
            return {"5": 5, "4": 4, "3.1.1": 4, "311": 4}[text]
        if kind.startswith("int"):
            return None if text == "" and "None" in kind else int(text)
        if kind.startswith("float"):
            return float(text)
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"{name}: cannot use {value!r}") from exc
    return None if text == "" and "None" in kind else text


def load_settings(
    overrides: Mapping[str, object] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
) -> ClientSettings:
    """Build settings from keyword overrides > environment > config file > defaults.

    Args:
        overrides: explicit values (e.g. CLI flags); None values are ignored so that an
            unset flag falls through to the lower layers.
        environ: the environment to read `OFFLOAD_*` from (pass `os.environ`); None reads none.
        config_file: TOML file; default `$OFFLOAD_CONFIG` from `environ`, else
            `~/.config/mqtt-offload/config.toml` when it exists.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, or an unreadable file.
    """
    env = dict(environ or {})
    values: dict[str, object] = {}
    path: Path | None
    if config_file is not None:
        path = Path(config_file)
    elif env.get(ENV_PREFIX + "CONFIG"):
        path = Path(env[ENV_PREFIX + "CONFIG"])
    else:
        default = DEFAULT_CONFIG_FILE.expanduser()
        path = default if default.exists() else None
    if path is not None:
        try:
            doc: dict[str, Any] = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {path}: {exc}") from exc
        table = doc.get("client", doc)
        if not isinstance(table, dict):
            raise ConfigError(f"config file {path}: [client] must be a table")
        for key, value in table.items():
            if key not in _FIELDS:
                raise ConfigError(f"config file {path}: unknown setting {key!r}")
            values[key] = _coerce(key, value)
    for name in _FIELDS:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = _coerce(name, raw)
    for key, value in (overrides or {}).items():
        if key not in _FIELDS:
            raise ConfigError(f"unknown setting {key!r}")
        if value is not None:
            values[key] = value
    try:
        return ClientSettings(**values)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc


class SettingsOverrides(TypedDict, total=False):
    """Keyword arguments accepted wherever settings can be given one by one."""

    username: str | None
    password: str | None
    client_id: str
    protocol: int
    endpoint: str | None
    automatic_offload: bool
    fetch_external: bool
    chunking: bool
    max_packet_size: int | None
    offload_threshold: int | None
    discovery_topic: str
    discovery_wait: float
    discovery_refresh: float
    chunk_timeout: float
    untrusted_endpoint: UntrustedPolicy
    spool_threshold: int
    http_timeout: float
    keepalive: int
    http_token: str | None
    ignore_payload_not_found: bool
    discovery_allowlist: tuple[str, ...]
    max_partial_messages: int
    max_buffered_bytes: int
    max_chunk_timeout: float
    max_fetch_bytes: int
    ca_file: str | None
