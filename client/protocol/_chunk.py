"""ADR 23 chunking: the `__chunk` user property and splitting a payload into chunks.

The fallback when no offload endpoint is usable: a payload larger than the broker's Maximum
Packet Size travels as several PUBLISH packets on the same topic, each with a `__chunk` user
property (ADR 23, implemented as written):

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
* Which properties each chunk carries, and the chunk size: see :func:`plan_chunks`.

Reassembly (:class:`Reassembler`) is in :mod:`client.protocol._reassembly`, which imports this
module (never the other way round).

Everything here is pure: no paho, no sockets, no clock.
"""

from __future__ import annotations

import hashlib
import math
import re
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass, replace

from ._errors import MalformedChunk, MessageTooLarge
from ._props import PublishProperties
from ._size import MQTT_V5, max_payload
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


# --------------------------------------------------------------------------- splitting


@dataclass(frozen=True, slots=True)
class PlannedChunk:
    """One chunk to publish: bytes ``[offset, offset + length)`` of the payload."""

    index: int
    offset: int
    length: int
    properties: PublishProperties


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """How a payload of `payload_size` bytes is sent as `total` chunks.

    Chunks are produced on demand (`plan[i]`, iteration), so a plan for a payload read from a
    file costs no memory per chunk. Every chunk is `chunk_size` bytes except the last, which
    holds the rest.
    """

    topic: str
    message_id: str
    qos: int
    payload_size: int
    sha256: str
    chunk_size: int
    total: int
    first_properties: PublishProperties
    """Chunk 0's properties without its `__chunk` entry."""
    other_properties: PublishProperties
    """Properties of chunks 1.. without their `__chunk` entry."""

    def __post_init__(self) -> None:
        ChunkHeader.first(self.message_id, self.total, self.sha256)  # validates all three
        if self.chunk_size < 1 or self.payload_size < 0:
            raise ValueError("chunk_size must be positive and payload_size not negative")
        if self.total != max(1, math.ceil(self.payload_size / self.chunk_size)):
            raise ValueError(
                f"{self.total} chunks of {self.chunk_size} bytes do not fit the payload"
            )

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, index: int) -> PlannedChunk:
        if not 0 <= index < self.total:
            raise IndexError(f"chunk {index} of {self.total}")
        offset = index * self.chunk_size
        length = min(self.chunk_size, self.payload_size - offset)
        if index == 0:
            header = ChunkHeader.first(self.message_id, self.total, self.sha256)
            props = self.first_properties
        else:
            header = ChunkHeader.other(self.message_id, index)
            props = self.other_properties
        return PlannedChunk(
            index, offset, length, props.with_user_properties((CHUNK_PROPERTY, str(header)))
        )

    def __iter__(self) -> Iterator[PlannedChunk]:
        for index in range(self.total):
            yield self[index]


def plan_chunks(
    *,
    topic: str,
    payload_size: int,
    sha256_hex: str,
    message_id: str | MessageId,
    qos: int,
    properties: PublishProperties | None,
    limit: int,
    carry_user_properties: Collection[str] = REASSEMBLY_USER_PROPERTIES,
) -> ChunkPlan:
    """Plan the ADR 23 chunks of a payload known only by size and hash (e.g. a file).

    Properties on the wire:

    * chunk 0: every original property, plus `__chunk` (long form) appended to the user
      properties, *except* the Payload Format Indicator: a chunk is a byte slice that may cut a
      UTF-8 character in two, and receivers may reject a PUBLISH whose payload contradicts
      the indicator (MQTT-3.3.2-4, reason 0x99). The reassembled message therefore arrives
      without it.
    * chunks 1..: ADR 23 keeps "only those necessary to reassemble": the `__chunk` short form
      and the user properties named in `carry_user_properties`, plus the Message Expiry
      Interval. The interval is no user property, costs 5 bytes, and without it the broker
      would keep the later chunks of an expired message forever (the ADR's "forever message"),
      delivering orphans that can only time out.

    Chunk size: ADR 23 wants fixed-size chunks with a smaller last one, so every chunk gets the
    smallest capacity any chunk of the plan has, each capacity being `limit` minus the exact
    size of that chunk's PUBLISH without payload (:func:`client.protocol._size.max_payload`).
    Chunk 0 usually has the most properties; among the others the longest index decides. As
    the number of chunks feeds back into the header sizes, the count is iterated to a fixed
    point (it only grows, and changes at most once per extra decimal digit).

    Args:
        topic: the topic every chunk is published to.
        payload_size: original payload length in bytes.
        sha256_hex: SHA-256 of the whole original payload, hex.
        message_id: the UUID shared by all chunks.
        qos: QoS of every chunk (ADR 23 keeps it across chunks).
        properties: the original message's MQTT 5 properties, or None.
        limit: the broker's Maximum Packet Size in bytes (whole packet).
        carry_user_properties: user property names copied onto every chunk.

    Raises:
        MessageTooLarge: the limit leaves no room for payload in some chunk, or the payload
            would need more than 2**32-1 chunks.
        MalformedChunk: `message_id` is no UUID or `sha256_hex` no SHA-256 hex digest.
        ValueError: the original properties already carry `__chunk`, or a bad argument.
    """
    if payload_size < 0:
        raise ValueError(f"payload_size must not be negative, got {payload_size}")
    original = properties or PublishProperties()
    if original.user_property(CHUNK_PROPERTY) is not None:
        raise ValueError(f"the original message already carries a {CHUNK_PROPERTY} property")
    message_id = str(message_id).lower()
    sha256_hex = sha256_hex.lower()
    first = replace(original, payload_format_indicator=None)
    other = PublishProperties(
        message_expiry_interval=original.message_expiry_interval,
        user_properties=tuple(
            (k, v) for k, v in original.user_properties if k in carry_user_properties
        ),
    )

    def capacity(total: int) -> int:
        head = ChunkHeader.first(message_id, total, sha256_hex)
        props = [first.with_user_properties((CHUNK_PROPERTY, str(head)))]
        if total > 1:
            # The last index has the most digits, so the largest header among chunks 1..
            last = ChunkHeader.other(message_id, total - 1)
            props.append(other.with_user_properties((CHUNK_PROPERTY, str(last))))
        cap = min(
            max_payload(topic, qos=qos, properties=p, limit=limit, protocol=MQTT_V5) for p in props
        )
        if cap < 1:
            raise MessageTooLarge(payload_size, limit, "no room for payload in a chunk")
        return cap

    total = 1
    while True:
        chunk_size = capacity(total)
        needed = max(1, math.ceil(payload_size / chunk_size))
        if needed > MAX_U32:
            raise MessageTooLarge(payload_size, limit, "would need more than 2**32-1 chunks")
        if needed == total:
            break
        total = needed
    return ChunkPlan(
        topic=topic,
        message_id=message_id,
        qos=qos,
        payload_size=payload_size,
        sha256=sha256_hex,
        chunk_size=chunk_size,
        total=total,
        first_properties=first,
        other_properties=other,
    )


def split(
    payload: bytes,
    *,
    topic: str,
    qos: int,
    properties: PublishProperties | None,
    limit: int,
    message_id: str | MessageId | None = None,
    carry_user_properties: Collection[str] = REASSEMBLY_USER_PROPERTIES,
) -> list[tuple[PublishProperties, bytes]]:
    """Split an in-memory payload into ADR 23 chunks: ``(properties, chunk payload)`` each.

    Args:
        payload: the original payload.
        topic: the topic every chunk is published to.
        qos: QoS of every chunk.
        properties: the original message's MQTT 5 properties, or None.
        limit: the broker's Maximum Packet Size in bytes (whole packet).
        message_id: the UUID shared by all chunks; a new random one if None.
        carry_user_properties: user property names copied onto every chunk.

    Raises:
        MessageTooLarge: the limit leaves no room for payload in some chunk.
    """
    plan = plan_chunks(
        topic=topic,
        payload_size=len(payload),
        sha256_hex=hashlib.sha256(payload).hexdigest(),
        message_id=message_id if message_id is not None else str(uuid.uuid4()),
        qos=qos,
        properties=properties,
        limit=limit,
        carry_user_properties=carry_user_properties,
    )
    view = memoryview(payload)
    return [(c.properties, bytes(view[c.offset : c.offset + c.length])) for c in plan]


__all__ = [
    "CHUNK_PROPERTY",
    "MAX_U32",
    "REASSEMBLY_USER_PROPERTIES",
    "ChunkHeader",
    "ChunkPlan",
    "PlannedChunk",
    "chunk_header",
    "plan_chunks",
    "split",
]
