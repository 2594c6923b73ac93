"""mqtt-offload client: publish and receive MQTT messages of any size."""

from ._aio import AsyncClient
from ._client import Client
from ._config import BrokerUrl, ClientSettings, load_settings
from ._exceptions import (
    ChecksumMismatchError,
    ChunkBufferOverflow,
    ChunkError,
    ChunkTimeoutError,
    ConfigError,
    ConnectionFailed,
    FetchError,
    MalformedChunk,
    MalformedDiscoveryRecord,
    MalformedEnvelope,
    MalformedPlaceholder,
    MessageTooLarge,
    OffloadError,
    PayloadChecksumMismatch,
    PayloadNotFound,
    ProtocolError,
    PublishRejected,
    TransferError,
    UntrustedEndpoint,
    UploadError,
)
from ._http import HttpTransport
from ._message import Message, MessageError, Payload, PublishResult, Route
from .protocol import PublishProperties

__all__ = [
    "AsyncClient",
    "BrokerUrl",
    "ChecksumMismatchError",
    "ChunkBufferOverflow",
    "ChunkError",
    "ChunkTimeoutError",
    "Client",
    "ClientSettings",
    "ConfigError",
    "ConnectionFailed",
    "FetchError",
    "HttpTransport",
    "MalformedChunk",
    "MalformedDiscoveryRecord",
    "MalformedEnvelope",
    "MalformedPlaceholder",
    "Message",
    "MessageError",
    "MessageTooLarge",
    "OffloadError",
    "Payload",
    "PayloadChecksumMismatch",
    "PayloadNotFound",
    "ProtocolError",
    "PublishProperties",
    "PublishRejected",
    "PublishResult",
    "Route",
    "TransferError",
    "UntrustedEndpoint",
    "UploadError",
    "load_settings",
]
