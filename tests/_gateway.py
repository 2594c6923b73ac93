"""The real gateway for tests: under uvicorn in a background thread (httpx's serve_in_thread),
or as its own `offload-gateway` process that a test can SIGKILL and restart."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from _servers import free_port, wait_for_port


@dataclass
class GatewayServer:
    settings: Any
    store: Any = None
    port: int = 0
    mqtt_url: str | None = None
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None
    app: Any = field(default=None)
    certfile: str | None = None
    keyfile: str | None = None
    client_ca: str | None = None  # HTTPS asks every client for a certificate signed by it
    send_buffer: int = 0  # SO_SNDBUF of its connections (fixed, not autotuned); 0: the kernel's
    tracer_provider: Any = None  # an OpenTelemetry provider for its spans (tests/test_tracing*)
    public_url: str | None = None  # the endpoint it names in placeholders (None: its own URL)

    @property
    def url(self) -> str:
        scheme = "https" if self.certfile else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Its Prometheus metrics: on their own port (`metrics_port`), never the API's."""
        return f"http://127.0.0.1:{self.settings.metrics_port}/metrics"

    def start(self) -> GatewayServer:
        from gateway import create_app
        from gateway.middleware._protocol import GatewayHttpProtocol

        # Bind here and hand uvicorn the socket: port 0 lets the kernel choose, and nothing
        # can take the port between choosing it and serving on it.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.send_buffer:  # accepted connections inherit it from the listening socket
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        self.app = create_app(
            self.settings,
            store=self.store,
            public_url=self.public_url or self.url,
            tracer_provider=self.tracer_provider,
        )
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            ssl_certfile=self.certfile,
            ssl_keyfile=self.keyfile,
            ssl_ca_certs=self.client_ca,
            ssl_cert_reqs=ssl.CERT_REQUIRED if self.client_ca else ssl.CERT_NONE,
            http=GatewayHttpProtocol,  # as `offload-gateway` serves
            proxy_headers=False,  # as `offload-gateway` serves: OFFLOAD_TRUSTED_PROXIES decides
        )
        self._server = uvicorn.Server(config)
        server = self._server
        self._thread = threading.Thread(target=lambda: server.run(sockets=[sock]), daemon=True)
        self._thread.start()
        wait_for_port(self.port, 20)
        deadline = time.monotonic() + 20
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._server = None
        self._thread = None


ROOT = Path(__file__).resolve().parent.parent


@dataclass
class GatewayProcess:
    """`offload-gateway` as its own process on a fixed port: SIGKILL it, restart it."""

    env: dict[str, str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GatewayProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "--port", str(self.port)],
            env={**os.environ, **self.env, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, 30, self.proc)
        return self

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None
