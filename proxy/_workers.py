"""`offload-proxy --workers N`: N processes serving the same listening sockets.

One event loop is one core at most; a proxy that relays small messages for a fleet needs
more. The parent binds the listeners once (:meth:`proxy._server.Sockets.bind`) and starts
N workers, each a fresh interpreter running `offload-proxy` with the same arguments and
environment, that inherits the listening sockets (their file descriptors) and serves them as
a single proxy would. Each listening socket keeps one accept queue, shared by all workers:
the kernel hands a new connection to whichever worker accepts first, so an idle worker takes
more; a connection stays with its worker for its life.

Everything a proxy keeps is per worker: its connections and `max_connections`, its
`max_uploads` and `max_fetches` slots, its reassembly total, the QoS 2 resend memory and the
failed-payload memory (docs/proxy.md, "Processes").

* **Metrics**: prometheus_client's multiprocess mode. Each worker writes its samples into
  files in a directory the parent makes (`PROMETHEUS_MULTIPROC_DIR`), and the parent's
  `/metrics` is their sum (counters over every worker that ever ran, gauges over the
  living). `/healthz` is 200 while every worker runs.
* **Supervision**: a worker that exits is started again after a second; one that exits
  before it served (its settings cannot work) stops them all, and the parent exits 1.
  SIGTERM or SIGINT to the parent is passed to every worker, which shuts down as a single
  proxy does (`shutdown_timeout`). A parent killed outright closes the workers' lifeline
  pipe, and each worker then shuts down too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, multiprocess

from client.metrics import exposition

from ._metrics import serve_metrics
from ._server import Sockets
from ._settings import ProxySettings

log = logging.getLogger("proxy")

#: The environment variable that makes `offload-proxy` a worker: its inherited descriptors.
WORKER_ENV = "_OFFLOAD_PROXY_WORKER"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Seconds a worker gets to start listening, and before one that exited is started again.
START_TIMEOUT = 60.0
RESTART_DELAY = 1.0


@dataclass(frozen=True)
class Worker:
    """What a worker inherits from its parent (file descriptors)."""

    mqtt: tuple[int, ...]
    ws: tuple[int, ...]
    ready: int  # written once the worker listens, then closed
    lifeline: int  # end of file when the parent is gone

    def sockets(self) -> Sockets:
        return Sockets(
            [socket.socket(fileno=fd) for fd in self.mqtt],
            [socket.socket(fileno=fd) for fd in self.ws],
        )

    def served(self, stop: asyncio.Event) -> None:
        """Tell the parent this worker listens; set `stop` when the parent is gone."""
        with contextlib.suppress(OSError):
            os.write(self.ready, b"1")
        os.close(self.ready)
        loop = asyncio.get_running_loop()

        def orphaned() -> None:
            loop.remove_reader(self.lifeline)  # end of file stays readable: once is enough
            stop.set()

        loop.add_reader(self.lifeline, orphaned)

    def encode(self) -> str:
        return json.dumps(
            {"mqtt": self.mqtt, "ws": self.ws, "ready": self.ready, "lifeline": self.lifeline}
        )

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Worker | None:
        """The worker's descriptors when this process is one (:data:`WORKER_ENV`)."""
        raw = environ.get(WORKER_ENV)
        if not raw:
            return None
        doc = json.loads(raw)
        return cls(tuple(doc["mqtt"]), tuple(doc["ws"]), doc["ready"], doc["lifeline"])


def worker_settings(settings: ProxySettings) -> ProxySettings:
    """A worker's settings: one process, and no metrics port (the parent serves it)."""
    return settings.model_copy(update={"workers": 1, "metrics_port": None})


@dataclass
class _Running:
    proc: subprocess.Popen[bytes]
    ready: int  # the read end of its ready pipe, -1 once read (or closed unread)
    listening: bool = False  # it said so on that pipe


class Supervisor:
    """The parent of `settings.workers` workers (:func:`supervise`)."""

    def __init__(self, settings: ProxySettings, argv: Sequence[str]) -> None:
        self.settings = settings
        self.argv = list(argv)
        self.sockets = Sockets.bind(settings)
        self.metrics_dir = tempfile.mkdtemp(prefix="offload-proxy-metrics-")
        self._lifeline_read, self._lifeline_write = os.pipe()
        self.workers: list[_Running | None] = [None] * settings.workers
        self.stopping = False

    @property
    def port(self) -> int:
        return int(self.sockets.mqtt[0].getsockname()[1])

    def _fds(self) -> tuple[list[int], list[int]]:
        return [s.fileno() for s in self.sockets.mqtt], [s.fileno() for s in self.sockets.ws]

    def spawn(self, index: int) -> None:
        ready_read, ready_write = os.pipe()
        mqtt, ws = self._fds()
        role = Worker(tuple(mqtt), tuple(ws), ready_write, self._lifeline_read)
        env = {**os.environ, WORKER_ENV: role.encode(), MULTIPROC_ENV: self.metrics_dir}
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", *self.argv],
            env=env,
            pass_fds=(*mqtt, *ws, ready_write, self._lifeline_read),
            stdout=subprocess.DEVNULL,
        )
        os.close(ready_write)
        self.workers[index] = _Running(proc, ready_read)
        log.info("worker started", extra={"worker": index, "pid": proc.pid})

    def wait_ready(self, timeout: float = START_TIMEOUT) -> bool:
        """Block until every worker listens; False when one exited or took too long."""
        deadline = time.monotonic() + timeout
        for running in self.workers:
            assert running is not None
            while running.ready >= 0 and time.monotonic() < deadline:
                self._heard(running, 0.1)
            if not running.listening:
                return False  # it exited (its pipe closed unwritten) or took too long
        return True

    @staticmethod
    def _heard(running: _Running, wait: float) -> None:
        """Read the worker's ready pipe if it has spoken (or closed: it exited first)."""
        readable, _, _ = select.select([running.ready], [], [], wait)
        if not readable:
            return
        running.listening = os.read(running.ready, 1) == b"1"
        os.close(running.ready)
        running.ready = -1

    def healthy(self) -> tuple[bool, str]:
        alive = sum(
            1 for w in self.workers if w is not None and w.listening and w.proc.poll() is None
        )
        ok = alive == len(self.workers) and not self.stopping
        return ok, f"{'ok' if ok else 'degraded'} ({alive} of {len(self.workers)} workers)"

    def render(self, accept: str = "") -> tuple[bytes, str]:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self.metrics_dir)  # type: ignore[no-untyped-call]
        # No exemplars: a worker's stay in its own process (docs/operations.md).
        encode, media_type = exposition(accept)
        return bytes(encode(registry)), media_type

    async def watch(self) -> int:
        """Start again each worker that exits (after :data:`RESTART_DELAY`); 1 when one
        exited before it listened (its settings cannot work: no use starting it again)."""
        while not self.stopping:
            await asyncio.sleep(0.5)
            for index, running in enumerate(self.workers):
                if running is None:
                    continue
                if running.ready >= 0:
                    self._heard(running, 0)
                if running.proc.poll() is None or self.stopping:
                    continue
                if running.ready >= 0:
                    self._heard(running, 0)  # it may have spoken just before it exited
                if not running.listening:
                    log.error("worker exited before it listened", extra={"worker": index})
                    return 1
                multiprocess.mark_process_dead(running.proc.pid, self.metrics_dir)  # type: ignore[no-untyped-call]
                log.warning(
                    "worker exited; starting it again",
                    extra={
                        "worker": index,
                        "pid": running.proc.pid,
                        "code": running.proc.returncode,
                    },
                )
                await asyncio.sleep(RESTART_DELAY)
                if not self.stopping:
                    self.spawn(index)
        return 0

    def stop(self) -> None:
        """SIGTERM to every worker; wait (shutdown_timeout and 10 s more), then SIGKILL."""
        self.stopping = True
        procs = [w.proc for w in self.workers if w is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.settings.shutdown_timeout + 10
        for proc in procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        for sock in (*self.sockets.mqtt, *self.sockets.ws):
            sock.close()
        for fd in (self._lifeline_read, self._lifeline_write):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.metrics_dir, ignore_errors=True)


def supervise(settings: ProxySettings, argv: Sequence[str]) -> int:
    """Run `settings.workers` workers until SIGTERM or SIGINT; the exit status."""
    supervisor = Supervisor(settings, argv)
    try:
        for index in range(settings.workers):
            supervisor.spawn(index)
        if not supervisor.wait_ready():
            log.error("a worker did not start")
            return 1
        print(
            f"offload-proxy listening on {settings.host}:{supervisor.port}"
            f" ({settings.workers} workers)",
            flush=True,
        )
        return asyncio.run(_serve(supervisor))
    finally:
        supervisor.stop()
        supervisor.close()


async def _serve(supervisor: Supervisor) -> int:
    settings = supervisor.settings
    stop = asyncio.Event()

    def stopping() -> None:
        supervisor.stopping = True  # no worker is started again from here on
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping)
    server = None
    if settings.metrics_port is not None:
        server = await serve_metrics(
            supervisor, supervisor.healthy, settings.metrics_host, settings.metrics_port
        )
    watcher = asyncio.create_task(supervisor.watch())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({watcher, stopped}, return_when=asyncio.FIRST_COMPLETED)
    status = watcher.result() if watcher.done() else 0
    supervisor.stopping = True
    for task in (watcher, stopped):
        task.cancel()
    if server is not None:
        server.close()
    return status
