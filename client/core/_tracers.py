"""Which tracing a part gets: the no-op seam, or OpenTelemetry when it is installed.

Kept apart from :mod:`client.core._tracing` (the seam) and :mod:`client.core._otel` (the
adapter, which builds on the seam), so that nothing imports the adapter but the two
functions here, and only when they decide to.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping
from typing import Any

from ._tracing import DISABLED, TracerProviderLike, Tracing

log = logging.getLogger("client")


def otel_installed() -> bool:
    """Whether OpenTelemetry's API can be imported (looked up, not imported)."""
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError):  # a parent package that is not one, or poisoned
        return False


def tracing_for(provider: TracerProviderLike | Tracing | None = None) -> Tracing:
    """The tracing a library object uses.

    Args:
        provider: an OpenTelemetry `TracerProvider` (used as it is), a :class:`Tracing`
            (used as it is: :data:`DISABLED` for none), or None: OpenTelemetry's global
            provider when `opentelemetry` is installed (the application's own, or the no-op
            that only carries contexts on until one is set), else no tracing at all.
    """
    if isinstance(provider, Tracing):
        return provider
    if provider is None and not otel_installed():
        return DISABLED
    from ._otel import OtelTracing

    return OtelTracing(provider)


def exporting_from_environment(service_name: str, environ: Mapping[str, str]) -> Any:
    """For a process that owns its telemetry (the gateway, the proxy, the `offload` CLI):
    an SDK tracer provider, installed as OpenTelemetry's global one, when the environment
    asks for an exporter (:func:`client.core._otel.exporting_from_environment`); None
    otherwise, and then nothing of OpenTelemetry is imported.

    Args:
        service_name: the default `service.name`.
        environ: the process's environment.
    """
    if not _asks_for_traces(environ):
        return None
    if not otel_installed():
        log.warning(
            "OTEL_* asks for traces but OpenTelemetry is not installed "
            "(pip install 'mqtt-offload[otel]'): none are exported"
        )
        return None
    from ._otel import exporting_from_environment as exporting

    return exporting(service_name, environ)


def _asks_for_traces(environ: Mapping[str, str]) -> bool:
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )
