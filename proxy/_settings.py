"""The proxy's settings: the one place the environment is read (pydantic-settings).

Each field is an `OFFLOAD_PROXY_*` variable and the command line's flags override the
broker, host, port and endpoint (`offload-proxy --help`); docs/proxy.md lists them all.
"""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from ._shares import Limits
from ._spool import SpoolLimits

#: The longest a duration setting may be: MQTT's longest interval (2^32 - 1 s, some 136
#: years). A longer one passed and broke every transfer: a wait of 1e10 s overflows the
#: clocks' 64-bit nanoseconds (OverflowError at its first use: idle_timeout or
#: http_timeout 1e10 disconnected each device that published a large message).
LONGEST_WAIT = 4_294_967_295

MQTT_MAX_PACKET = 268_435_460  # the largest MQTT packet: 1 + 4 + 268,435,455
#: One account's or address's default share of a pool: this fraction of it.
SHARE = 8


def _shares(total: int, per_user: int | None, per_address: int | None) -> Limits:
    default = max(1, total // SHARE)
    return Limits(total, per_user or default, per_address or default)


class ProxySettings(BaseSettings):
    """Every knob of `offload-proxy`."""

    model_config = SettingsConfigDict(env_prefix="OFFLOAD_PROXY_", extra="ignore")

    broker: str = Field(
        "mqtt://127.0.0.1:1883", description="mqtt://HOST:PORT or mqtts://HOST:PORT of the broker"
    )
    broker_ca_file: Path | None = Field(
        None, description="CA bundle to verify an mqtts:// broker (default: the system's)"
    )
    tls_cert_file: Path | None = Field(
        None, description="certificate chain (PEM): clients then connect to the proxy over TLS"
    )
    tls_key_file: Path | None = Field(None, description="its private key (PEM)")
    ca_file: Path | None = Field(
        None, description="CA bundle to verify an https:// gateway (default: the system's)"
    )
    host: str = Field("127.0.0.1", description="address the proxy listens on")
    port: int = Field(1884, ge=0, le=65535, description="port the proxy listens on")
    ws_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="port for MQTT over WebSocket (subprotocol mqtt, any path; TLS as the "
        "main listener's); unset: none",
    )
    endpoint: str | None = Field(
        None, description="gateway base URL; unset: the discovery record on the broker"
    )
    broker_max_packet_size: int = Field(
        262_144,
        gt=0,
        description="the broker's limit where its CONNACK does not say one (MQTT 3.1.1, and "
        "a Will in CONNECT, which goes out before any CONNACK)",
    )
    max_packet_size: int = Field(
        MQTT_MAX_PACKET,
        gt=0,
        le=MQTT_MAX_PACKET,
        description="the proxy's own limit, told to MQTT 5 clients in CONNACK",
    )
    upgrade_v311: bool = Field(
        True,
        description="speak MQTT 5 to the broker for MQTT 3.1.1 clients, so that chunked "
        "messages reach them whole (false: a broker without MQTT 5)",
    )
    max_connections: int = Field(
        10_000,
        gt=0,
        description="client connections at once (lowered at start to what the file "
        "descriptor limit allows, with a warning)",
    )
    max_connections_per_address: int | None = Field(
        None,
        gt=0,
        description="client connections from one address at once (beyond: CONNACK 0x89); "
        "default: an eighth of max_connections",
    )
    max_connections_per_user: int | None = Field(
        None,
        gt=0,
        description="client connections one account (a user name the broker accepted) may "
        "have at once (beyond: CONNACK 0x97); default: an eighth of max_connections",
    )
    max_uploads: int = Field(64, gt=0, description="offloaded PUBLISHes streaming at once")
    max_uploads_per_user: int | None = Field(
        None,
        gt=0,
        description="uploads one account (user name the broker accepted) may have at once; "
        "default: an eighth of max_uploads, at least 1",
    )
    max_uploads_per_address: int | None = Field(
        None,
        gt=0,
        description="uploads one device address may have at once; default: an eighth of "
        "max_uploads, at least 1",
    )
    max_fetches: int = Field(64, gt=0, description="placeholders being resolved at once")
    max_fetches_per_user: int | None = Field(
        None,
        gt=0,
        description="placeholders resolved at once for one account's subscribers (more "
        "wait); default: an eighth of max_fetches, at least 1",
    )
    max_fetches_per_address: int | None = Field(
        None,
        gt=0,
        description="placeholders resolved at once for one device address (more wait); "
        "default: an eighth of max_fetches, at least 1",
    )
    max_shared_bytes: int = Field(
        512 * 1024 * 1024,
        ge=0,
        description="bytes of payloads fetched once and fed to every device behind the "
        "proxy that gets the same placeholder meanwhile, held at once (in memory up to "
        "shared_memory_bytes, the rest in temporary files in spool_dir); a payload with no "
        "room is fetched for each device alone; 0: never shared",
    )
    max_shared_bytes_per_user: int | None = Field(
        None,
        ge=0,
        description="of max_shared_bytes, what the payloads one account's subscribers read "
        "may hold (each payload counted once per account); default: an eighth",
    )
    max_shared_bytes_per_address: int | None = Field(
        None,
        ge=0,
        description="the same for one device address; default: an eighth of max_shared_bytes",
    )
    shared_memory_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="of max_shared_bytes, what may be held in memory; the rest is spooled "
        "to temporary files",
    )
    max_reassembly_bytes: int = Field(
        64 * 1024 * 1024,
        gt=0,
        description="chunk bytes (ADR 23) one connection buffers to reassemble messages",
    )
    max_reassembly_total: int = Field(
        256 * 1024 * 1024,
        gt=0,
        description="chunk bytes all connections together buffer to reassemble messages",
    )
    reassembly_timeout: float = Field(
        300.0,
        gt=0,
        le=LONGEST_WAIT,
        description="seconds a chunked message may take to arrive whole",
    )
    identity_files: Annotated[tuple[Path, ...], NoDecode] = Field(
        (),
        description="age identity files (comma-separated, as the client's identity_files): "
        "encrypted payloads are decrypted for clients that do not resolve placeholders",
    )
    max_decoded_bytes: int = Field(
        MQTT_MAX_PACKET,
        gt=0,
        description="largest payload an encrypted or compressed one decodes to for a client "
        "(a decompression bomb stops there)",
    )
    spool_dir: Path | None = Field(
        None, description="where decoded payloads over 1 MiB wait until whole (default: TMPDIR)"
    )
    connect_timeout: float = Field(
        10.0, gt=0, le=LONGEST_WAIT, description="seconds for a whole CONNECT"
    )
    idle_timeout: float = Field(
        30.0,
        gt=0,
        le=LONGEST_WAIT,
        description="seconds a packet that has begun may wait for its next byte, and a client "
        "or the broker may take too little of a packet written to it (then the client is "
        "disconnected)",
    )
    http_timeout: float = Field(
        60.0, gt=0, le=LONGEST_WAIT, description="seconds for each gateway request step"
    )
    fetch_deadline: float = Field(
        60.0,
        ge=0,
        le=LONGEST_WAIT,
        description="seconds any gateway request for a placeholder (a HEAD, a payload GET "
        "with its redirect) may take before its rate is checked; after them it must have "
        "averaged `fetch_min_rate` since it began, else it is cut off: a payload of `size` "
        "bytes is due within `fetch_deadline + size / fetch_min_rate` seconds, a HEAD within "
        "`fetch_deadline` (as the client library's `fetch_deadline`)",
    )
    fetch_min_rate: int = Field(
        65536,
        gt=0,
        description="slowest average rate in bytes per second a fetch may have after "
        "`fetch_deadline` (64 KiB/s; time it waits for a device to take its pieces not counted)",
    )
    gateway_login: Literal["auto", "scram", "bearer", "basic"] = Field(
        "auto",
        description="how a device's CONNECT login reaches the gateway: `auto`: a password that "
        "is a JWT as a bearer token, else SCRAM-SHA-512, and HTTP Basic to an https:// gateway "
        "that says the user's hash cannot do SCRAM; or `scram`, `bearer`, `basic` (the "
        "password in clear: only to an https:// gateway or one behind TLS, for users whose hash "
        "cannot do SCRAM)",
    )
    jwt_username_claim: str = Field(
        "sub",
        min_length=1,
        description="the claim of a JWT password that names the device's account for its "
        "shares (as the gateway's OFFLOAD_JWT_USERNAME_CLAIM): such brokers may ignore the "
        "CONNECT's user name",
    )
    max_connect_bytes: int = Field(
        128 * 1024,
        gt=0,
        description="largest CONNECT read (a Will payload and a password are at most 64 KiB each)",
    )
    max_login_bytes: int = Field(
        64 * 1024 * 1024,
        gt=0,
        description="bytes all connections together may hold before their login is "
        "answered (their CONNECTs); one address at most an eighth of it",
    )
    discovery_username: str | None = None
    discovery_password: SecretStr | None = None
    dedup_bytes: int = Field(
        1024 * 1024,
        ge=0,
        description="a PUBLISH offloaded whose payload is at most this large is read whole "
        "first, so the gateway is asked by SHA-256 and a payload the device's account stores "
        "is not sent again (a larger one streams; the gateway still keeps one copy); 0: none",
    )
    dedup_memory: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="bytes all connections together may hold so (beyond: the payload streams)",
    )
    group: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="consumer group the proxy confirms a payload for once it delivered it, "
        "verified, to a device (the gateway's retention by group); unset: none",
    )
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="port of /metrics and /healthz; unset: none"
    )
    metrics_host: str = "127.0.0.1"
    shutdown_timeout: float = Field(
        30.0, ge=0, le=LONGEST_WAIT, description="seconds transfers under way may take at shutdown"
    )
    log_level: str = "INFO"
    loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop", description="event loop (bench/RESULTS.md, 'Proxy: codec and event loop')"
    )
    # Load balancers and processes (docs/proxy.md, "Behind a load balancer", "Processes").
    trusted_lbs: Annotated[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...], NoDecode] = (
        Field(
            (),
            description="load balancers (addresses and CIDRs, comma-separated) that must send "
            "a PROXY protocol header (v1 or v2) on both listeners: its source address is the "
            "device's; from any other address a PROXY header is refused; none by default",
        )
    )
    backlog: int | None = Field(
        None,
        gt=0,
        le=2**31 - 1,
        description="connections the kernel queues for the proxy to accept (the listen "
        "backlog); default: the system's most (Linux: net.core.somaxconn, which also caps a "
        "larger value)",
    )
    workers: int = Field(
        1,
        ge=1,
        le=256,
        description="processes serving the listeners, each with its own event loop, "
        "connections, limits and memories (docs/proxy.md, 'Processes')",
    )

    @property
    def upload_shares(self) -> Limits:
        """`max_uploads` and each account's and address's share of it."""
        return _shares(self.max_uploads, self.max_uploads_per_user, self.max_uploads_per_address)

    @property
    def fetch_shares(self) -> Limits:
        """`max_fetches` and each account's and address's share of it."""
        return _shares(self.max_fetches, self.max_fetches_per_user, self.max_fetches_per_address)

    @property
    def shared_limits(self) -> SpoolLimits:
        """What the payloads fetched once for several devices may hold together: bytes (in
        total, per account, per address), bytes in memory, and how many at once (at most
        `max_fetches`: each may hold a file descriptor, counted as a fetch's)."""
        total = self.max_shared_bytes
        default = total // SHARE
        per_user = self.max_shared_bytes_per_user
        per_address = self.max_shared_bytes_per_address
        shares = Limits(
            total,
            default if per_user is None else per_user,
            default if per_address is None else per_address,
        )
        return SpoolLimits(shares, min(self.shared_memory_bytes, total), self.max_fetches)

    def connection_shares(self, total: int | None) -> Limits:
        """`total` connections (`max_connections`, or what the descriptors allow), each
        address's share (taken when a connection is accepted) and each account's (once the
        broker accepted its login)."""
        total = total or self.max_connections
        per_address = self.max_connections_per_address or max(1, total // SHARE)
        per_user = self.max_connections_per_user or max(1, total // SHARE)
        return Limits(total, min(per_user, total), min(per_address, total))

    @property
    def login_shares(self) -> Limits:
        """`max_login_bytes` and each address's share (no account is known before a login)."""
        total = self.max_login_bytes
        one = 2 * self.max_connect_bytes + 65536  # what the largest CONNECT is counted
        return Limits(total, total, min(total, max(one, total // SHARE)))

    @field_validator("identity_files", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("broker")
    @classmethod
    def _broker_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname or parts.port is None:
            raise ValueError("broker must be mqtt://HOST:PORT or mqtts://HOST:PORT")
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> ProxySettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        return self

    def listener_tls(self) -> ssl.SSLContext | None:
        """The TLS context clients connect with, None for plain TCP."""
        if self.tls_cert_file is None or self.tls_key_file is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        return context

    def broker_tls(self) -> ssl.SSLContext | None:
        """The TLS context toward an mqtts:// broker, None for mqtt://."""
        if urlsplit(self.broker).scheme != "mqtts":
            return None
        cafile = str(self.broker_ca_file) if self.broker_ca_file else None
        return ssl.create_default_context(cafile=cafile)

    @field_validator("endpoint")
    @classmethod
    def _endpoint_url(cls, value: str | None) -> str | None:
        if value is not None and urlsplit(value).scheme not in ("http", "https"):
            raise ValueError("endpoint must be an http:// or https:// URL")
        return value.rstrip("/") if value else value

    @property
    def broker_address(self) -> tuple[str, int]:
        parts = urlsplit(self.broker)
        assert parts.hostname is not None and parts.port is not None
        return parts.hostname, parts.port

    @field_validator("trusted_lbs", mode="before")
    @classmethod
    def _networks(cls, value: object) -> object:
        parts = value.replace(",", " ").split() if isinstance(value, str) else value
        if not isinstance(parts, list | tuple):
            return value
        try:  # strict: 10.0.0.1/8 (host bits set) is a typo, not 10.0.0.0/8
            return tuple(ipaddress.ip_network(str(part).strip()) for part in parts)
        except ValueError as exc:
            raise ValueError(f"trusted_lbs: {exc}") from exc
