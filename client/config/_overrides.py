"""The keyword arguments a :class:`client.Client` takes one by one, for mypy's sake.

`Client(**overrides)` and `AsyncClient(**overrides)` are typed with `Unpack` of this: every
:class:`~client.config._settings.ClientSettings` field but `broker` (the positional
argument), typed alike (`tests/test_client_units.py` holds the two together).
"""

from __future__ import annotations

from typing import TypedDict

from ._keys import EncryptTo
from ._settings import GatewayAuth, Ordering, UntrustedPolicy

__all__ = ["SettingsOverrides"]


class SettingsOverrides(TypedDict, total=False):
    """Keyword arguments accepted wherever settings can be given one by one."""

    username: str | None
    password: str | None
    client_id: str
    session_expiry: int
    protocol: int
    endpoint: str | None
    automatic_offload: bool
    fetch_external: bool
    chunking: bool
    trace_direct: bool
    max_packet_size: int | None
    offload_threshold: int | None
    discovery_topic: str
    discovery_wait: float
    discovery_refresh: float
    chunk_timeout: float
    untrusted_endpoint: UntrustedPolicy
    spool_threshold: int
    spool_dir: str | None
    http_timeout: float
    keepalive: int
    fallback_on_auth_failure: bool
    http_token: str | None
    http_login: GatewayAuth
    ignore_payload_not_found: bool
    discovery_allowlist: tuple[str, ...]
    max_partial_messages: int
    max_buffered_bytes: int
    max_chunk_timeout: float
    max_fetch_bytes: int
    fetch_concurrency: int
    ordering: Ordering
    fetch_retry_for: float
    fetch_deadline: float
    fetch_min_rate: int
    fetch_per_origin: int | None
    max_pending_deliveries: int
    max_pending_bytes: int
    max_spool_bytes: int
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    key_password: str | None
    websocket_headers: tuple[str, ...]
    will_topic: str | None
    will_payload: str | bytes | None
    will_qos: int
    will_retain: bool
    will_delay: int
    encrypt_to: EncryptTo
    identity_files: tuple[str, ...]
    compress: bool
    no_compress: tuple[str, ...]
    compress_encrypted: bool
    group: str | None
    dedup: bool
