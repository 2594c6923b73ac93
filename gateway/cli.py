"""`offload-gateway`: serve the offload API with uvicorn."""

from __future__ import annotations

import argparse
import sys

import uvicorn

from ._observability import configure_logging
from ._settings import Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="offload-gateway",
        description="Serve the mqtt-offload HTTP API. Settings come from OFFLOAD_* variables.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port to bind (default 8080)")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    args = parser.parse_args(argv)

    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)
    if not settings.public_url:
        host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
        scheme = "https" if settings.tls_cert_file else "http"
        import os

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
        h11_max_incomplete_event_size=64 * 1024,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
