"""The OpenTelemetry adapter: the one module of the project that imports `opentelemetry`.

Loaded only when OpenTelemetry is installed and wanted (:func:`client.core._tracing.tracing_for`,
:func:`exporting_from_environment`): without the `otel` extra nothing here is ever imported.
Contexts come in and go out as :class:`client.protocol.TraceContext` values (parsed and
bounded by the pure codec); OpenTelemetry's own propagators never see a peer's header, so
a hostile one never reaches its parser or its warning log.

Two halves:

* :class:`OtelTracing`: spans from a `TracerProvider` (the application's own, or the
  global one) for the library, the gateway and the proxy;
* :func:`exporting_from_environment`: for the processes that own their telemetry (the
  gateway, the proxy, the `offload` CLI): an SDK provider built the standard way, from
  `OTEL_*` variables, when one of them asks for an exporter. A library never calls it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from importlib import metadata
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from ..protocol._tracecontext import TraceContext
from ._tracing import SCOPE, Attributes, AttributeValue, Kind, Span, TracerProviderLike, Tracing

log = logging.getLogger("client")

_KINDS = {
    "internal": SpanKind.INTERNAL,
    "server": SpanKind.SERVER,
    "client": SpanKind.CLIENT,
    "producer": SpanKind.PRODUCER,
    "consumer": SpanKind.CONSUMER,
}
_ROOT = otel_context.Context()  # an empty context: a span started in it begins a trace


def _version() -> str | None:
    try:
        return metadata.version("mqtt-offload")
    except metadata.PackageNotFoundError:
        return None


def span_context(ctx: TraceContext) -> SpanContext:
    """A remote OpenTelemetry span context from a parsed one."""
    state = TraceState.from_header([ctx.tracestate]) if ctx.tracestate else None
    return SpanContext(
        ctx.trace_id,
        ctx.span_id,
        is_remote=True,
        trace_flags=TraceFlags(ctx.flags),
        trace_state=state,
    )


def trace_context(sc: SpanContext) -> TraceContext | None:
    """The wire form of an OpenTelemetry span context; None when it is not valid."""
    if not sc.is_valid:
        return None
    state = sc.trace_state.to_header() if sc.trace_state else ""
    return TraceContext(sc.trace_id, sc.span_id, int(sc.trace_flags), state)


class OtelSpan(Span):
    """An OpenTelemetry span behind the seam."""

    __slots__ = ("_span",)

    def __init__(self, span: trace.Span, fallback: TraceContext | None) -> None:
        own = trace_context(span.get_span_context())
        super().__init__(own if own is not None else fallback)
        self._span = span

    @property
    def recording(self) -> bool:
        return self._span.is_recording()

    def set(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(key, value)

    def rename(self, name: str) -> None:
        self._span.update_name(name)

    def fail(self, error: BaseException | str) -> None:
        # The type only: an exception's message may quote what a peer sent.
        kind = error if isinstance(error, str) else type(error).__qualname__
        self._span.set_attribute("error.type", kind)
        self._span.set_status(Status(StatusCode.ERROR))

    def end(self) -> None:
        self._span.end()


class OtelTracing(Tracing):
    """Spans from an OpenTelemetry tracer provider.

    Args:
        provider: the provider (None: the global one, looked up at each span, so an
            application that sets its provider later is followed).
    """

    enabled = True

    def __init__(self, provider: TracerProviderLike | None = None) -> None:
        super().__init__()
        self._tracer = trace.get_tracer(SCOPE, _version(), tracer_provider=provider)  # type: ignore[arg-type]

    def ambient(self) -> TraceContext | None:
        return trace_context(trace.get_current_span().get_span_context())

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
        remote = parent.context if isinstance(parent, Span) else parent
        context: otel_context.Context | None
        if use_ambient and trace.get_current_span().get_span_context().is_valid:
            context = None  # the current context, as it is (a local parent)
        elif isinstance(parent, OtelSpan):  # a span of this process: a local parent
            context = trace.set_span_in_context(parent._span)
        elif remote is not None:
            context = trace.set_span_in_context(NonRecordingSpan(span_context(remote)))
        else:
            context = _ROOT
        span = self._tracer.start_span(
            name,
            context=context,
            kind=_KINDS[kind],
            attributes=attributes,
            links=[Link(span_context(link)) for link in links] or None,
        )
        return OtelSpan(span, remote)


def _exporter(name: str, environ: Mapping[str, str]) -> Any:
    """One span exporter named the way `OTEL_TRACES_EXPORTER` names them; None: unknown."""
    if name == "otlp":
        protocol = (
            environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        )
        if protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            return OTLPSpanExporter()  # endpoint, headers, timeout: OTEL_EXPORTER_OTLP_*
        name = "otlp_proto_grpc" if protocol == "grpc" else f"otlp ({protocol})"
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # stderr, never stdout: stdout is the payload (`offload fetch ID > f.bin`) or the
        # JSON lines a script reads; the SDK's default is stdout.
        return ConsoleSpanExporter(out=sys.stderr)
    # Any other exporter installed as the SDK's plugins are (an entry point).
    for entry in metadata.entry_points(group="opentelemetry_traces_exporter", name=name):
        return entry.load()()
    log.warning("OTEL_TRACES_EXPORTER names %r, which is not installed: not exported", name)
    return None


def exporting_from_environment(service_name: str, environ: Mapping[str, str] | None = None) -> Any:
    """An SDK tracer provider, installed as the global one, when the environment asks for
    an exporter; None otherwise (and then nothing of the SDK is imported).

    Asked for by `OTEL_TRACES_EXPORTER` (not `none`) or an OTLP endpoint
    (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`: then `otlp`);
    `OTEL_SDK_DISABLED=true` turns it off. The SDK reads the rest as it always does:
    `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` (`service_name` when neither names
    one), `OTEL_TRACES_SAMPLER` and `_ARG`, `OTEL_BSP_*`, `OTEL_EXPORTER_OTLP_*`.

    Args:
        service_name: the default `service.name` (`offload-gateway`, ...).
        environ: the variables (default: the process's).

    Returns:
        The provider: its `shutdown()` exports what is left (call it before exiting).
    """
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [n for n in names if n and n != "none"]
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not names and "OTEL_TRACES_EXPORTER" not in env and endpoint:
        names = ["otlp"]
    if not names:
        return None
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_* asks for traces but OpenTelemetry's SDK is not installed "
            "(pip install 'mqtt-offload[otel]'): none are exported"
        )
        return None
    exporters = [e for e in (_exporter(name, env) for name in names) if e is not None]
    if not exporters:
        return None
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource)  # OTEL_TRACES_SAMPLER: the SDK reads it
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


@contextlib.contextmanager
def current(ctx: TraceContext | None) -> Iterator[None]:
    """`ctx` (a caller's, from outside the process) as OpenTelemetry's current context
    while the block runs: spans started with `use_ambient` are its children."""
    if ctx is None:
        yield
        return
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(span_context(ctx))))
    try:
        yield
    finally:
        otel_context.detach(token)
