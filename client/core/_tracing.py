"""The tracing seam: spans where OpenTelemetry is there, free no-ops where it is not.

Every part that traces (the client's publish and receive paths, the gateway, the proxy)
holds a :class:`Tracing` and asks it for spans. Two kinds exist:

* this module's own, the no-op: nothing is recorded, nothing is imported, and a span only
  carries on the context it was started in (its parent's, or the `ambient` one given), so
  a trace a publisher began still reaches the subscriber through a hop that does not
  record it; what OpenTelemetry's API does without an SDK;
* :class:`client.core._otel.OtelTracing`, the OpenTelemetry adapter, loaded only by
  :func:`client.core._tracers.tracing_for` when `opentelemetry` is installed (the `otel`
  extra, or an application's own): the one module that imports it (`lint-imports`
  holds that).

Contexts cross this seam as :class:`client.protocol.TraceContext` values, parsed and
bounded by the pure codec, so no span and no header ever holds what a peer sent unparsed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Literal, Protocol

from ..protocol._tracecontext import TraceContext

Kind = Literal["internal", "server", "client", "producer", "consumer"]
AttributeValue = str | int | float | bool
Attributes = Mapping[str, AttributeValue]
#: The instrumentation scope of every span this project makes.
SCOPE = "mqtt-offload"
SYSTEM = "mqtt"


def message_attributes(
    topic: str, size: int, operation: str, kind: str, message_id: str | None = None
) -> dict[str, AttributeValue]:
    """The attributes of a span about one message, after OpenTelemetry's messaging
    conventions: never its payload, never a login.

    Args:
        topic: `messaging.destination.name`.
        size: `messaging.message.body.size` (the payload's bytes).
        operation: `messaging.operation.name` (`publish`, `upload`, `fetch`, `receive`).
        kind: `messaging.operation.type` (`send`, `receive`, `process`).
        message_id: `messaging.message.id`: the offload's id, when there is one.
    """
    attributes: dict[str, AttributeValue] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": topic,
        "messaging.operation.name": operation,
        "messaging.operation.type": kind,
        "messaging.message.body.size": size,
    }
    if message_id is not None:
        attributes["messaging.message.id"] = message_id
    return attributes


class TracerProviderLike(Protocol):
    """What an OpenTelemetry `TracerProvider` offers that the adapter uses."""

    def get_tracer(self, instrumenting_module_name: str, *args: object, **kwargs: object) -> object:
        """A tracer for one instrumentation scope."""


class Span:
    """A span of the no-op seam: records nothing, carries its context on.

    Also the base of the OpenTelemetry adapter's spans. Use as a context manager (an
    exception leaving it marks the span failed) or call :meth:`end`.

    Attributes:
        context: what goes on the wire for this span's children (a header, a user
            property): the span's own context when it is recorded, else the context it
            was started in, else None.
    """

    __slots__ = ("context",)

    def __init__(self, context: TraceContext | None) -> None:
        self.context = context

    @property
    def recording(self) -> bool:
        """Whether attributes set on this span are kept (False: skip computing them)."""
        return False

    def set(self, key: str, value: AttributeValue) -> None:
        """Set one attribute (never payload bytes, passwords or tokens)."""

    def rename(self, name: str) -> None:
        """Give the span its final name (a server span's, once the route is known)."""

    def fail(self, error: BaseException | str) -> None:
        """Mark the span failed: `error.type` and an error status (the type, no message)."""

    def end(self) -> None:
        """End the span."""

    def __enter__(self) -> Span:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if ev is not None:
            self.fail(ev)
        self.end()


class Tracing:
    """No tracing: spans cost a small object each and carry their parent's context on.

    Args:
        ambient: the context a span without a parent continues (a process's caller: the
            `offload` CLI's `TRACEPARENT`); None: such spans carry no context.
    """

    enabled = False

    def __init__(self, ambient: TraceContext | None = None) -> None:
        self._ambient = ambient

    def ambient(self) -> TraceContext | None:
        """The caller's current context (OpenTelemetry's current span), if any."""
        return self._ambient

    def start(
        self,
        name: str,
        kind: Kind = "internal",
        *,
        parent: TraceContext | Span | None = None,
        use_ambient: bool = False,
        links: Sequence[TraceContext] = (),
        attributes: Attributes | None = None,
    ) -> Span:
        """Start a span.

        Args:
            name: the span's name (`publish a/b`, `PUT /msg/{id}`: low cardinality).
            kind: OpenTelemetry's span kind.
            parent: a context received from a peer (a header, a user property): the span
                is its child (a remote parent); or a span of this process (a local one).
            use_ambient: the caller's current context, when there is one, is the parent
                instead of `parent`.
            links: contexts the span links to (a message's creation context).
            attributes: set at the start (what samplers see).
        """
        if use_ambient and self._ambient is not None:
            return Span(self._ambient)
        return Span(parent.context if isinstance(parent, Span) else parent)


#: No spans, no context carried: what a process gets when it asks for no tracing.
DISABLED = Tracing()
