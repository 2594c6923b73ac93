"""The discovery record: what the gateway advertises on the retained discovery topic. Pure.

On the wire it is a JSON object. `LargeMessageUploadEndpoint` is the key hop-client reads;
the others are this project's and optional, so a hop-style record with only the endpoint
is accepted too::

    {"LargeMessageUploadEndpoint": "https://offload.example.com",
     "OffloadProtocolVersion": 1,
     "MaxUploadBytes": 5368709120,
     "AuthMechanisms": ["SCRAM-SHA-512", "SCRAM-SHA-256"],
     "DirectStore": "https://s3.example.com"}

`DirectStore` (the object store's origin as clients reach it) says the gateway offers direct
transfers (upload grants, download redirects to that origin). Readers ignore keys they do
not know, so old clients read new records and new clients read old ones; a `DirectStore`
that is not an http(s) origin is dropped (the record stays usable, without direct transfers).

Anyone who can write the discovery topic can put anything there, and every client reads it
on paho's network thread: :meth:`DiscoveryRecord.from_json` bounds size and depth before it
decodes and raises only :class:`MalformedDiscoveryRecord`, whatever the bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ._bounded import http_origin, loads_object
from ._errors import MalformedDiscoveryRecord

DISCOVERY_ENDPOINT_KEY = "LargeMessageUploadEndpoint"
DISCOVERY_TOPIC = "sys/metadata"
DISCOVERY_PROTOCOL_VERSION = 1
#: Largest discovery record read (a real one is under 300 bytes).
MAX_RECORD_BYTES = 16384


@dataclass(frozen=True, slots=True)
class DiscoveryRecord:
    """An offload endpoint as advertised by a gateway."""

    endpoint: str
    protocol_version: int = DISCOVERY_PROTOCOL_VERSION
    max_upload_bytes: int | None = None
    auth_mechanisms: tuple[str, ...] = ()
    direct_store: str | None = None

    def __post_init__(self) -> None:
        try:
            http_origin(self.endpoint)
        except ValueError as exc:
            raise MalformedDiscoveryRecord(f"endpoint: {exc}") from exc
        if self.direct_store is not None:
            try:
                origin = http_origin(self.direct_store)
            except ValueError as exc:
                raise MalformedDiscoveryRecord(f"direct store: {exc}") from exc
            object.__setattr__(self, "direct_store", str(origin))
        if self.endpoint.endswith("/"):
            object.__setattr__(self, "endpoint", self.endpoint.rstrip("/"))

    @property
    def scheme(self) -> str:
        return urlsplit(self.endpoint).scheme

    @property
    def netloc(self) -> str:
        return urlsplit(self.endpoint).netloc

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            DISCOVERY_ENDPOINT_KEY: self.endpoint,
            "OffloadProtocolVersion": self.protocol_version,
        }
        if self.max_upload_bytes is not None:
            doc["MaxUploadBytes"] = self.max_upload_bytes
        if self.auth_mechanisms:
            doc["AuthMechanisms"] = list(self.auth_mechanisms)
        if self.direct_store is not None:
            doc["DirectStore"] = self.direct_store
        # Sorted keys: replicas advertising the same settings publish identical bytes.
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_json(cls, payload: bytes | str) -> DiscoveryRecord:
        """Read a record from the discovery topic's payload.

        Raises:
            MalformedDiscoveryRecord: whatever is wrong with it (and nothing else).
        """
        data = payload.encode("utf-8", "surrogatepass") if isinstance(payload, str) else payload
        try:
            doc = loads_object(data, max_bytes=MAX_RECORD_BYTES)
        except ValueError as exc:
            raise MalformedDiscoveryRecord(str(exc)) from exc
        endpoint = doc.get(DISCOVERY_ENDPOINT_KEY)
        if not isinstance(endpoint, str):
            raise MalformedDiscoveryRecord(f"{DISCOVERY_ENDPOINT_KEY} missing or not a string")
        version = doc.get("OffloadProtocolVersion", DISCOVERY_PROTOCOL_VERSION)
        max_bytes = doc.get("MaxUploadBytes")
        mechs = doc.get("AuthMechanisms", [])
        if not isinstance(version, int) or isinstance(version, bool):
            raise MalformedDiscoveryRecord("OffloadProtocolVersion must be an integer")
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes <= 0):
            raise MalformedDiscoveryRecord("MaxUploadBytes must be a positive integer")
        if not isinstance(mechs, list) or not all(isinstance(m, str) for m in mechs):
            raise MalformedDiscoveryRecord("AuthMechanisms must be a list of strings")
        if isinstance(max_bytes, bool):
            raise MalformedDiscoveryRecord("MaxUploadBytes must be a positive integer")
        return cls(endpoint, version, max_bytes, tuple(mechs), _direct_store(doc))


def _direct_store(doc: dict[str, Any]) -> str | None:
    """The record's `DirectStore` origin; None when absent or not an http(s) origin."""
    value = doc.get("DirectStore")
    if not isinstance(value, str):
        return None
    try:
        return str(http_origin(value))
    except ValueError:
        return None
