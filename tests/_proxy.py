"""The real proxy for tests: `Proxy` on its own event loop in a background thread."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProxyServer:
    settings: Any
    tracer_provider: Any = None  # an OpenTelemetry provider for its spans (tests/test_tracing*)
    proxy: Any = None
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    @property
    def port(self) -> int:
        return int(self.proxy.port)

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> ProxyServer:
        from proxy import Proxy

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self.proxy = Proxy(self.settings, tracer_provider=self.tracer_provider)
            loop.run_until_complete(self.proxy.start())
            self._ready.set()
            loop.run_forever()
            loop.run_until_complete(self.proxy.close())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("the proxy did not start")
        return self

    def call(self, fn: Any) -> Any:
        """Run `fn()` on the proxy's loop and return its result (reads its state safely)."""
        assert self._loop is not None
        done: asyncio.Future[Any] = asyncio.run_coroutine_threadsafe(_call(fn), self._loop)
        return done.result(10)

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the proxy's Prometheus registry (0 when never counted)."""
        value = self.proxy.metrics.registry.get_sample_value(name, labels or None)
        return float(value or 0.0)

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(60)
        self._loop = None


async def _call(fn: Any) -> Any:
    return fn()
