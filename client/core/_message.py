"""What the application gets back: received messages, per-message errors, publish results."""

from __future__ import annotations

import io
import os
import shutil
import weakref
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import BinaryIO

from ..protocol import PublishProperties
from ..protocol._tracecontext import TraceContext
from ._exceptions import OffloadError


class Route(StrEnum):
    """How a message crossed the broker."""

    DIRECT = "direct"
    OFFLOADED = "offloaded"
    CHUNKED = "chunked"


class Payload:
    """Payload bytes held in memory, or spooled to a temporary file when large.

    A spooled file is deleted when the payload is garbage collected or :meth:`discard` is
    called, so a consumer that only looks at metadata never leaves files behind.
    """

    __slots__ = ("__weakref__", "_data", "_finalizer", "_path", "size")

    def __init__(self, data: bytes | None = None, *, path: Path | None = None) -> None:
        if (data is None) == (path is None):
            raise ValueError("exactly one of data and path")
        self._data = data
        self._path = path
        self.size = len(data) if data is not None else os.path.getsize(path)  # type: ignore[arg-type]
        self._finalizer = weakref.finalize(self, _unlink, path) if path is not None else None

    @property
    def path(self) -> Path | None:
        """The spool file, when the payload was too large to keep in memory."""
        return self._path

    def read(self) -> bytes:
        """The whole payload in memory (reads the spool file when spooled)."""
        if self._data is not None:
            return self._data
        assert self._path is not None
        return self._path.read_bytes()

    def open(self) -> BinaryIO:
        """A binary file object positioned at the start of the payload."""
        if self._data is not None:
            return io.BytesIO(self._data)
        assert self._path is not None
        return self._path.open("rb")

    def save(self, destination: str | os.PathLike[str]) -> Path:
        """Write (or move, when spooled) the payload to `destination`.

        Args:
            destination: file path to create or overwrite.
        """
        dest = Path(destination)
        if self._path is not None and self._finalizer is not None and self._finalizer.alive:
            # Moving a spool file avoids copying gigabytes; the payload then lives at dest.
            self._finalizer.detach()
            shutil.move(self._path, dest)
            self._path = dest
            return dest
        with self.open() as src, dest.open("wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        return dest

    def discard(self) -> None:
        """Delete the spool file now instead of at garbage collection."""
        if self._finalizer is not None:
            self._finalizer()


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


@dataclass(frozen=True, eq=False)
class Message:
    """A message as the application receives it, whatever route it took.

    Attributes:
        topic: the topic it was published to.
        body: the payload, in memory or spooled to a file (see :attr:`payload`).
        sha256: SHA-256 of the payload, lowercase hex (verified for offloaded and
            chunked messages).
        qos: delivery QoS.
        retain: the retain flag as delivered.
        properties: the original publish properties (the placeholder's or chunk's
            bookkeeping properties removed).
        route: direct, offloaded or chunked.
        message_id: the offload or chunk message id, None for a direct message.
    """

    topic: str
    body: Payload
    sha256: str
    qos: int = 0
    retain: bool = False
    properties: PublishProperties = field(default_factory=PublishProperties)
    route: Route = Route.DIRECT
    message_id: str | None = None

    @property
    def payload(self) -> bytes:
        """The payload bytes (read from the spool file for huge payloads)."""
        return self.body.read()

    @property
    def size(self) -> int:
        return self.body.size

    def open(self) -> BinaryIO:
        """The payload as a binary file object (streams from disk when spooled)."""
        return self.body.open()

    @property
    def trace_context(self) -> TraceContext | None:
        """The message's creation context: its `traceparent` / `tracestate` user
        properties (W3C Trace Context over MQTT), parsed and bounded; None when it carries
        none or one that is not valid. For an OpenTelemetry context:
        `opentelemetry.propagate.extract(dict(message.trace_context.pairs()))`.
        """
        return TraceContext.from_pairs(self.properties.user_properties)


@dataclass(frozen=True)
class MessageError:
    """A message that could not be delivered, handed to the application instead of it.

    Attributes:
        topic: the topic the failed message was published to.
        error: why: e.g. PayloadNotFound, PayloadChecksumMismatch, ChunkTimeoutError.
        message_id: the offload or chunk message id, when known.
    """

    topic: str
    error: OffloadError
    message_id: str | None = None


@dataclass(frozen=True)
class PublishResult:
    """What :meth:`Client.publish` did with a message.

    Attributes:
        topic: the topic.
        route: direct, offloaded (placeholder published) or chunked.
        size: payload size in bytes.
        sha256: SHA-256 of the payload, lowercase hex.
        message_id: the UUID of an offloaded or chunked message, None when direct.
        url: where an offloaded payload can be fetched, None otherwise.
        packets: how many PUBLISH packets were sent.
    """

    topic: str
    route: Route
    size: int
    sha256: str
    message_id: str | None = None
    url: str | None = None
    packets: int = 1
