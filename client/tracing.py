"""Tracing: W3C trace context from publisher to subscriber, OpenTelemetry when installed.

Public (`client.tracing`), for the processes built on the library (the gateway, the proxy)
and for applications that want to say how the library traces (docs/tracing.md):

* :class:`Tracing` and :class:`Span`: the seam every traced part asks for spans. Without
  OpenTelemetry (the `otel` extra) it is a no-op that imports nothing and only carries a
  received context on; with it, :func:`tracing_for` gives spans from a `TracerProvider`.
* :data:`DISABLED`: no spans at all (`Client(tracer_provider=client.tracing.DISABLED)`).
* :func:`exporting_from_environment`: for a process that owns its telemetry, an SDK
  provider configured the standard way (`OTEL_*`); a library never calls it.
* :func:`message_attributes`: OpenTelemetry's messaging attributes for one message.

The W3C values themselves (`traceparent`, `tracestate`) are the pure codec's:
:class:`client.protocol.TraceContext`.
"""

from __future__ import annotations

from .core._tracers import exporting_from_environment, otel_installed, tracing_for
from .core._tracing import (
    DISABLED,
    SCOPE,
    Attributes,
    AttributeValue,
    Kind,
    Span,
    TracerProviderLike,
    Tracing,
    message_attributes,
)

__all__ = [
    "DISABLED",
    "SCOPE",
    "AttributeValue",
    "Attributes",
    "Kind",
    "Span",
    "TracerProviderLike",
    "Tracing",
    "exporting_from_environment",
    "message_attributes",
    "otel_installed",
    "tracing_for",
]
