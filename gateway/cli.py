"""`offload-gateway`: serve the offload API with uvicorn."""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import secrets
import shutil
import sys
import tempfile

import uvicorn
from pydantic import ValidationError

from client.malloc import tune_malloc

from .core import (
    MULTIPROC_ENV,
    Settings,
    bind_metrics,
    configure_logging,
    serve_metrics_in_thread,
)
from .middleware import MAX_HEAD_BYTES, GatewayHttpProtocol

log = logging.getLogger("gateway")

# Transfer buffers (4-16 MiB) in their own mappings, returned on free: with glibc's moving
# threshold a 1 GiB upload left the gateway 70 MiB bigger for good. Up to 16 MiB of a
# heap's free top kept: left where fixing the mmap threshold froze it (128 KiB, glibc's
# default, unless a larger free had raised it), the trim threshold handed the top back after
# nearly every body piece (about 15 % of the CPU per GiB uploaded). What transfers leave is
# given back once they go idle (`malloc_trim(0)`, gateway/core/_executors.py).
# bench/RESULTS.md has both measures.
_MMAP_THRESHOLD = 1024 * 1024
_TRIM_THRESHOLD = 16 * 1024 * 1024

# Seconds a worker (--workers N) may take to answer uvicorn's health check before it is
# killed and started again. A new worker answers only once its interpreter has imported the
# gateway, 1.7 s of CPU alone: 20-45 s for two workers on 2 cores at load 16, longer in a
# pod with a small CPU limit. uvicorn's 5 s killed each of them and started another for as
# long as the load lasted, and nothing was served. Once started a worker answers from a
# thread of its own, however busy its event loop: only a process that cannot run at all
# (stopped, or wedged holding the interpreter) takes longer, and it is replaced this late.
_WORKER_HEALTHCHECK = 60


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="offload-gateway",
        description="Serve the mqtt-offload HTTP API. Settings come from OFFLOAD_* variables.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port to bind (default 8080)")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="port of /metrics, apart from the API (default OFFLOAD_METRICS_PORT; unset: none)",
    )
    args = parser.parse_args(argv)
    tune_malloc(mmap_threshold=_MMAP_THRESHOLD, trim_threshold=_TRIM_THRESHOLD)

    try:
        settings = Settings()
    except ValidationError as exc:  # one line naming each variable, not a traceback
        parser.error(_one_line(exc))
    configure_logging(settings.log_level, settings.log_format)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if not 0 <= args.port <= 65535:  # uvicorn: a traceback or a hang
        parser.error(f"--port must be a port number (0-65535), got {args.port}")
    _serve_metrics(parser, settings, args)
    if args.workers > 1 and settings.auth_secret is None:
        # Workers are processes behind one socket: the two SCRAM round trips and a presigned
        # URL's issue and use land on any of them, so they must share one secret. Drawn here
        # once and inherited through the environment (the workers read their settings there).
        os.environ["OFFLOAD_AUTH_SECRET"] = secrets.token_urlsafe(32)
        log.warning(
            "OFFLOAD_AUTH_SECRET is not set: generated one for the %d workers of this gateway; "
            "set it (the same on every replica) for several replicas or restarts",
            args.workers,
        )
    if not settings.public_url:
        host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
        scheme = "https" if settings.tls_cert_file else "http"
        # Workers are separate processes: hand the derived URL down through the environment.
        os.environ["OFFLOAD_PUBLIC_URL"] = f"{scheme}://{host}:{args.port}"
    uvicorn.run(
        "gateway._app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        ssl_certfile=str(settings.tls_cert_file) if settings.tls_cert_file else None,
        ssl_keyfile=str(settings.tls_key_file) if settings.tls_key_file else None,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=int(settings.shutdown_timeout),
        log_config=None,  # keep our handlers (JSON when asked)
        # uvicorn believes X-Forwarded-For from 127.0.0.1 by default: any process on this host
        # could claim any address. OFFLOAD_TRUSTED_PROXIES decides (middleware/_forwarded.py).
        proxy_headers=False,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,  # h11's head limit, as ours
        # A deadline for each request head (OFFLOAD_HEADER_TIMEOUT), buffered reads.
        # uvicorn only calls the class (its type names asyncio.Protocol, which uvloop would
        # not read into a buffer of ours).
        http=GatewayHttpProtocol,  # type: ignore[arg-type]
        timeout_worker_healthcheck=_WORKER_HEALTHCHECK,
    )
    return 0


def _one_line(exc: ValidationError) -> str:
    """pydantic's errors as one line, each named as the variable the user set."""
    said = []
    for error in exc.errors():
        name = "OFFLOAD_" + "_".join(str(part) for part in error["loc"]).upper()
        said.append(f"{name}: {error['msg'].lower()}, got {error.get('input')!r}")
    return "; ".join(said)


def _serve_metrics(
    parser: argparse.ArgumentParser, settings: Settings, args: argparse.Namespace
) -> None:
    """The metrics port, served by this process (gateway/core/_metrics_port.py): bound now,
    so a port that is taken is one line before anything starts; the application's own
    lifespan (the workers') is told not to serve it."""
    port = settings.metrics_port if args.metrics_port is None else args.metrics_port
    os.environ.pop("OFFLOAD_METRICS_PORT", None)  # the app's lifespan: this process serves it
    if port is None:
        return
    if not 0 <= port <= 65535:
        parser.error(f"--metrics-port must be a port number (0-65535), got {port}")
    try:
        sock = bind_metrics(settings.metrics_host, port)
    except OSError as exc:
        parser.exit(
            1,
            f"offload-gateway: cannot serve metrics on {settings.metrics_host}:{port}: "
            f"{(os.strerror(exc.errno) if exc.errno else str(exc)).lower()}\n",
        )
    if args.workers > 1 and not os.environ.get(MULTIPROC_ENV):
        # The workers write their metrics here for this process to add up (Prometheus'
        # multiprocess mode: set before they start, as they read it at import).
        made = tempfile.mkdtemp(prefix="offload-gateway-metrics-")
        atexit.register(shutil.rmtree, made, ignore_errors=True)
        os.environ[MULTIPROC_ENV] = made
    serve_metrics_in_thread(sock, workers=args.workers)


if __name__ == "__main__":
    sys.exit(main())
