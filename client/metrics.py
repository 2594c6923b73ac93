"""What the gateway's and the proxy's Prometheus metrics share.

Public (`client.metrics`), for the processes built on the library (the gateway, the proxy),
as :mod:`client.malloc` and :mod:`client.tracing` are: the library itself keeps no metrics,
and `prometheus_client` is the servers' dependency, imported here only when
:func:`exposition` is called.

* :func:`exemplar`: the exemplar a latency observation carries, naming its sampled trace;
* :func:`exposition`: the encoder a scraper's `Accept` asks for (OpenMetrics shows the
  exemplars, the Prometheus text format does not);
* :func:`certificate_expiry`: when a certificate chain a server presents stops being valid
  (`offload_tls_certificate_expiry_timestamp_seconds`, which an alert watches).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the module's namespace is what __all__ lists
    from collections.abc import Callable
    from pathlib import Path

    from prometheus_client import CollectorRegistry

    from .protocol import TraceContext

__all__ = ["OPENMETRICS", "certificate_expiry", "exemplar", "exposition"]

#: The OpenMetrics version served to a scraper that asks for OpenMetrics.
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def exemplar(context: TraceContext | None) -> dict[str, str] | None:
    """A Prometheus exemplar for a latency observation: the sampled trace it belongs to."""
    if context is None or not context.sampled:
        return None
    return {"trace_id": context.trace_id_hex, "span_id": context.span_id_hex}


def exposition(accept: str) -> tuple[Callable[[CollectorRegistry], bytes], str]:
    """prometheus_client's encoder and media type for a scraper's `Accept`: OpenMetrics
    1.0.0 (with the exemplars) when it asks for `application/openmetrics-text`, else the
    text format. The header is read for that alone: prometheus_client's own reading of it
    fails on a version it cannot compare (`version=x`: TypeError, a 500) and writes the
    version it was sent back into `Content-Type`."""
    from prometheus_client.exposition import choose_encoder

    ranges = (part.split(";", 1)[0].strip().lower() for part in accept.split(","))
    return choose_encoder(OPENMETRICS if "application/openmetrics-text" in ranges else "")


def certificate_expiry(path: str | Path) -> float:
    """The end of validity (seconds since the epoch) of a PEM certificate chain: its
    earliest `notAfter`, since a client refuses the chain once any certificate in it has
    expired. Read with `cryptography` (the servers' dependency), imported when called.

    Raises:
        OSError: the file cannot be read.
        ValueError: it holds no PEM certificate.
    """
    from cryptography import x509

    with open(path, "rb") as file:
        chain = x509.load_pem_x509_certificates(file.read())
    return min(cert.not_valid_after_utc.timestamp() for cert in chain)
