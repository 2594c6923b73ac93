"""Run the real gateway app under uvicorn in a background thread (httpx's serve_in_thread)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
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

    @property
    def url(self) -> str:
        scheme = "https" if self.certfile else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self) -> GatewayServer:
        from gateway import create_app

        if not self.port:
            self.port = free_port()
        self.app = create_app(self.settings, store=self.store, public_url=self.url)
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            ssl_certfile=self.certfile,
            ssl_keyfile=self.keyfile,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
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
