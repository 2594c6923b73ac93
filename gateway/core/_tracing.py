"""The gateway's spans: one per request, its ingest, store and broker work inside it.

The request's own span (SERVER, `{method} {route}`) continues the caller's W3C trace
context (`traceparent` / `tracestate` headers, read by the bounded codec of
:class:`client.protocol.TraceContext`: a malformed or 10 KB value is no context, never an
error) and is the parent of what the request does: `store write`, `store commit`,
`store read`, and `publish {topic}` for a placeholder the gateway publishes (whose
user properties then carry the context). Without OpenTelemetry's SDK (or with no exporter
asked for) the spans are the seam's no-ops: nothing is recorded, and a caller's context
still goes on to the placeholder and into the manifest.

The request's span lives in a context variable for the request's life, as its request id
does (gateway/core/_observability.py): the ASGI middleware sets it, the code a request
runs starts children with :func:`child`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from client.protocol import TRACEPARENT, TRACESTATE, TraceContext
from client.tracing import DISABLED, Attributes, Kind, Span, Tracing

#: Where the lifespan leaves the gateway's tracing for the middleware (`scope["state"]`).
TRACING_KEY = "tracing"

_NAMES = (TRACEPARENT.encode(), TRACESTATE.encode())
#: Probes and scrapes: a span each would bury the traces of messages (every few seconds).
UNTRACED = frozenset({"/healthz", "/readyz", "/metrics"})


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """The tracing of one request and its span."""

    tracing: Tracing
    span: Span


request_trace: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar(
    "request_trace", default=None
)


def incoming_context(headers: Iterable[tuple[bytes, bytes]]) -> TraceContext | None:
    """The caller's trace context from ASGI headers; None when absent or not valid."""
    pairs = [(name.decode("ascii"), value) for name, value in headers if name in _NAMES]
    return TraceContext.from_pairs(pairs) if pairs else None


def start_request(tracing: Tracing, scope: Mapping[str, Any]) -> Span:
    """The request's SERVER span, a child of the caller's context (renamed `{method}
    {route}` when it ends: the route template is known only once routed)."""
    if scope.get("path") in UNTRACED:
        return Span(None)
    method = str(scope.get("method", ""))
    scheme = str(scope.get("scheme", "http"))
    attributes = {"http.request.method": method, "url.scheme": scheme}
    incoming = incoming_context(scope.get("headers") or ())
    return tracing.start(method, "server", parent=incoming, attributes=attributes)


def end_request(span: Span, method: str, route: str, status: int) -> None:
    """Name the span by its route template (never the raw path), record the status."""
    if span.recording:
        span.rename(f"{method} {route}")
        span.set("http.route", route)
        span.set("http.response.status_code", status)
        if status >= 500:
            span.fail(str(status))
    span.end()


def child(name: str, kind: Kind = "internal", attributes: Attributes | None = None) -> Span:
    """A span of the current request's work (a free no-op outside a request)."""
    current = request_trace.get()
    if current is None:
        return Span(None)
    return current.tracing.start(name, kind, parent=current.span, attributes=attributes)


def current_context() -> TraceContext | None:
    """The context the current request's work carries on (its span's, else the caller's)."""
    current = request_trace.get()
    return None if current is None else current.span.context


__all__ = [
    "DISABLED",
    "TRACING_KEY",
    "RequestTrace",
    "child",
    "current_context",
    "end_request",
    "incoming_context",
    "request_trace",
    "start_request",
]
