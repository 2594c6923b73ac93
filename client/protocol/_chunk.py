"""ADR 23 chunking: splitting a payload into chunks that each fit the broker's packet limit.

The fallback when no offload endpoint is usable: a payload larger than the broker's Maximum
Packet Size travels as several PUBLISH packets on the same topic, each with a `__chunk` user
property (ADR 23; the value's format and the decisions the ADR leaves open are in
:mod:`client.protocol._chunk_header`, whose names this module re-exports). Which properties
each chunk carries and the chunk size: see :func:`plan_chunks`.

Reassembly (:class:`Reassembler`) is in :mod:`client.protocol._reassembly`, which never
imports this module.

Everything here is pure: no paho, no sockets, no clock.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass, replace

from ._chunk_header import (
    CHUNK_PROPERTY,
    MAX_U32,
    REASSEMBLY_USER_PROPERTIES,
    ChunkHeader,
    chunk_header,
)
from ._errors import MessageTooLarge
from ._props import PublishProperties
from ._size import MQTT_V5, max_payload
from ._types import MessageId


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

    Which properties each chunk carries: :func:`_chunk_properties`; the chunk size:
    :class:`_Sizing`.

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
    first, other = _chunk_properties(properties or PublishProperties(), carry_user_properties)
    sizing = _Sizing(
        topic, qos, limit, str(message_id).lower(), sha256_hex.lower(), payload_size, first, other
    )
    chunk_size, total = sizing.fit()
    return ChunkPlan(
        topic=topic,
        message_id=sizing.message_id,
        qos=qos,
        payload_size=payload_size,
        sha256=sizing.sha256,
        chunk_size=chunk_size,
        total=total,
        first_properties=first,
        other_properties=other,
    )


def _chunk_properties(
    original: PublishProperties, carry_user_properties: Collection[str]
) -> tuple[PublishProperties, PublishProperties]:
    """The properties of chunk 0 and of chunks 1.., each without its `__chunk` entry.

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

    Raises:
        ValueError: the original properties already carry `__chunk`.
    """
    if original.user_property(CHUNK_PROPERTY) is not None:
        raise ValueError(f"the original message already carries a {CHUNK_PROPERTY} property")
    first = replace(original, payload_format_indicator=None)
    other = PublishProperties(
        message_expiry_interval=original.message_expiry_interval,
        user_properties=tuple(
            (k, v) for k, v in original.user_properties if k in carry_user_properties
        ),
    )
    return first, other


@dataclass(frozen=True, slots=True)
class _Sizing:
    """The chunk size of a plan: the one number ADR 23's fixed-size chunks leave to compute.

    Every chunk gets the smallest capacity any chunk of the plan has, each capacity being
    `limit` minus the exact size of that chunk's PUBLISH without payload
    (:func:`client.protocol._size.max_payload`).
    """

    topic: str
    qos: int
    limit: int
    message_id: str
    sha256: str
    payload_size: int
    first: PublishProperties
    other: PublishProperties

    def fit(self) -> tuple[int, int]:
        """``(chunk size, number of chunks)``, iterated to a fixed point.

        The number of chunks feeds back into the header sizes, so the count is recomputed
        until it stops changing (it only grows, and changes at most once per extra decimal
        digit).

        Raises:
            MessageTooLarge: no room for payload in a chunk, or more than 2**32-1 chunks.
            MalformedChunk: the message id or checksum is malformed.
        """
        total = 1
        while True:
            chunk_size = self.capacity(total)
            needed = max(1, math.ceil(self.payload_size / chunk_size))
            if needed > MAX_U32:
                raise MessageTooLarge(
                    self.payload_size, self.limit, "would need more than 2**32-1 chunks"
                )
            if needed == total:
                return chunk_size, total
            total = needed

    def capacity(self, total: int) -> int:
        """The payload room of the fullest chunk when the plan has `total` chunks.

        Chunk 0 usually has the most properties; among the others the last index, with the
        most digits, has the largest header.

        Raises:
            MessageTooLarge: no room for payload in some chunk.
        """
        head = ChunkHeader.first(self.message_id, total, self.sha256)
        props = [self.first.with_user_properties((CHUNK_PROPERTY, str(head)))]
        if total > 1:
            last = ChunkHeader.other(self.message_id, total - 1)
            props.append(self.other.with_user_properties((CHUNK_PROPERTY, str(last))))
        cap = min(
            max_payload(self.topic, qos=self.qos, properties=p, limit=self.limit, protocol=MQTT_V5)
            for p in props
        )
        if cap < 1:
            raise MessageTooLarge(self.payload_size, self.limit, "no room for payload in a chunk")
        return cap


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
