"""One publish's fixed parts, passed down whichever route it takes, and the wait for an ack."""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from ..core._exceptions import ConnectionFailed
from ..core._tracing import Span
from ..protocol import PublishProperties
from ..protocol._tracecontext import TraceContext
from . import _spans


def wait_ack(future: Future[None], timeout: float | None, topic: str) -> None:
    """Wait for a PUBACK / SUBACK future; a timeout is a :class:`ConnectionFailed`."""
    try:
        future.result(timeout)
    except FutureTimeout as exc:
        raise ConnectionFailed(f"no acknowledgement for {topic!r} within {timeout}s") from exc


@dataclass(frozen=True, slots=True)
class Send:
    """One publish's fixed parts, passed down the route taken."""

    topic: str
    qos: int
    retain: bool
    properties: PublishProperties | None
    limit: int
    timeout: float | None
    #: The publish span (None: not traced) and the context the message carries with it
    #: (None: none, or the publisher's own `traceparent` user property).
    span: Span | None = None
    trace: TraceContext | None = None

    def carrying(self, properties: PublishProperties | None) -> PublishProperties | None:
        """`properties` with this message's trace context as user properties."""
        return _spans.injected(properties, self.trace)
