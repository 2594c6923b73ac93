"""The metrics port: the Prometheus exposition on an address of its own, never the API's.

Exemplars name the trace and span ids of other users' requests, so `/metrics` is served
where only the operator reaches it: `OFFLOAD_METRICS_PORT` on `OFFLOAD_METRICS_HOST`
(127.0.0.1 unless set; the Helm chart opens it to the pod network for its ServiceMonitor),
as offload-proxy serves its own. The HTTP side is :func:`client.metrics.serve`.

Two owners, never both: the application's lifespan serves this process's metrics
(:func:`serve_metrics`: `create_app` in a test or an embedding application), and
`offload-gateway` serves them itself before uvicorn starts (:func:`serve_metrics_in_thread`), its
port bound first so a taken port is one line, and with `--workers N` the sum of every
worker's (Prometheus' multiprocess mode; exemplars stay in each worker).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import threading
from collections.abc import Callable

from client.metrics import exposition, serve

from ._observability import render_metrics
from ._settings import Settings

log = logging.getLogger("gateway")

#: Where uvicorn's worker processes write their metrics for the parent to add up.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# A file of a worker's gauges of the living (prometheus_client: gauge_<mode>_<pid>.db).
_LIVE_FILE = re.compile(r"gauge_live[a-z]*_(\d+)\.db")


async def serve_metrics(settings: Settings) -> asyncio.Server | None:
    """This process's metrics on `metrics_host:metrics_port`; None when the port is unset.

    Raises:
        OSError: the address cannot be bound.
    """
    if settings.metrics_port is None:
        return None
    server = await serve(render_metrics, settings.metrics_host, settings.metrics_port)
    _said(server.sockets[0])
    return server


def bind_metrics(host: str, port: int) -> socket.socket:
    """The metrics port's listening socket (`offload-gateway`, before anything starts).

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


def serve_metrics_in_thread(sock: socket.socket, *, workers: int) -> None:
    """Serve the metrics on `sock` from a daemon thread, for the rest of the process.

    Args:
        sock: the bound listening socket (:func:`bind_metrics`).
        workers: uvicorn's worker processes; more than one: what they wrote in
            `PROMETHEUS_MULTIPROC_DIR` (set before they start), added up.
    """
    render = render_metrics if workers == 1 else _sum_of_workers(os.environ[MULTIPROC_ENV])

    async def run() -> None:
        server = await serve(render, sock=sock)
        _said(sock)
        async with server:
            await server.serve_forever()

    threading.Thread(target=asyncio.run, args=(run(),), name="metrics", daemon=True).start()


def _sum_of_workers(path: str) -> Callable[[str], tuple[bytes, str]]:
    """The exposition of what every worker wrote in `path` (no exemplars: they stay in
    each worker)."""

    def render(accept: str = "") -> tuple[bytes, str]:
        from prometheus_client import CollectorRegistry, multiprocess

        _forget_the_gone(path)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
        encode, media_type = exposition(accept)
        return bytes(encode(registry)), media_type

    return render


def _forget_the_gone(path: str) -> None:
    """Drop the gauges of the living (`livemin`: the health, gateway/core/_health.py) that
    workers now gone wrote. uvicorn starts another worker in place of one that died or
    stopped answering, and it calls nothing of ours then: without this, a dead worker's
    last word (a store probe that failed, a broker link down) counted among the living's
    for ever."""
    from prometheus_client import multiprocess

    for pid in {int(m[1]) for name in os.listdir(path) if (m := _LIVE_FILE.fullmatch(name))}:
        if not _running(pid):
            multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: not ours, but the pid is taken
        return True
    return True


def _said(sock: socket.socket) -> None:
    host, port = sock.getsockname()[:2]
    log.info("metrics on http://%s:%d/metrics", host, port)
