"""The publish path's spans and the trace context a message carries (pure decisions).

After OpenTelemetry's messaging conventions (`messaging.system=mqtt`):

* `publish {topic}`: one per :meth:`client.Client.publish`, PRODUCER; its context is the
  message's *creation context*, sent as `traceparent` / `tracestate` user properties on the
  placeholder, on an ADR-23 message's first chunk, or on the PUBLISH itself. It is a child
  of the caller's current span, or begins a trace when there is none.
* `upload {topic}`: one per upload attempt, CLIENT, a child of the publish span; its
  context goes with the upload's HTTP requests (`traceparent` / `tracestate` headers), so
  the gateway's spans are its children.

A message whose publisher set a `traceparent` user property itself carries that context
unchanged (the conventions' custom creation context): the publish span is then CLIENT, a
child of the caller's span (else of that context) and links to it.

A message that goes straight to the broker (it fits, no offload) is one PUBLISH, nothing
of the library's own: it gets no span, and with the `trace_direct` setting (off by default)
carries the caller's current context when there is one (that span is then its creation
context). A span of the SDK, with its export, costs more than 5 % of a 1 KB message's
round trip, and even the context alone ~10 % (a user property through paho and the broker;
bench/RESULTS.md, "Issue 46"), so the library spends spans on the work it adds (uploads,
chunks, fetches), not on a PUBLISH.
"""

from __future__ import annotations

from ..core._message import Route
from ..core._tracing import Span, Tracing, message_attributes
from ..protocol import PublishProperties
from ..protocol._tracecontext import TRACEPARENT, TraceContext


def custom_context(properties: PublishProperties | None) -> TraceContext | bool:
    """The publisher's own creation context: the context when its `traceparent` user
    property parses, True when it has one that does not (kept as it is, never replaced),
    False when it has none."""
    if properties is None or not properties.user_properties:
        return False
    if not any(name == TRACEPARENT for name, _ in properties.user_properties):
        return False
    return TraceContext.from_pairs(properties.user_properties) or True


def start_publish(
    tracing: Tracing,
    *,
    topic: str,
    size: int,
    route: Route,
    ambient: TraceContext | None,
    custom: TraceContext | bool,
) -> Span | None:
    """The publish span of an offloaded or chunked message, or None without tracing (a
    direct one has none: it carries the caller's context, :func:`direct_context`)."""
    if not tracing.enabled and ambient is None:
        return None
    own = custom if isinstance(custom, TraceContext) else None
    attributes = message_attributes(topic, size, "publish", "send")
    attributes["offload.route"] = str(route)
    return tracing.start(
        f"publish {topic}",
        "client" if custom else "producer",
        parent=own,
        use_ambient=True,
        links=(own,) if own is not None else (),
        attributes=attributes,
    )


def direct_context(
    ambient: TraceContext | None, custom: TraceContext | bool
) -> TraceContext | None:
    """What a direct message carries with `trace_direct`: the caller's context, unless its
    publisher set one itself."""
    return None if custom else ambient


def injected(
    properties: PublishProperties | None, context: TraceContext | None
) -> PublishProperties | None:
    """`properties` with `context` appended as user properties (None: unchanged)."""
    if context is None:
        return properties
    return (properties or PublishProperties()).with_user_properties(*context.pairs())


def start_upload(
    tracing: Tracing,
    publish: Span | None,
    *,
    topic: str,
    size: int,
    message_id: str,
    server: str,
) -> Span:
    """The span of one upload attempt, a child of the publish span; a free no-op span when
    the publish is not traced (then no context goes with the upload)."""
    if publish is None:
        return Span(None)
    attributes = message_attributes(topic, size, "upload", "send", message_id)
    attributes["server.address"] = server
    return tracing.start(f"upload {topic}", "client", parent=publish, attributes=attributes)
