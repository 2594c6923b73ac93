"""mqtt-offload client: publish and receive MQTT messages of any size.

Importing `client` (or `client.protocol`, `client.core._exceptions`) stays light: the paho-,
httpx- and scramp-based classes, and the protocol codecs, load on first use (the `offload`
CLI's start-up is paid by every command in a shell loop). The Spark executors, the gateway
and the `discovery` package import the protocol cores through this package; loading the MQTT client
with them would cost every such process about 0.45 s and fail where the `client` extra
(scramp) is not installed. There is no import cycle to hide: `client` imports nothing from
`discovery` or `gateway` (`lint-imports` checks it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .core._exceptions import (
    AccessRefused,
    ChecksumMismatchError,
    ChunkBufferOverflow,
    ChunkError,
    ChunkTimeoutError,
    ConfigError,
    ConnectionFailed,
    DecompressionBomb,
    DecompressionFailed,
    DecryptionFailed,
    FetchError,
    MalformedChunk,
    MalformedDiscoveryRecord,
    MalformedEnvelope,
    MalformedPlaceholder,
    MessageTooLarge,
    NoMatchingIdentity,
    OffloadError,
    PayloadChecksumMismatch,
    PayloadDecodeError,
    PayloadNotFound,
    ProtocolError,
    PublishRejected,
    ReceiveError,
    TransferError,
    UntrustedEndpoint,
    UploadError,
)

if TYPE_CHECKING:
    from ._aio import AsyncClient
    from ._client import Client
    from .config._keys import load_identities
    from .config._load import load_settings
    from .config._settings import ClientSettings
    from .core._message import Message, MessageError, Payload, PublishResult, Route
    from .http._deadline import Pace, Watchdog
    from .http._retention import confirm_payload, link_payload
    from .http._scram import BearerAuth, ScramAuth, gateway_auth
    from .http._transport import HttpTransport
    from .mqtt._acks import InvalidPublish
    from .mqtt._broker import BrokerUrl
    from .mqtt._paho import Incoming, MqttConnection
    from .mqtt._tls import TlsFiles
    from .protocol import PublishProperties
    from .receive._chunkstore import SpoolingChunkStore
    from .seal._unseal import Decoder, chunk_encoding, untagged

_LAZY = {
    "AsyncClient": "._aio",
    "Client": "._client",
    "BrokerUrl": ".mqtt._broker",
    "ClientSettings": ".config._settings",
    "load_settings": ".config._load",
    "HttpTransport": ".http._transport",
    "Pace": ".http._deadline",
    "Watchdog": ".http._deadline",
    "Message": ".core._message",
    "MessageError": ".core._message",
    "Payload": ".core._message",
    "PublishResult": ".core._message",
    "Route": ".core._message",
    "Incoming": ".mqtt._paho",
    "InvalidPublish": ".mqtt._acks",
    "MqttConnection": ".mqtt._paho",
    "ScramAuth": ".http._scram",
    "BearerAuth": ".http._scram",
    "gateway_auth": ".http._scram",
    "confirm_payload": ".http._retention",
    "link_payload": ".http._retention",
    "SpoolingChunkStore": ".receive._chunkstore",
    "TlsFiles": ".mqtt._tls",
    "Decoder": ".seal._unseal",
    "chunk_encoding": ".seal._unseal",
    "untagged": ".seal._unseal",
    "load_identities": ".config._keys",
    "PublishProperties": ".protocol",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "AccessRefused",
    "AsyncClient",
    "BearerAuth",
    "BrokerUrl",
    "ChecksumMismatchError",
    "ChunkBufferOverflow",
    "ChunkError",
    "ChunkTimeoutError",
    "Client",
    "ClientSettings",
    "ConfigError",
    "ConnectionFailed",
    "Decoder",
    "DecompressionBomb",
    "DecompressionFailed",
    "DecryptionFailed",
    "FetchError",
    "HttpTransport",
    "Incoming",
    "InvalidPublish",
    "MalformedChunk",
    "MalformedDiscoveryRecord",
    "MalformedEnvelope",
    "MalformedPlaceholder",
    "Message",
    "MessageError",
    "MessageTooLarge",
    "MqttConnection",
    "NoMatchingIdentity",
    "OffloadError",
    "Pace",
    "Payload",
    "PayloadChecksumMismatch",
    "PayloadDecodeError",
    "PayloadNotFound",
    "ProtocolError",
    "PublishProperties",
    "PublishRejected",
    "PublishResult",
    "ReceiveError",
    "Route",
    "ScramAuth",
    "SpoolingChunkStore",
    "TlsFiles",
    "TransferError",
    "UntrustedEndpoint",
    "UploadError",
    "Watchdog",
    "chunk_encoding",
    "confirm_payload",
    "gateway_auth",
    "link_payload",
    "load_identities",
    "load_settings",
    "untagged",
]
