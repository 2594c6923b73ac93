"""What every folder of the gateway stands on: settings, errors, threads, metrics, broker.

`_settings` (`Settings`: the one place the environment is read), `_errors` (the exception
hierarchy and its one mapping to HTTP responses), `_json` (JSON answers, newline-ended),
`_executors` (worker threads, sized and kept apart), `_observability` (Prometheus metrics,
request ids, logs), `_health` (the store probed, the broker link and the certificates, as
gauges), `_metrics_port` (the metrics on a port of their own, never the API's),
`_tracing` (the request's trace span and its children: ingest, store, broker), `_mqtt` (the
broker link), `_cors` (browser uploads' CORS; the settings parse its origins). CORS and
metrics are middleware kept here, not in `gateway.middleware`, because the settings and the
error mapping need them. Imports nothing of the gateway but `gateway.storage`.

Other folders use only the names below.
"""

from ._cors import BrowserUploads, parse_origins
from ._errors import (
    COMMON_RESPONSES,
    BadRequest,
    BrokerUnavailable,
    ChecksumMismatch,
    Conflict,
    Forbidden,
    GatewayError,
    Gone,
    NotFound,
    PayloadTooLarge,
    PreconditionFailed,
    RangeNotSatisfiable,
    StorageUnavailable,
    TooManyRequests,
    Unauthorized,
    UnsupportedMediaType,
    install_error_handlers,
)
from ._executors import (
    RequestEnd,
    Slot,
    Transfers,
    WorkerPool,
    Workers,
    close_at_request_end,
    current_request,
    request_scope,
)
from ._health import HEALTH, Health, SharedHealth, StoreProbe, certificates
from ._json import JSONAnswer
from ._metrics_port import MULTIPROC_ENV, bind_metrics, serve_metrics, serve_metrics_in_thread
from ._mqtt import InvalidPublish, broker_link
from ._observability import (
    DOWNLOADS_ABANDONED,
    UPLOADED_BYTES,
    UPLOADS,
    ObservabilityMiddleware,
    configure_logging,
)
from ._settings import IPNetwork, Settings, get_settings
from ._tracing import TRACING_KEY, child, current_context

__all__ = [
    "COMMON_RESPONSES",
    "DOWNLOADS_ABANDONED",
    "HEALTH",
    "MULTIPROC_ENV",
    "TRACING_KEY",
    "UPLOADED_BYTES",
    "UPLOADS",
    "BadRequest",
    "BrokerUnavailable",
    "BrowserUploads",
    "ChecksumMismatch",
    "Conflict",
    "Forbidden",
    "GatewayError",
    "Gone",
    "Health",
    "IPNetwork",
    "InvalidPublish",
    "JSONAnswer",
    "NotFound",
    "ObservabilityMiddleware",
    "PayloadTooLarge",
    "PreconditionFailed",
    "RangeNotSatisfiable",
    "RequestEnd",
    "Settings",
    "SharedHealth",
    "Slot",
    "StorageUnavailable",
    "StoreProbe",
    "TooManyRequests",
    "Transfers",
    "Unauthorized",
    "UnsupportedMediaType",
    "WorkerPool",
    "Workers",
    "bind_metrics",
    "broker_link",
    "certificates",
    "child",
    "close_at_request_end",
    "configure_logging",
    "current_context",
    "current_request",
    "get_settings",
    "install_error_handlers",
    "parse_origins",
    "request_scope",
    "serve_metrics",
    "serve_metrics_in_thread",
]
