"""Every error the client library raises or hands to the application.

Hierarchy::

    OffloadError
    +-- ProtocolError (also ValueError)       bytes or values that break a wire format
    |   +-- InvalidTopic                      .topic
    |   +-- InvalidMessageId                  .value
    |   +-- MalformedEnvelope                 BSON upload/download document
    |   |   +-- EnvelopeTooLarge              .limit: a declared size over a bound (413)
    |   +-- MalformedChunk                    `__chunk` user property
    |   +-- MalformedPlaceholder              `_format=external` message
    |   +-- MalformedDiscoveryRecord          retained discovery record
    +-- MessageTooLarge                       .size, .limit: cannot be sent at all
    +-- ChunkError                            .message_id
    |   +-- ChunkTimeoutError                 chunks missing when the timeout ran out
    |   +-- ChecksumMismatchError             .expected, .actual (also FetchError's sibling)
    |   +-- ChunkBufferOverflow               dropped to respect the reassembly bounds
    +-- TransferError                         .url, .status (None when no HTTP answer)
    |   +-- UploadError                       offload upload failed
    |   |   +-- AccessRefused                 401/403: the gateway refused the login or access
    |   +-- FetchError                        placeholder could not be resolved
    |       +-- PayloadNotFound               the object is gone (expired, deleted)
    |       +-- PayloadChecksumMismatch       .expected, .actual
    |       +-- UntrustedEndpoint             not an origin the settings allow fetching from
    +-- ReceiveError                          a received message failed unexpectedly (logged)
    +-- ConnectionFailed                      broker unreachable or refused us
    +-- PublishRejected                       .topic: the broker refused a PUBLISH (reason code)
    +-- ConfigError                           unusable settings (URL, file, value)
    +-- PayloadDecodeError                    stored payload not decryptable / decompressible
        +-- NoMatchingIdentity                .key_ids: none of our identities opens it
        +-- DecryptionFailed                  malformed, truncated or tampered age file
        +-- DecompressionFailed               malformed zstd frames
            +-- DecompressionBomb             .limit: inflates past max_fetch_bytes

Errors about one received message are not raised into the paho thread: the consumer
delivers them to the application as :class:`client.MessageError` items carrying one of these.

`OffloadError`, `ProtocolError` and its subclasses, `MessageTooLarge` and the `ChunkError`
family are raised by the protocol cores and defined there (:mod:`client.protocol._errors`), so
the cores import nothing from here; this module re-exports those same classes.
"""

from __future__ import annotations

from ..protocol._errors import (
    ChecksumMismatchError,
    ChunkBufferOverflow,
    ChunkError,
    ChunkTimeoutError,
    DecompressionBomb,
    DecompressionFailed,
    DecryptionFailed,
    EnvelopeTooLarge,
    InvalidMessageId,
    InvalidTopic,
    MalformedChunk,
    MalformedDiscoveryRecord,
    MalformedEnvelope,
    MalformedPlaceholder,
    MessageTooLarge,
    NoMatchingIdentity,
    OffloadError,
    PayloadDecodeError,
    ProtocolError,
)


class TransferError(OffloadError):
    def __init__(self, url: str, detail: str, status: int | None = None) -> None:
        super().__init__(f"{url}: {detail}")
        self.url = url
        self.status = status


class UploadError(TransferError):
    """The offload upload did not complete; nothing was published."""


class AccessRefused(UploadError):
    """The gateway refused the credentials, their absence, or the access (HTTP 401 / 403).

    A configuration error, not an unusable gateway: a publish raises it instead of falling
    back to chunking unless `fallback_on_auth_failure` is set. Nothing was published.
    """


class FetchError(TransferError):
    """A placeholder's payload could not be fetched."""


class PayloadNotFound(FetchError):
    """The referenced object does not exist (any more)."""


class PayloadChecksumMismatch(FetchError):
    def __init__(self, url: str, expected: str, actual: str) -> None:
        super().__init__(url, f"checksum mismatch: expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


class UntrustedEndpoint(FetchError):
    """The placeholder points at an origin the settings do not allow fetching from.

    Allowed are the endpoint in force (configured or discovered) and `discovery_allowlist`;
    `untrusted_endpoint = "anonymous"` opts in to any other origin, without credentials.
    """


class ReceiveError(OffloadError):
    """A received message could not be handled for a reason no other error names.

    The receive path turns every failure into a delivered error so that no message can stop
    the client; this one wraps the unexpected ones (the traceback is logged).
    """


class ConnectionFailed(OffloadError):
    """The broker could not be reached or refused the connection."""


class PublishRejected(OffloadError):
    """The broker answered a PUBLISH with a failure reason code, or paho could not queue it."""

    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"publish to {topic!r} rejected: {reason}")
        self.topic = topic


class ConfigError(OffloadError, ValueError):
    """A setting that cannot be used."""


__all__ = [
    "AccessRefused",
    "ChecksumMismatchError",
    "ChunkBufferOverflow",
    "ChunkError",
    "ChunkTimeoutError",
    "ConfigError",
    "ConnectionFailed",
    "DecompressionBomb",
    "DecompressionFailed",
    "DecryptionFailed",
    "EnvelopeTooLarge",
    "FetchError",
    "InvalidMessageId",
    "InvalidTopic",
    "MalformedChunk",
    "MalformedDiscoveryRecord",
    "MalformedEnvelope",
    "MalformedPlaceholder",
    "MessageTooLarge",
    "NoMatchingIdentity",
    "OffloadError",
    "PayloadChecksumMismatch",
    "PayloadDecodeError",
    "PayloadNotFound",
    "ProtocolError",
    "PublishRejected",
    "ReceiveError",
    "TransferError",
    "UntrustedEndpoint",
    "UploadError",
]
