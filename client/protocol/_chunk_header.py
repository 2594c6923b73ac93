"""ADR 23's `__chunk` user property: its value, parsed and printed, one spelling per value.

A payload larger than the broker's Maximum Packet Size may travel as several PUBLISH packets
on the same topic (the fallback when no offload endpoint is usable), each with a `__chunk`
user property (ADR 23, implemented as written):

* first chunk: ``<messageId>:<chunkIndex>:<totalChunks>:<checksum>``
* every other chunk: ``<messageId>:<chunkIndex>``

Decisions the ADR leaves open, made here once:

* Chunk indices start at 0 and the first chunk is chunk 0: it alone carries `totalChunks` and
  the checksum, so an index-0 value in the short form (or a long form with another index) is
  malformed.
* `messageId` is read case-insensitively (RFC 4122 asks for that on input) and kept and written
  in lower case; the SHA-256 `checksum` likewise, because common encoders (.NET's
  ``Convert.ToHexString``) write upper-case hex. Both are compared after lower-casing.
* Integers are plain ASCII decimal without sign, spaces or leading zeros ("0" itself is fine):
  what every u32 formatter writes. One spelling per value means a parsed value prints back
  to the same text (modulo case), so duplicates cannot hide behind aliases.

A module of its own because both sides need it: splitting (:mod:`client.protocol._chunk`)
writes it and reassembly (:mod:`client.protocol._reassembly`) reads it, and neither needs
the other. Pure: no paho, no sockets, no clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._errors import MalformedChunk
from ._props import PublishProperties
from ._types import MessageId

CHUNK_PROPERTY = "__chunk"
#: User properties copied onto every chunk because a broker or receiver needs them to route
#: and reassemble (ADR 23's example: `$partition` for shared subscriptions).
REASSEMBLY_USER_PROPERTIES: frozenset[str] = frozenset({"$partition"})
MAX_U32 = 2**32 - 1

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
# 36 (id) + 3 colons + 2 * 10 (u32 digits) + 64 (checksum): anything longer is junk.
_MAX_VALUE_LENGTH = 36 + 3 + 20 + 64


def _u32(text: str, what: str, raw: str) -> int:
    # re with fullmatch and an explicit [0-9] class: int() alone would take "+1", " 1", "1_0"
    # and non-ASCII digits.
    if not _DECIMAL.fullmatch(text):
        raise MalformedChunk(f"{CHUNK_PROPERTY} {raw!r}: {what} is not an unsigned decimal")
    value = int(text)
    if value > MAX_U32:
        raise MalformedChunk(f"{CHUNK_PROPERTY} {raw!r}: {what} exceeds 2**32-1")
    return value


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    """The value of one `__chunk` user property.

    `total` and `checksum` are set on the first chunk (index 0) and None on all others.
    Construct the first chunk's header with :meth:`first`, the others with :meth:`other`.
    """

    message_id: str
    index: int
    total: int | None = None
    checksum: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.message_id, str) or not _UUID.fullmatch(self.message_id):
            raise MalformedChunk(
                f"message id {self.message_id!r} is not a lower-case 8-4-4-4-12 UUID"
            )
        if not _is_u32(self.index):
            raise MalformedChunk(f"chunk index {self.index!r} is not an unsigned 32-bit integer")
        if (self.total is None) != (self.checksum is None):
            raise MalformedChunk("totalChunks and checksum go together, on the first chunk only")
        if self.total is None:
            if self.index == 0:
                raise MalformedChunk("chunk 0 must carry totalChunks and checksum")
            return
        if self.index != 0:
            raise MalformedChunk(f"only chunk 0 carries totalChunks, not chunk {self.index}")
        if not _is_u32(self.total) or self.total < 1:
            raise MalformedChunk(f"totalChunks {self.total!r} is not between 1 and 2**32-1")
        if not isinstance(self.checksum, str) or not _SHA256.fullmatch(self.checksum):
            raise MalformedChunk(f"checksum {self.checksum!r} is not 64 lower-case hex digits")

    @classmethod
    def first(cls, message_id: str | MessageId, total: int, checksum: str) -> ChunkHeader:
        """Header of chunk 0.

        Args:
            message_id: the message's UUID.
            total: number of chunks, 1 to 2**32-1.
            checksum: SHA-256 of the whole original payload, hex.
        """
        return cls(str(message_id).lower(), 0, total, checksum.lower())

    @classmethod
    def other(cls, message_id: str | MessageId, index: int) -> ChunkHeader:
        """Header of chunk `index` (1 or more).

        Args:
            message_id: the message's UUID.
            index: the chunk's position, 1 to 2**32-1.
        """
        return cls(str(message_id).lower(), index)

    @classmethod
    def parse(cls, value: str) -> ChunkHeader:
        """Read a `__chunk` value; the result prints back to `value` lower-cased.

        Args:
            value: the user property's value.

        Raises:
            MalformedChunk: anything that does not follow ADR 23 (and nothing else).
        """
        if not isinstance(value, str):
            raise MalformedChunk(f"{CHUNK_PROPERTY} value must be a string, got {type(value)}")
        if len(value) > _MAX_VALUE_LENGTH:
            raise MalformedChunk(f"{CHUNK_PROPERTY} value of {len(value)} characters is too long")
        parts = value.split(":")
        if len(parts) not in (2, 4):
            raise MalformedChunk(
                f"{CHUNK_PROPERTY} {value!r}: expected 2 or 4 colon-separated fields"
            )
        message_id = parts[0].lower()
        if not _UUID.fullmatch(message_id):
            raise MalformedChunk(f"{CHUNK_PROPERTY} {value!r}: messageId is not an 8-4-4-4-12 UUID")
        index = _u32(parts[1], "chunkIndex", value)
        if len(parts) == 2:
            return cls(message_id, index)
        total = _u32(parts[2], "totalChunks", value)
        checksum = parts[3].lower()
        if not _SHA256.fullmatch(checksum):
            raise MalformedChunk(f"{CHUNK_PROPERTY} {value!r}: checksum is not 64 hex digits")
        return cls(message_id, index, total, checksum)

    @property
    def is_first(self) -> bool:
        return self.total is not None

    def __str__(self) -> str:
        if self.total is None:
            return f"{self.message_id}:{self.index}"
        return f"{self.message_id}:{self.index}:{self.total}:{self.checksum}"


def _is_u32(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_U32


def chunk_header(properties: PublishProperties) -> ChunkHeader | None:
    """The message's `__chunk` header, or None when it is not a chunk.

    Args:
        properties: the received PUBLISH properties.

    Raises:
        MalformedChunk: the value is malformed, or several differing `__chunk` values are present.
    """
    values = {v for k, v in properties.user_properties if k == CHUNK_PROPERTY}
    if not values:
        return None
    if len(values) > 1:
        raise MalformedChunk(f"{len(values)} different {CHUNK_PROPERTY} user properties")
    return ChunkHeader.parse(values.pop())


__all__ = ["CHUNK_PROPERTY", "MAX_U32", "REASSEMBLY_USER_PROPERTIES", "ChunkHeader", "chunk_header"]
