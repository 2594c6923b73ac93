"""Client settings, declared once, and what makes a set of them usable.

Library classes take these as keyword arguments and never read the environment themselves.
:func:`client.config._load.load_settings` is the edge that does, used by the CLI and
:meth:`Client.from_config`; precedence, highest first: explicit keyword argument / CLI flag >
environment variable (`OFFLOAD_<NAME>`) > config file (TOML: `$OFFLOAD_CONFIG`, else
`~/.config/mqtt-offload/config.toml`, flat `name = value` keys or a `[client]` table) >
defaults.

Every setting is declared once, as a field of :class:`ClientSettings` whose metadata holds
its meaning and its parser: the keyword arguments, the `OFFLOAD_*` environment variables, the
config-file keys and the settings table of docs/settings.md (:func:`settings_table`, checked by
`tests/test_client_units.py`) all come from those fields. Print the table with
`python -m client.config._settings`. The layers are read in `_load`; the field parsers, the
allow-list matching and the config-file reading are in `_parsers`, `_allowlist` and `_file`.

Gateway credentials: with `http_token`, or a broker password that is a JWT, the client sends
`Authorization: Bearer`; otherwise, when the broker login has a user name and password, it
authenticates to the gateway with SCRAM-SHA-512 as that same user (the gateway reads the
broker's password file); `http_login` picks one by name. Either goes
only to the endpoint in force (configured, or advertised on the discovery topic) and to
origins in `discovery_allowlist`. Placeholders are fetched only from those origins unless
`untrusted_endpoint = "anonymous"` opts in to fetching any other origin without credentials.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Literal, get_args
from urllib.parse import urlsplit

from ..core._exceptions import ConfigError
from ..mqtt._broker import BrokerUrl
from ..mqtt._session import session_flags
from ..mqtt._tls import TlsFiles
from ..mqtt._websocket import parse_header_lines, websocket_headers
from ..protocol._bounded import Origin
from ..protocol._retention import GROUP_PATTERN
from ._allowlist import origin_listed, parse_origin, url_listed
from ._file import DEFAULT_CONFIG_FILE, ENV_PREFIX
from ._keys import EncryptTo, normalise_encrypt_to, parse_encrypt_to

# Under the names the field declarations below have always used (parallel branches add fields).
from ._parsers import OPT_INT as _OPT_INT
from ._parsers import OPT_STR as _OPT_STR
from ._parsers import parse_bool as _parse_bool
from ._parsers import parse_protocol as _parse_protocol
from ._parsers import setting
from ._parsers import split_list as _split_list

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "ENV_PREFIX",
    "ClientSettings",
    "Ordering",
    "UntrustedPolicy",
    "setting",
    "settings_table",
]

UntrustedPolicy = Literal["anonymous", "refuse"]
Ordering = Literal["topic", "arrival"]
GatewayAuth = Literal["auto", "scram", "bearer", "basic"]


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """Everything a :class:`client.Client` can be told. See docs/settings.md."""

    broker: str = setting(
        "mqtt://localhost:1883",
        "`mqtt[s]://[user:pass@]host[:port]`, or over WebSocket `ws[s]://host[:port][/path]` "
        "(path `/mqtt` unless named; docs/connections.md)",
    )
    username: str | None = setting(
        None, "broker user name (over the URL's; also used for the gateway)", _OPT_STR
    )
    password: str | None = setting(
        None, "broker password (over the URL's; also used for the gateway)", _OPT_STR, secret=True
    )
    client_id: str = setting("", "MQTT client id; empty lets the broker assign one")
    session_expiry: int = setting(
        0,
        "seconds the broker keeps this client's session (subscriptions, queued QoS 1/2 "
        "messages) after a disconnect; 0 (default): a clean session on every connect; needs "
        "`client_id` (see docs/connections.md)",
        int,
    )
    protocol: int = setting(5, "5 (default) or 4 / `3.1.1`", _parse_protocol)
    endpoint: str | None = setting(None, "gateway URL; skips discovery", _OPT_STR)
    automatic_offload: bool = setting(True, "upload oversized messages (default true)", _parse_bool)
    fetch_external: bool = setting(True, "resolve placeholders (default true)", _parse_bool)
    chunking: bool = setting(True, "ADR-23 fallback (default true)", _parse_bool)
    trace_direct: bool = setting(
        False,
        "carry the caller's trace context (`traceparent` user property) on messages sent to "
        "the broker as they are too, not only on offloaded and chunked ones (default false: "
        "docs/tracing.md, what it costs)",
        _parse_bool,
    )
    max_packet_size: int | None = setting(
        None, "limit when CONNACK states none (needed for 3.1.1)", _OPT_INT
    )
    offload_threshold: int | None = setting(
        None, "offload payloads above this even when they fit", _OPT_INT
    )
    discovery_topic: str = setting("sys/metadata", "default `sys/metadata`")
    discovery_wait: float = setting(2.0, "seconds a large publish waits for the record", float)
    discovery_refresh: float = setting(60.0, "seconds between re-subscriptions", float)
    chunk_timeout: float = setting(
        60.0,
        "seconds a partial chunked message whose chunk 0 has no message expiry waits for its "
        "next chunk while the connection is quiet (connected, nothing arriving, nothing "
        "waiting for the application; see docs/connections.md)",
        float,
    )
    # ruff cannot tell a Literal alias is immutable; `setting` returns a dataclass field.
    untrusted_endpoint: UntrustedPolicy = setting(  # noqa: RUF009
        "refuse",
        "`refuse` (default): placeholders pointing anywhere but the endpoint in force or "
        "`discovery_allowlist` are errors; `anonymous` opts in to fetching any origin, "
        "without credentials",
    )
    max_fetch_bytes: int = setting(
        5 * 1024**3,
        "largest placeholder `size` fetched (5 GiB); larger ones are errors, never requested",
        int,
    )
    spool_threshold: int = setting(
        64 * 1024 * 1024, "payloads above this are spooled to a temporary file", int
    )
    spool_dir: str | None = setting(
        None,
        "directory for spool files: payloads fetched above `spool_threshold`, chunk "
        "reassembly, a piped publish (default: the system's temporary directory, `TMPDIR`; "
        "where /tmp is tmpfs, as on Debian 13, that is memory); "
        "`offload subscribe --out DIR` spools into DIR",
        _OPT_STR,
    )
    http_timeout: float = setting(
        60.0,
        "seconds per HTTP connect, read or write: a gateway or store that accepts and never "
        "answers ends each request after it (the CLI: exit 5, `timed out`; an upload is "
        "not retried then)",
        float,
    )
    keepalive: int = setting(30, "MQTT keep-alive seconds", int)
    fallback_on_auth_failure: bool = setting(
        False,
        "when the gateway refuses the login or the access (HTTP 401/403, a wrong or missing "
        "password), publish directly or in chunks anyway; default false: the publish fails "
        "with `AccessRefused` (the CLI: exit 6)",
        _parse_bool,
    )
    http_token: str | None = setting(
        None,
        "bearer token for the gateway instead of SCRAM (the gateway accepts tokens only over TLS)",
        _OPT_STR,
        secret=True,
    )
    http_login: GatewayAuth = setting(  # noqa: RUF009
        "auto",
        "how the gateway login is presented: `auto` (default): `http_token` as a bearer token, "
        "else a broker password that is a JWT as a bearer token (the device's own token, "
        "docs/authentication.md), else SCRAM-SHA-512 with the broker login, and HTTP Basic "
        "to an `https://` gateway that says the user's password hash cannot do SCRAM; "
        "`scram`; `bearer` (`http_token`, else the broker password); `basic` (the broker "
        "login in clear: HTTPS only, for users whose password hash cannot do SCRAM)",
    )
    ignore_payload_not_found: bool = setting(
        False,
        "skip (and log) placeholders whose object is gone instead of delivering a "
        "`PayloadNotFound` error",
        _parse_bool,
    )
    discovery_allowlist: tuple[str, ...] = setting(
        (),
        "comma-separated `http(s)://host[:port]` (`*.` allowed); a discovery record pointing "
        "elsewhere is ignored with a warning, and placeholders may be fetched from these "
        "origins too",
        _split_list,
    )
    max_partial_messages: int = setting(64, "chunked messages reassembled at once (64)", int)
    max_buffered_bytes: int = setting(
        1024 * 1024 * 1024,
        "bytes of partial chunked messages, memory and disk (1 GiB); beyond, the oldest is "
        "dropped and reported",
        int,
    )
    max_chunk_timeout: float = setting(
        3600.0,
        "most seconds a partial message is kept from its first chunk, by a chunk 0's Message "
        "Expiry Interval or a busy session extending `chunk_timeout` (3600); "
        "chunks per message and chunk entries are derived from `max_buffered_bytes`, the "
        "packet limit and `spool_threshold` (see Chunking)",
        float,
    )
    fetch_concurrency: int = setting(
        4,
        "placeholders fetched at once (4); a message is delivered once every earlier message "
        "on its topic has been (see Delivery order)",
        int,
    )
    ordering: Ordering = setting(  # noqa: RUF009
        "topic",
        "`topic` (default): order kept per topic, other topics never wait behind a fetch; "
        "`arrival`: strict arrival order across all topics",
    )
    fetch_retry_for: float = setting(
        45.0,
        "seconds a fetch retries with backoff after a transient failure (refused or reset "
        "connection, timeout, 5xx) before it is reported; later messages on its topic wait",
        float,
    )
    fetch_deadline: float = setting(
        60.0,
        "seconds any fetch may take before its rate is checked (60); after them it must have "
        "averaged `fetch_min_rate` since it began, else it is cut off and reported as a "
        "`FetchError`: a payload of `size` bytes is due within `fetch_deadline + size / "
        "fetch_min_rate` seconds, and a trickling origin holds a fetch thread that long at most",
        float,
    )
    fetch_min_rate: int = setting(
        65536,
        "slowest average rate in bytes per second a fetch may have after `fetch_deadline` "
        "(64 KiB/s)",
        int,
    )
    fetch_per_origin: int | None = setting(
        None,
        "placeholders fetched at once from one origin (default `fetch_concurrency - 1`, at "
        "least 1): slow fetches from one origin leave a thread for every other origin",
        _OPT_INT,
    )
    max_pending_deliveries: int = setting(
        1000,
        "messages received but not yet taken by the application (being fetched, waiting for "
        "their turn or queued); at the bound the client stops taking new ones; also the MQTT 5 "
        "Receive Maximum: QoS 1/2 messages beyond it wait at the broker; a persistent session "
        "holds back the acknowledgement of at most half as many chunks of partial messages",
        int,
    )
    max_pending_bytes: int = setting(
        256 * 1024 * 1024,
        "payload bytes those hold in memory (256 MiB; spooled payloads count none); one "
        "message is always admitted",
        int,
    )
    max_spool_bytes: int = setting(
        1024**3,
        "bytes of spool files that received messages not yet taken by the application hold "
        "(1 GiB; payloads above `spool_threshold`); at the bound the client stops taking new "
        "ones until the application reads; one message is always admitted",
        int,
    )
    ca_file: str | None = setting(
        None,
        "CA bundle (PEM) for `mqtts://` brokers and `https://` gateways (default: system CAs)",
        _OPT_STR,
    )
    cert_file: str | None = setting(
        None,
        "client certificate (PEM; may hold the key too) shown to a TLS broker and to an "
        "`https://` gateway that asks for one (docs/connections.md)",
        _OPT_STR,
    )
    key_file: str | None = setting(None, "private key (PEM) of `cert_file`", _OPT_STR)
    key_password: str | None = setting(
        None, "password of an encrypted `key_file`", _OPT_STR, secret=True
    )
    will_topic: str | None = setting(
        None,
        "topic of the Will the broker publishes when this client vanishes (docs/connections.md)",
        _OPT_STR,
    )
    will_payload: str | bytes | None = setting(
        None,
        "the Will's payload (text; bytes as a keyword); larger than the broker takes, it is "
        "uploaded to the gateway and the Will is its placeholder",
        _OPT_STR,
    )
    will_qos: int = setting(0, "the Will's QoS", int)
    will_retain: bool = setting(False, "the Will's retain flag", _parse_bool)
    will_delay: int = setting(
        0, "seconds the broker waits before it sends the Will (MQTT 5 Will Delay Interval)", int
    )
    websocket_headers: tuple[str, ...] = setting(
        (),
        "`Name: value` headers for a `ws[s]://` broker's upgrade request (one per line in "
        "`OFFLOAD_WEBSOCKET_HEADERS`; a list in the config file)",
        parse_header_lines,
        secret=True,
    )
    # End-to-end encryption and compression (docs/encryption.md; client/seal/_seal.py).
    encrypt_to: EncryptTo = setting(  # noqa: RUF009
        (),
        "topic filter -> age recipients (`age1...`): offloaded payloads on matching topics are "
        "encrypted to all of them, and never leave as plaintext (TOML table, or "
        "`FILTER=R1,R2;FILTER=R3`)",
        parse_encrypt_to,
    )
    identity_files: tuple[str, ...] = setting(
        (),
        "age identity files (`offload keygen`, age-keygen) tried on encrypted payloads; "
        "several at once during a key rotation",
        _split_list,
    )
    compress: bool = setting(
        False,
        "zstd-compress offloaded payloads where a sample shrinks (default false: readers that "
        "are not this library - hop-client, curl - would get zstd frames (offload-proxy "
        "decodes them for its clients); never for encrypted ones unless `compress_encrypted`)",
        _parse_bool,
    )
    no_compress: tuple[str, ...] = setting(
        (), "topic filters whose payloads are never compressed", _split_list
    )
    compress_encrypted: bool = setting(
        False,
        "compress encrypted payloads too (off: sizes leak secrets mixed with attacker data, "
        "docs/security.md)",
        _parse_bool,
    )
    group: str | None = setting(
        None,
        "the consumer group this client confirms payloads for once it verified them (the "
        "gateway deletes a payload when every group its topic waits for confirmed it, "
        "docs/operations.md); unset: confirms nothing",
        _OPT_STR,
    )
    dedup: bool = setting(
        True,
        "ask the gateway by SHA-256 and size before uploading: a payload the account stores "
        "already is linked, not sent again (never matches encrypted payloads)",
        _parse_bool,
    )

    def __post_init__(self) -> None:
        BrokerUrl.parse(self.broker)
        session_flags(self.session_expiry, self.client_id)  # ConfigError when unusable
        self.tls_files  # noqa: B018  (ConfigError: a key without its certificate)
        headers = self.websocket_headers
        if isinstance(headers, str):
            headers = parse_header_lines(headers)
        object.__setattr__(self, "websocket_headers", tuple(headers))
        websocket_headers(self.websocket_headers)  # ConfigError: a malformed header
        if self.protocol not in (4, 5):
            raise ConfigError(f"protocol must be 5 or 4 (3.1.1), got {self.protocol!r}")
        if self.group is not None and GROUP_PATTERN.fullmatch(self.group) is None:
            raise ConfigError(
                f"group {self.group!r:.80}: 1 to 64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        if self.untrusted_endpoint not in get_args(UntrustedPolicy):
            raise ConfigError("untrusted_endpoint must be 'anonymous' or 'refuse'")
        if self.ordering not in get_args(Ordering):
            raise ConfigError("ordering must be 'topic' or 'arrival'")
        _check_numbers(self)
        object.__setattr__(self, "encrypt_to", normalise_encrypt_to(self.encrypt_to))
        for name in ("identity_files", "no_compress", "discovery_allowlist"):
            value = getattr(self, name)
            object.__setattr__(
                self, name, _split_list(value) if isinstance(value, str) else tuple(value)
            )
        for entry in self.discovery_allowlist:
            parse_origin(entry)
        if self.spool_dir is not None and not os.path.isdir(self.spool_dir):
            raise ConfigError(f"spool_dir is not a directory: {self.spool_dir!r}")
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
        return not self.discovery_allowlist or url_listed(self.discovery_allowlist, url)

    def allowlisted(self, origin: Origin) -> bool:
        """Whether `origin` matches an entry of `discovery_allowlist` (empty: none does).

        An entry without a port matches the scheme's default port and any port named
        explicitly, as before: the entry names a host, not a listener.

        Args:
            origin: scheme, host and port of a URL.
        """
        return origin_listed(self.discovery_allowlist, origin)

    @property
    def fetches_per_origin(self) -> int:
        """`fetch_per_origin`, else one fewer than `fetch_concurrency` (at least 1)."""
        if self.fetch_per_origin is not None:
            return self.fetch_per_origin
        return max(1, self.fetch_concurrency - 1)

    @property
    def tls_files(self) -> TlsFiles:
        """The CA and client certificate settings as one value (read when a client is made)."""
        return TlsFiles(self.ca_file, self.cert_file, self.key_file, self.key_password)

    @property
    def broker_url(self) -> BrokerUrl:
        """The parsed broker URL with explicit username/password applied over the URL's."""
        return BrokerUrl.parse(self.broker).with_login(self.username, self.password)


#: Settings that must be at least 1; those that may be None but are positive when set; and
#: durations that must be finite and not negative.
_POSITIVE = (
    "max_partial_messages",
    "max_buffered_bytes",
    "spool_threshold",
    "max_fetch_bytes",
    "fetch_concurrency",
    "max_pending_deliveries",
    "max_pending_bytes",
    "fetch_min_rate",
    "max_spool_bytes",
)
_POSITIVE_WHEN_SET = ("max_packet_size", "offload_threshold", "fetch_per_origin")
_NOT_NEGATIVE = (
    "discovery_wait",
    "discovery_refresh",
    "chunk_timeout",
    "http_timeout",
    "max_chunk_timeout",
    "fetch_retry_for",
    "fetch_deadline",
)


#: The longest wait a duration may ask for: MQTT's longest interval (2^32 - 1 s, some 136
#: years). The platform's clocks count nanoseconds in 64 bits (some 292 years): a wait of
#: 1e10 s was accepted and then raised OverflowError from the first wait that used it.
MAX_SECONDS = 4_294_967_295


def _check_numbers(settings: ClientSettings) -> None:
    """ConfigError for the first count, size or duration out of its range."""
    for name in _POSITIVE:
        if getattr(settings, name) < 1:
            raise ConfigError(f"{name} must be positive, got {getattr(settings, name)}")
    for name in _POSITIVE_WHEN_SET:
        value = getattr(settings, name)
        if value is not None and value <= 0:
            raise ConfigError(f"{name} must be positive, got {value}")
    for name in _NOT_NEGATIVE:
        value = getattr(settings, name)
        if not 0 <= value < math.inf:  # NaN and inf too: a wait that never ends
            raise ConfigError(f"{name} must be a number of seconds, 0 or more, got {value}")
        if value > MAX_SECONDS:
            raise ConfigError(f"{name} must be at most {MAX_SECONDS} seconds, got {value}")


def settings_table() -> str:
    """The client settings table of docs/settings.md (Markdown), made from the declared fields."""
    rows = ["| setting | environment | meaning |", "| --- | --- | --- |"]
    for f in dataclasses.fields(ClientSettings):
        env = ENV_PREFIX + f.name.upper()
        rows.append(f"| `{f.name}` | `{env}` | {f.metadata['meaning']} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # python -m client.config._settings: the docs/settings.md table
    print(settings_table(), end="")
