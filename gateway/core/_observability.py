"""Prometheus metrics, request ids, trace spans and structured logs.

One ASGI middleware times every request, counts body bytes in both directions, tags the
request with an id (the caller's `X-Request-ID` or a new one, echoed in the response),
runs it in its trace span (gateway/core/_tracing.py: the caller's W3C trace context
continued) and makes both available to every log line written while the request runs. A
request's latency is observed with an exemplar naming its trace, shown to scrapers that
ask for OpenMetrics (docs/operations.md, "From a slow bucket to its trace").
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
import uuid
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from client.metrics import exemplar, exposition

from ._tracing import (
    DISABLED,
    TRACING_KEY,
    RequestTrace,
    current_context,
    end_request,
    request_trace,
    start_request,
)

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")

REQUESTS = Counter(
    "offload_http_requests_total",
    "HTTP requests by route and status",
    ["method", "route", "status"],
)
LATENCY = Histogram(
    "offload_http_request_seconds",
    "Time from request start to the last response byte",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
BYTES_IN = Counter("offload_http_received_bytes_total", "Request body bytes", ["route"])
BYTES_OUT = Counter("offload_http_sent_bytes_total", "Response body bytes", ["route"])
UPLOADS = Counter("offload_uploads_total", "Payloads stored", ["kind"])
UPLOADED_BYTES = Counter("offload_uploaded_bytes_total", "Payload bytes stored")
DOWNLOADS_ABANDONED = Counter(
    "offload_downloads_abandoned_total",
    "Downloads stopped before their end because the client had gone",
)
STORAGE_ERRORS = Counter("offload_storage_errors_total", "Failed object store operations")
BROKER_ERRORS = Counter("offload_broker_errors_total", "Failed broker publishes")
AUTH_FAILURES = Counter("offload_auth_failures_total", "Refused requests", ["status"])


def _route_template(scope: Scope, entry: Scope) -> str:
    """The matched route's template; `entry` is the scope as the request arrived.

    Templates, never raw paths: topics and ids would explode the label space. Routes that
    FastAPI adds as plain Starlette routes (`/openapi.json`) and mounts (the offline docs
    assets) leave no `route` in the scope, so they are looked up in the app's table.
    """
    path = getattr(scope.get("route"), "path", None)
    if path:
        return str(path)
    app = entry.get("app")
    for route in getattr(app, "routes", ()):
        match, _ = route.matches(entry)
        if match is Match.FULL:
            return str(getattr(route, "path", "unmatched"))
    return "unmatched"


class ObservabilityMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers") or []
        incoming = dict(headers).get(b"x-request-id", b"")
        rid = incoming.decode("latin-1")[:64] if incoming else uuid.uuid4().hex
        token = request_id.set(rid)
        method = scope.get("method", "")
        tracing = (scope.get("state") or {}).get(TRACING_KEY, DISABLED)
        span = start_request(tracing, scope)
        trace_token = request_trace.set(RequestTrace(tracing, span))
        entry = dict(scope)  # before routing rewrites path and root_path
        start = time.perf_counter()
        status = 500
        received = 0
        sent = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            return message

        async def tagging_send(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", []), (b"x-request-id", rid.encode("latin-1"))]
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, counting_receive, tagging_send)
        finally:
            route = _route_template(scope, entry)
            REQUESTS.labels(method, route, str(status)).inc()
            LATENCY.labels(method, route).observe(
                time.perf_counter() - start, exemplar(span.context)
            )
            BYTES_IN.labels(route).inc(received)
            BYTES_OUT.labels(route).inc(sent)
            if status in (401, 403, 429):
                AUTH_FAILURES.labels(str(status)).inc()
            end_request(span, method, route, status)
            request_trace.reset(trace_token)
            request_id.reset(token)


def render_metrics(accept: str = "") -> tuple[bytes, str]:
    """This process's exposition for the metrics port (client.metrics.serve): Prometheus
    text, or OpenMetrics (with the exemplars) to a scraper that asks for it in `Accept`.
    Never on the API port: the exemplars name other requests' trace ids."""
    from prometheus_client import REGISTRY

    encode, media_type = exposition(accept)
    return encode(REGISTRY), media_type


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the request id of the request being served."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": request_id.get(),
        }
        trace = current_context()
        if trace is not None:  # hex digits from the parsed context, never what was sent
            doc["trace_id"] = trace.trace_id_hex
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
        handler.formatter.converter = time.gmtime  # type: ignore[union-attr]
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
