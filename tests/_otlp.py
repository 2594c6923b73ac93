"""A real OTLP/HTTP trace receiver for tests: what a collector gets, decoded.

`POST /v1/traces` with an `ExportTraceServiceRequest` (protobuf, as OpenTelemetry's OTLP
exporters send it; gzip when they compress) is decoded with `opentelemetry-proto`, the
collector's own message definitions, and every span is kept with the `service.name` of
the process that sent it. Processes point their exporters at :attr:`OtlpReceiver.endpoint`
the standard way (`OTEL_EXPORTER_OTLP_ENDPOINT`).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return None if which is None else getattr(value, which)


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver decoded it (ids as lowercase hex)."""

    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]  # (trace id, span id)
    status_code: int  # 0 unset, 1 ok, 2 error


@dataclass
class OtlpReceiver:
    """`with OtlpReceiver() as otlp:` serves on a free loopback port until the block ends."""

    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest.FromString(body)
                receiver._keep(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def environment(self, service: str) -> dict[str, str]:
        """What a process needs to export here, the standard way, quickly."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_SERVICE_NAME": service,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            attrs = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            service = str(attrs.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            service=service,
                            name=span.name,
                            kind=KINDS.get(span.kind, str(span.kind)),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            links=tuple((ln.trace_id.hex(), ln.span_id.hex()) for ln in span.links),
                            status_code=span.status.code,
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(received)

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0
    ) -> list[ReceivedSpan]:
        """The spans once `predicate` holds for them; AssertionError after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.snapshot()
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({(s.service, s.name) for s in spans})
                raise AssertionError(f"spans never matched; received {names}")
            time.sleep(0.05)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
