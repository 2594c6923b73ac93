"""`offload-proxy`: flags over `OFFLOAD_PROXY_*` variables over defaults."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import sys

from pydantic import ValidationError

from client.malloc import tune_malloc
from client.tracing import exporting_from_environment

from ._heap import settle
from ._server import Proxy
from ._settings import ProxySettings
from ._workers import Worker, supervise, worker_settings

# Pieces of up to 1 MiB (fetches) and 256 KiB (client reads) stay on the heaps, and up to
# 4 MiB of a heap's free top is kept (one transfer's pieces in flight): with glibc's defaults
# the top went back to the kernel after nearly every piece, 5-10 % of the proxy's CPU per
# transfer (bench/RESULTS.md, "The heap's free top").
_MMAP_THRESHOLD = 4 * 1024 * 1024
_TRIM_THRESHOLD = 4 * 1024 * 1024

#: Why a listening socket cannot be had: the proxy says so in one line.
_CANNOT_LISTEN = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the `extra` fields
    (never a payload or a password: nothing logs them)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def _settings(argv: list[str] | None) -> ProxySettings:
    parser = argparse.ArgumentParser(
        prog="offload-proxy",
        description="MQTT proxy: unmodified clients send and receive messages of any size. "
        "Every setting is also an OFFLOAD_PROXY_* variable (docs/proxy.md).",
    )
    parser.add_argument("--broker", help="mqtt://HOST:PORT of the broker")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 1884)")
    parser.add_argument("--ws-port", type=int, help="also listen for MQTT over WebSocket there")
    parser.add_argument("--endpoint", help="gateway URL (default: the discovery record)")
    parser.add_argument("--metrics-port", type=int, help="port of /metrics and /healthz")
    parser.add_argument(
        "--workers", type=int, help="processes serving the listeners (default 1; docs/proxy.md)"
    )
    args = parser.parse_args(argv)
    flags = {k: v for k, v in vars(args).items() if v is not None}
    try:
        return ProxySettings(**flags)
    except ValidationError as exc:
        parser.error(_one_line(exc, flags))
        raise  # unreachable: error() exits


def _one_line(exc: ValidationError, flags: dict[str, object]) -> str:
    """pydantic's errors as one line, each named as the user gave it: flag or variable."""
    said = []
    for error in exc.errors():
        name = ".".join(str(part) for part in error["loc"])
        given = f"--{name.replace('_', '-')}" if name in flags else f"OFFLOAD_PROXY_{name.upper()}"
        said.append(f"{given}: {error['msg'].lower()}, got {error.get('input')!r}")
    return "; ".join(said)


async def _run(settings: ProxySettings, worker: Worker | None = None) -> None:
    # Traces exported the standard way (OTEL_*), from each process that makes spans: a
    # worker its own (its exporting thread would not survive being forked).
    exporting = exporting_from_environment("offload-proxy", os.environ)
    proxy = Proxy(settings, worker.sockets() if worker is not None else None, exporting)
    await proxy.start()
    settle()  # the collector at the pace of a process holding thousands of connections
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if worker is None:
        print(f"offload-proxy listening on {settings.host}:{proxy.port}", flush=True)
    else:  # the parent prints; a parent gone closes the lifeline: stop as at SIGTERM
        worker.served(stop)
    await stop.wait()
    await proxy.close()
    if exporting is not None:
        exporting.shutdown()  # the spans still queued


def main(argv: list[str] | None = None) -> int:
    settings = _settings(argv)
    worker = Worker.from_environment(os.environ)  # started by a --workers parent
    if worker is not None:
        settings = worker_settings(settings)
    tune_malloc(mmap_threshold=_MMAP_THRESHOLD, trim_threshold=_TRIM_THRESHOLD)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler])
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        if settings.workers > 1:
            return supervise(settings, sys.argv[1:] if argv is None else argv)
        with contextlib.suppress(KeyboardInterrupt):
            _serve(settings, worker)
    except OSError as exc:
        if exc.errno not in _CANNOT_LISTEN:
            raise
        # A port taken or an address not ours: one line naming it, not a traceback.
        print(f"offload-proxy: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


def _serve(settings: ProxySettings, worker: Worker | None) -> None:
    """One process serving until SIGTERM or SIGINT, on uvloop when asked and installed."""
    if settings.loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            logging.getLogger("proxy").warning("uvloop is not installed: asyncio's loop")
        else:
            uvloop.run(_run(settings, worker))
            return
    asyncio.run(_run(settings, worker))


if __name__ == "__main__":
    sys.exit(main())
