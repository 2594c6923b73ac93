"""What goes into a :class:`client.protocol._reassembly.Reassembler` and what comes out of it.

Values only, apart from the reassembler so that its module holds the state machine alone:
`ChunkMessage` is all it reads of a received PUBLISH (any adapter's message type fits), and
every chunk fed yields one `Outcome` - `Complete`, `Pending` or `Error` - each carrying the
other partial messages that were evicted to make room (``dropped``), so nothing is lost
silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ._errors import ChunkError, MalformedChunk
from ._props import PublishProperties

__all__ = ["ChunkMessage", "Complete", "Error", "Outcome", "Pending"]


class ChunkMessage(Protocol):
    """What :meth:`Reassembler.feed` reads from a received message."""

    @property
    def topic(self) -> str: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def properties(self) -> PublishProperties: ...
    @property
    def qos(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Complete:
    """All chunks arrived and the checksum matched: the original message."""

    topic: str
    payload: bytes | Path
    """The bytes, or the file a spooling store assembled them in (the caller owns it)."""
    properties: PublishProperties
    """Chunk 0's properties without `__chunk`."""
    message_id: str
    qos: int
    dropped: tuple[Error, ...] = ()
    """Other partial messages evicted to make room for this chunk."""
    sha256: str = ""
    """SHA-256 of the payload, lower-case hex (verified)."""
    size: int = 0
    """Payload length in bytes."""


@dataclass(frozen=True, slots=True)
class Pending:
    """The chunk was kept (or ignored as a duplicate); the message is not complete yet."""

    topic: str
    message_id: str
    index: int
    received: int
    """Distinct chunks of this message buffered so far (0 for a late duplicate)."""
    total: int | None
    """None until chunk 0 has arrived."""
    duplicate: bool = False
    """True when the chunk was already buffered or its message already finished."""
    dropped: tuple[Error, ...] = ()


@dataclass(frozen=True, slots=True)
class Error:
    """A chunked message failed; its buffers are gone and its later chunks will be ignored."""

    topic: str
    message_id: str | None
    """None when the `__chunk` value itself was unreadable."""
    error: ChunkError | MalformedChunk
    dropped: tuple[Error, ...] = ()


Outcome = Complete | Pending | Error
