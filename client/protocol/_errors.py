"""The errors the protocol cores raise: the root of the project's hierarchy lives here.

The cores are a leaf (h11 keeps `LocalProtocolError` in its core the same way): they define
the errors they raise and import nothing from the rest of `client`. :mod:`client.core._exceptions`
re-exports these very classes and hangs the I/O errors (transfer, connection, settings) under
the same :class:`OffloadError`, so `except client.OffloadError` catches both kinds.

Hierarchy (the part defined here)::

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
        +-- ChunkTimeoutError                 chunks missing when the timeout ran out
        +-- ChecksumMismatchError             .expected, .actual
        +-- ChunkBufferOverflow               dropped to respect the reassembly bounds
    +-- PayloadDecodeError                    a stored payload that cannot be decrypted or
        |                                     decompressed (hostile, damaged or not for us)
        +-- NoMatchingIdentity                .key_ids: none of our identities opens it
        +-- DecryptionFailed                  malformed, truncated or tampered age file
        +-- DecompressionFailed               malformed zstd frames
            +-- DecompressionBomb             .limit: inflates past max_fetch_bytes
"""

from __future__ import annotations


class OffloadError(Exception):
    """Base class of every error raised by mqtt-offload's client side."""


class ProtocolError(OffloadError, ValueError):
    """Bytes or values that do not follow one of the project's wire formats."""


class InvalidTopic(ProtocolError):
    def __init__(self, topic: object, reason: str) -> None:
        super().__init__(f"invalid topic {topic!r}: {reason}")
        self.topic = topic
        self.reason = reason


class InvalidMessageId(ProtocolError):
    def __init__(self, value: object, reason: str = "not a UUID") -> None:
        super().__init__(f"invalid message id {value!r}: {reason}")
        self.value = value
        self.reason = reason


class MalformedEnvelope(ProtocolError):
    """A BSON offload document that cannot be parsed or has wrong field types."""


class EnvelopeTooLarge(MalformedEnvelope):
    """A BSON offload document, or its non-payload part, larger than the parser's bound.

    Raised as soon as the declared length is read, so a server can answer 413 early.
    """

    def __init__(self, what: str, limit: int, size: int | None = None) -> None:
        detail = "" if size is None else f" ({size} bytes)"
        super().__init__(f"{what} larger than {limit} bytes{detail}")
        self.limit = limit
        self.size = size


class MalformedChunk(ProtocolError):
    """A `__chunk` user property that does not follow ADR 23."""


class MalformedPlaceholder(ProtocolError):
    """A `_format=external` message whose reference cannot be read."""


class MalformedDiscoveryRecord(ProtocolError):
    """A discovery record that is not a JSON object with a usable endpoint."""


class MessageTooLarge(OffloadError):
    def __init__(self, size: int, limit: int, reason: str = "") -> None:
        detail = f": {reason}" if reason else ""
        super().__init__(
            f"message of {size} bytes exceeds the broker limit of {limit} bytes{detail}"
        )
        self.size = size
        self.limit = limit


class ChunkError(OffloadError):
    def __init__(self, message_id: str, detail: str) -> None:
        super().__init__(f"chunked message {message_id}: {detail}")
        self.message_id = message_id


class ChunkTimeoutError(ChunkError):
    def __init__(self, message_id: str, received: int, total: int | None) -> None:
        of = "?" if total is None else str(total)
        super().__init__(message_id, f"chunk timeout: {received} of {of} chunks arrived in time")
        self.received = received
        self.total = total


class ChecksumMismatchError(ChunkError):
    def __init__(self, message_id: str, expected: str, actual: str) -> None:
        super().__init__(message_id, f"checksum mismatch: expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


class ChunkBufferOverflow(ChunkError):
    def __init__(self, message_id: str, reason: str) -> None:
        super().__init__(message_id, f"dropped partial message: {reason}")


class PayloadDecodeError(OffloadError):
    """A stored payload that cannot be decrypted or decompressed."""


class NoMatchingIdentity(PayloadDecodeError):
    """None of the configured identities can open an encrypted payload.

    Attributes:
        key_ids: the recipients' key ids the publisher named (may be empty).
        own_key_ids: the key ids of the identities that were tried.
        stanzas: the X25519 recipients the age header holds; None when it was not read
            (no identity to try, and the placeholder said what it was).
    """

    def __init__(
        self,
        key_ids: tuple[str, ...],
        own_key_ids: tuple[str, ...],
        stanzas: int | None = None,
    ) -> None:
        if key_ids:
            named = ", ".join(key_ids)
        elif stanzas is not None:
            named = f"{stanzas} X25519 recipient{'' if stanzas == 1 else 's'} (unnamed)"
        else:
            named = "recipients the placeholder does not name"
        own = ", ".join(own_key_ids) if own_key_ids else "none given (identity_files, --identity)"
        super().__init__(f"no identity opens the payload: encrypted to {named}; ours: {own}")
        self.key_ids = key_ids
        self.own_key_ids = own_key_ids
        self.stanzas = stanzas


class DecryptionFailed(PayloadDecodeError):
    """A malformed, truncated or tampered age file."""


class DecompressionFailed(PayloadDecodeError):
    """Compressed frames that cannot be decompressed."""


class DecompressionBomb(DecompressionFailed):
    def __init__(self, limit: int) -> None:
        super().__init__(f"payload inflates past {limit} bytes (max_fetch_bytes)")
        self.limit = limit
