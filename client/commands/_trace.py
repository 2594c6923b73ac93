"""The `offload` process's traces: exported the standard way, its caller's trace continued.

The `offload` CLI is an application, so it owns its telemetry (the library never does):
with the `otel` extra installed and `OTEL_TRACES_EXPORTER` or an OTLP endpoint set, its
spans are exported as the SDK is told by the `OTEL_*` variables
(:func:`client.core._tracers.exporting_from_environment`), and flushed before it exits.
A caller's trace comes in the way OpenTelemetry passes one to a process through its
environment: `TRACEPARENT` (and `TRACESTATE`), parsed by the bounded W3C codec. Without an
exporter it is still carried on (the placeholder, the upload's headers), with no span of
ours and no OpenTelemetry import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from ..core._tracers import exporting_from_environment
from ..core._tracing import Tracing
from ..protocol._tracecontext import TraceContext

SERVICE_NAME = "offload"


@contextlib.contextmanager
def command_tracing(environ: Mapping[str, str]) -> Iterator[Tracing]:
    """The tracing one command runs with (its spans exported when it ends).

    Args:
        environ: the process's environment.
    """
    caller = TraceContext.parse(environ.get("TRACEPARENT"), environ.get("TRACESTATE"))
    provider = exporting_from_environment(SERVICE_NAME, environ)
    if provider is None:
        yield Tracing(ambient=caller)
        return
    from ..core._otel import OtelTracing, current

    try:
        with current(caller):
            yield OtelTracing(provider)
    finally:
        provider.shutdown()  # exports what is left: the process ends next
