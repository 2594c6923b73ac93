"""The proxy's spans: a device's offloaded PUBLISH, and a fetch made for a subscriber.

Only the two things the proxy adds to MQTT are traced; every packet it relays as it is
stays untouched and costs nothing here.

* `publish {topic}`, when a PUBLISH is offloaded: a child of the device's own
  `traceparent` user property when it has a valid one (which then stays on the placeholder
  as it came: the device's creation context, linked), else the first span of a trace
  (PRODUCER), whose context the placeholder carries as `traceparent` / `tracestate`. The
  upload's HTTP request carries the span's context, so the gateway's spans are its children.
* `fetch {topic}`, when a placeholder is resolved for a subscriber (plain, or decoded
  first: proxy/_unseal.py): a child of the placeholder's creation context; the GET carries
  its context.

A Will stored after the broker's CONNACK gets no span (proxy/_will.py).

Both durations are observed in `offload_proxy_offload_seconds` / `_fetch_seconds` with
an exemplar naming the trace. Without OpenTelemetry (or no exporter asked for) the spans
are the seam's no-ops: a device's context still reaches the gateway and the placeholder.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client import Histogram

from client.metrics import exemplar
from client.protocol import Placeholder, TraceContext
from client.tracing import Span, Tracing, message_attributes

from .protocol import PublishHeader, trace_context, with_trace


@dataclass(slots=True)
class Timed:
    """A span and when it began, ended together with its latency observation."""

    span: Span
    histogram: Histogram
    started: float = field(default_factory=time.perf_counter)

    @property
    def context(self) -> TraceContext | None:
        return self.span.context

    def fail(self, error: BaseException) -> None:
        self.span.fail(error)

    def end(self) -> None:
        self.histogram.observe(time.perf_counter() - self.started, exemplar(self.span.context))
        self.span.end()


def start_offload(
    tracing: Tracing,
    histogram: Histogram,
    *,
    topic: str,
    size: int,
    header: PublishHeader,
    properties: bool,
) -> tuple[Timed, PublishHeader]:
    """The span of an offloaded PUBLISH, and the header its placeholder goes out with.

    Args:
        tracing: the proxy's tracing.
        histogram: the offload latency histogram.
        topic: the PUBLISH's topic.
        size: its payload's size.
        header: its variable header as the device sent it.
        properties: whether the broker link carries properties (MQTT 5).
    """
    own = trace_context(header)
    parent = own if isinstance(own, TraceContext) else None
    span = tracing.start(
        f"publish {topic}",
        "client" if own else "producer",
        parent=parent,
        links=(parent,) if parent is not None else (),
        attributes=message_attributes(topic, size, "publish", "send"),
    )
    timed = Timed(span, histogram)
    if own or span.context is None or not properties:
        return timed, header
    return timed, with_trace(header, span.context)


def start_fetch(
    tracing: Tracing, histogram: Histogram, *, header: PublishHeader, ref: Placeholder, topic: str
) -> Timed:
    """The span of a fetch made for a subscriber, a child of the placeholder's context."""
    creation = trace_context(header)
    attributes = message_attributes(topic, ref.size, "fetch", "receive", str(ref.message_id))
    attributes["server.address"] = ref.origin.host
    span = tracing.start(
        f"fetch {topic}",
        "client",
        parent=creation if isinstance(creation, TraceContext) else None,
        attributes=attributes,
    )
    return Timed(span, histogram)
