"""Gateway settings: the one place the environment is read (pydantic-settings)."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: The longest a request's wait may be set to: MQTT's longest interval (2^32 - 1 s, some
#: 136 years). A longer one passed and broke every request that waited: a wait of 1e10 s
#: overflows the clocks' 64-bit nanoseconds (OFFLOAD_BODY_IDLE_TIMEOUT=1e10: every upload
#: answered 503).
LONGEST_WAIT = 4_294_967_295


def parse_networks(text: str) -> tuple[IPNetwork, ...]:
    """`10.0.0.0/8, 192.0.2.7, fd00::/8` as networks (an address is a /32 or /128).

    Raises:
        ValueError: an entry that is neither an address nor a network.
    """
    return tuple(
        ipaddress.ip_network(part.strip(), strict=False) for part in text.split(",") if part.strip()
    )


class Settings(BaseSettings):
    """Every knob of the gateway; each maps to an `OFFLOAD_*` environment variable."""

    model_config = SettingsConfigDict(env_prefix="OFFLOAD_", extra="ignore")

    storage_url: str = Field(
        "file:///var/lib/mqtt-offload",
        description="s3://HOST:PORT/BUCKET?secure=false|true&region=R, or file:///PATH",
    )
    s3_access_key: SecretStr | None = None
    s3_secret_key: SecretStr | None = None
    s3_region: str | None = None
    s3_part_size: int = Field(8 * 1024 * 1024, ge=5 * 1024 * 1024)
    s3_parallel_uploads: int = Field(2, ge=1, le=16)
    s3_part_memory: int = Field(
        128 * 1024 * 1024,
        ge=5 * 1024 * 1024,
        description="bytes of part buffers the proxied uploads share: one alone gets "
        "(parallel uploads + 1) parts, N at once this over N each, at least one 5 MiB part",
    )
    s3_checksums: bool = Field(
        True,
        description="send upload bodies signed UNSIGNED-PAYLOAD with a CRC-32C the store "
        "verifies, when a start-up probe finds that it does (else signed with their SHA-256)",
    )
    s3_timeout: float = Field(
        10.0, gt=0, le=600, description="seconds an S3 request may wait for the store's answer"
    )
    mqtt_url: str | None = Field(None, description="mqtt://[USER:PASS@]HOST:PORT or mqtts://")
    mqtt_username: str | None = None
    mqtt_password: SecretStr | None = None
    mqtt_client_id: str | None = None
    mqtt_ca_file: Path | None = Field(None, description="CA bundle to verify an mqtts:// broker")
    mqtt_cert_file: Path | None = Field(
        None, description="client certificate (PEM) for a broker that asks for one"
    )
    mqtt_key_file: Path | None = Field(None, description="private key (PEM) of mqtt_cert_file")
    mqtt_key_password: SecretStr | None = None
    public_url: str | None = Field(None, description="endpoint URL clients are told to use")
    discovery_topic: str = "sys/metadata"
    discovery_interval: float = Field(30.0, gt=0)
    max_body_bytes: int = Field(5 * 1024**3, gt=0)
    max_header_bytes: int = Field(1024 * 1024, gt=0)
    max_topic_bytes: int = Field(512, gt=0, le=900)
    default_ttl: int = Field(7 * 24 * 3600, ge=0, description="seconds; 0 keeps forever")
    password_file: Path | None = None
    acl_file: Path | None = None
    auth_secret: SecretStr | None = None
    upload_expiry: int = Field(
        24 * 3600, gt=0, description="seconds an idle resumable upload is kept (Upload-Expires)"
    )
    presign_max_ttl: int = Field(
        7 * 24 * 3600, gt=0, description="longest validity of a presigned download URL, seconds"
    )
    tokens_file: Path | None = None
    # Identity beyond mosquitto's files (docs/authentication.md): dynamic security and JWT.
    dynsec_file: Path | None = Field(
        None,
        description="mosquitto's dynamic security plugin file: users, groups, roles "
        "(instead of password_file and acl_file); re-read when it changes",
    )
    dynsec_substitute: bool = Field(
        False,
        description="expand ACL levels that are exactly %c / %u, as mosquitto 2.1 does "
        "(2.0 compares them as text)",
    )
    jwks_file: Path | None = Field(None, description="JWKS file with JWT verification keys")
    jwks_url: str | None = Field(None, description="JWKS URL, fetched and refreshed")
    jwks_refresh: float = Field(300.0, ge=10, description="seconds between fetches of the JWKS URL")
    jwt_secret_file: Path | None = Field(
        None, description="file holding the HS256 secret (32 bytes or more)"
    )
    jwt_issuer: str | None = Field(None, description="the iss every JWT must carry")
    jwt_audience: str | None = Field(None, description="an aud every JWT must name")
    jwt_leeway: float = Field(
        30.0, ge=0, le=600, description="seconds of clock skew allowed on exp, nbf, iat"
    )
    jwt_username_claim: str = Field("sub", min_length=1, description="claim naming the user")
    jwt_acl_claim: str = Field(
        "acl", min_length=1, description="claim with topic permissions (EMQX's form)"
    )
    jwt_require_exp: bool = Field(True, description="refuse JWTs without exp")
    # Direct transfers (docs/http-api.md): bytes go between clients and the store.
    s3_public_url: str | None = Field(
        None,
        description="the store's URL as clients reach it (scheme://host[:port]); when set, "
        "upload grants and redirects hand clients presigned store URLs",
    )
    redirect_downloads: bool | None = Field(
        None,
        description="GET /msg/{id}/payload answers 307 to a presigned store URL "
        "(default: on when s3_public_url is set)",
    )
    direct_grant_ttl: int = Field(
        3600, ge=1, le=7 * 24 * 3600, description="seconds an upload grant stays valid"
    )
    redirect_ttl: int = Field(
        300, ge=1, le=7 * 24 * 3600, description="seconds a redirect's store URL stays valid"
    )
    max_open_uploads: int = Field(
        64,
        ge=0,
        description="open uploads per user (direct-upload grants and unfinished resumable "
        "uploads, across replicas); one more is refused with 429; 0: no cap",
    )
    max_reserved_bytes: int = Field(
        64 * 1024**3,
        ge=0,
        description="bytes one user's open uploads may reserve together (their declared "
        "sizes); one that would pass it is refused with 429; 0: no cap",
    )
    direct_verify_sha256: bool = Field(
        False,
        description="read a multipart direct upload back at commit and check its whole SHA-256 "
        "(a store read per upload through the gateway; parts are store-verified anyway)",
    )

    @field_validator("s3_public_url")
    @classmethod
    def _check_public_store(cls, value: str | None) -> str | None:
        if not value:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("s3_public_url must be http(s)://host[:port]")
        if parts.path.strip("/") or parts.query or parts.fragment or parts.username:
            raise ValueError("s3_public_url must be an origin: no path, query or user")
        return f"{parts.scheme}://{parts.netloc}"

    allow_anonymous: bool = Field(
        False,
        description="serve requests without credentials as anonymous (ACL's anonymous rules); "
        "without a password or tokens file the gateway serves nobody unless this is true",
    )
    auth_realm: str = "mqtt-offload"
    tls: bool = Field(False, description="clients reach the gateway over HTTPS (maybe via a proxy)")
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    log_format: str = Field("text", pattern="^(text|json)$")
    log_level: str = "INFO"
    shutdown_timeout: float = Field(
        30.0, gt=0, description="seconds in-flight requests may finish after SIGTERM"
    )

    # Retention and limits (docs/reliability.md).
    max_ttl: int = Field(
        30 * 24 * 3600, ge=0, description="seconds; cap on any payload's lifetime; 0: no cap"
    )
    min_ttl: int = Field(
        0,
        ge=0,
        description="seconds every payload is kept at least, whatever shorter ttl its uploader "
        "asked for (a floor for the persistent sessions served: docs/connections.md); "
        "max_ttl still wins; 0: no floor",
    )
    sweep_interval: float = Field(
        600.0, ge=0, description="seconds between retention sweeps (jittered); 0: no sweeper"
    )
    sweep_grace: float = Field(
        3600.0, ge=0, description="seconds before an unreferenced payload counts as abandoned"
    )
    store_probe_interval: float = Field(
        15.0,
        ge=0,
        description="seconds between checks of the object store for `offload_store_up` "
        "(docs/operations.md, 'Alerts'); 0: no checks",
    )
    delete_after_fetch: bool = Field(
        False,
        description="delete a message once its whole payload was written to one client's "
        "connection",
    )
    max_uploads_per_client: int = Field(
        16, ge=0, description="concurrent uploads per client address (429 beyond); 0: no limit"
    )
    max_uploads_per_user: int = Field(
        8,
        ge=0,
        description="concurrent uploads per authenticated user, from any address (429 "
        "beyond); 0: no limit",
    )
    trusted_proxies: str = Field(
        "",
        description="comma-separated addresses and CIDRs of hops (offload-proxy, a load "
        "balancer) whose X-Forwarded-For names the client's address; empty: none",
    )
    header_timeout: float = Field(
        10.0,
        ge=0,
        le=LONGEST_WAIT,
        description="seconds a client has to send a request's head (request line and "
        "headers), from the connection or the head's first byte; else 408 and close "
        "(slow loris); 0: no limit",
    )
    body_idle_timeout: float = Field(
        30.0, gt=0, le=LONGEST_WAIT, description="seconds an upload body may stall before 408"
    )
    min_body_rate: int = Field(
        1024,
        ge=0,
        description="bytes per second an upload body must average over each body idle "
        "timeout of waiting for it (408 below: trickling slow loris); 0: no minimum",
    )

    # Browser uploads (tus-js-client, Uppy): CORS, off unless origins are named.
    cors_origins: str = Field(
        "",
        description="comma-separated origins (scheme://host[:port], or *) allowed CORS; "
        "empty: no CORS",
    )

    @field_validator("cors_origins")
    @classmethod
    def _check_cors_origins(cls, value: str) -> str:
        from ._cors import parse_origins

        parse_origins(value)  # refuses a malformed origin at start-up
        return value

    # Concurrency and load: pools, admission, timeouts (docs/deployment.md, "Load and concurrency").
    max_transfers: int = Field(
        64,
        ge=1,
        le=4096,
        description="streaming uploads and downloads at once, one thread each (503 beyond)",
    )
    store_threads: int = Field(
        16,
        ge=1,
        le=512,
        description="threads for object-store calls (manifests, deletes, upload state, sweeps)",
    )
    hash_threads: int = Field(
        2, ge=1, le=64, description="threads for password hashing (PBKDF2 for Basic and SCRAM)"
    )
    store_stall_timeout: float = Field(
        60.0,
        gt=0,
        le=LONGEST_WAIT,
        description="seconds a transfer may wait for the object store before 503",
    )
    send_idle_timeout: float = Field(
        60.0,
        gt=0,
        le=LONGEST_WAIT,
        description="seconds a response may wait for the client to read",
    )
    health_timeout: float = Field(
        30.0,
        gt=0,
        le=LONGEST_WAIT,
        description="seconds a queued job may wait for a thread before /healthz 503",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="port of the Prometheus /metrics, apart from the API (its exemplars name "
        "requests' trace ids); unset: not served",
    )
    metrics_host: str = Field(
        "127.0.0.1", description="address of the metrics port (0.0.0.0: every interface)"
    )

    # Retention by consumer group, one object per payload per account, quotas on what an
    # account keeps (docs/operations.md, "Retention by consumer group").
    retention_groups_file: Path | None = Field(
        None,
        description="TOML file naming, per topic filter, the consumer groups that must each "
        "confirm a payload before it is deleted ahead of its expiry; re-read when it changes",
    )
    dedup: bool = Field(
        True,
        description="one object per payload per account: a payload the account already "
        "stores is linked to the new message instead of stored again",
    )
    max_stored_bytes_per_user: int = Field(
        0,
        ge=0,
        description="payload bytes one account may keep stored (a shared payload counts "
        "once); an upload that would pass it is refused with 413; 0: no quota",
    )
    confirm_sweep_interval: float = Field(
        30.0,
        ge=0,
        description="seconds between the sweeper's short passes over confirmations (it "
        "deletes what every group confirmed where a replica stopped in between); 0: none",
    )
    top_accounts: int = Field(
        10,
        ge=0,
        le=100,
        description="accounts named in offload_account_stored_bytes (those storing the most)",
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _check_trusted_proxies(cls, value: str) -> str:
        parse_networks(value)  # refuses a malformed address or network at start-up
        return value

    @property
    def trusted_networks(self) -> tuple[IPNetwork, ...]:
        """The hops whose `X-Forwarded-For` is believed (`trusted_proxies`)."""
        return parse_networks(self.trusted_proxies)

    @field_validator("storage_url")
    @classmethod
    def _check_storage_url(cls, value: str) -> str:
        scheme = urlsplit(value).scheme
        if scheme not in ("s3", "file"):
            raise ValueError("storage_url must start with s3:// or file://")
        return value


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings from the environment, read once (overridable with FastAPI dependency_overrides)."""
    return Settings()
