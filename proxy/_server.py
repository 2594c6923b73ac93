"""The composition root: listener, shared services, limits, metrics port, shutdown.

:class:`Proxy` is what `offload-proxy` runs and what tests start in-process::

    proxy = Proxy(ProxySettings(broker="mqtt://127.0.0.1:1883", port=0, endpoint=GW))
    await proxy.start()            # proxy.port is the bound port
    ...
    await proxy.close()            # stop accepting; transfers under way get shutdown_timeout

No state is shared between proxies: each client connection has its own broker connection,
so any number of replicas can stand behind one Service. The listening sockets are bound
here, or handed in already bound (`offload-proxy --workers N`: :mod:`proxy._workers`), and
served by :class:`proxy._listen.Listener` (a PROXY header from a trusted load balancer first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from client import Pace, load_identities
from client.malloc import trim_malloc
from client.metrics import certificate_expiry
from client.protocol import address_key
from client.tracing import TracerProviderLike, Tracing, tracing_for

from ._descriptors import REFUSING, fit_connections
from ._discovery import Discovery
from ._flights import SharedFetches
from ._gateway import GatewayLink
from ._lifecycle import Lifecycle
from ._listen import PEER, Listener, backlog, bind, peer_in_logs, system_backlog
from ._metrics import Metrics, serve_metrics
from ._session import Session
from ._settings import ProxySettings
from ._shares import Holder, Limits, Pool, PoolFull, Taken
from ._state import Services
from ._turns import Turns
from ._websocket import HandshakeFailed, WebSocketReader, WebSocketWriter, handshake

log = logging.getLogger("proxy")

#: Seconds between looks at what logins freed, and how much they must have freed (bytes
#: counted against max_login_bytes) for the heaps to be trimmed.
TRIM_EVERY = 2.0
TRIM_AFTER = 8 * 1024 * 1024


@dataclass(frozen=True)
class Sockets:
    """Listening sockets bound before the proxy starts (a `--workers` parent's)."""

    mqtt: list[socket.socket]
    ws: list[socket.socket] = field(default_factory=list)

    @classmethod
    def bind(cls, settings: ProxySettings) -> Sockets:
        queue = backlog(settings.backlog)
        mqtt = bind(settings.host, settings.port, queue)
        ws = bind(settings.host, settings.ws_port, queue) if settings.ws_port is not None else []
        return cls(mqtt, ws)


class Proxy:
    """The MQTT offload proxy.

    Args:
        settings: every knob (:class:`proxy.ProxySettings`).
        sockets: listening sockets already bound (default: bound at :meth:`start` from
            `host`, `port` and `ws_port`).
        tracer_provider: an OpenTelemetry `TracerProvider` for the spans of offloads and
            fetches (proxy/_tracing.py; `offload-proxy` makes one from `OTEL_*`); None: no
            spans, a device's trace context still carried on.
    """

    def __init__(
        self,
        settings: ProxySettings,
        sockets: Sockets | None = None,
        tracer_provider: TracerProviderLike | None = None,
    ) -> None:
        self.settings = settings
        self._sockets = sockets
        peer_in_logs(log)
        self.metrics = Metrics()
        self._discovery = None if settings.endpoint else Discovery(settings)
        verify = (
            ssl.create_default_context(cafile=str(settings.ca_file)) if settings.ca_file else True
        )
        self._gateway = GatewayLink(
            timeout=settings.http_timeout,
            verify=verify,
            idle=settings.idle_timeout,
            pace=Pace(settings.fetch_deadline, settings.fetch_min_rate),
            cut_off=lambda request: self.metrics.fetches_cut_off.labels(request=request).inc(),
        )
        metrics, pool = self.metrics, self._pool
        fetches = pool("fetches", settings.fetch_shares, metrics.fetches.set)
        self.services = Services(
            settings=settings,
            gateway=self._gateway,
            endpoint=self._endpoint,
            metrics=metrics,
            uploads=pool("uploads", settings.upload_shares, metrics.uploads.set),
            fetches=fetches,
            logins=pool("logins", settings.login_shares),
            shared=SharedFetches(
                self._gateway, fetches, settings.shared_limits, metrics, settings.spool_dir
            ),
            broker_tls=settings.broker_tls(),
            identities=tuple(load_identities(settings.identity_files)),  # a bad file: fails now
            tracing=Tracing() if tracer_provider is None else tracing_for(tracer_provider),
            turns=Turns(metrics.turns_waited.inc),
            lifecycle=Lifecycle(settings, self._gateway),
        )
        self._sessions: dict[asyncio.Task[None], Session] = {}
        self._server: Listener | None = None
        self._metrics_server: asyncio.Server | None = None
        self._background: list[asyncio.Task[None]] = []
        self.port = settings.port
        self.ws_port = settings.ws_port
        self._ws_server: Listener | None = None
        self._closed = asyncio.Event()
        self.metrics_port = settings.metrics_port
        self.max_connections = settings.max_connections  # lowered at start to fit the fds
        self._connections = self._pool("connections", settings.connection_shares(None))
        self._refusing = 0  # connections over a limit waiting for their CONNECT (0x89)

    def _pool(self, name: str, limits: Limits, gauge: Callable[[int], None] | None = None) -> Pool:
        """A pool whose refusals and waits are counted (`offload_proxy_shares_full`)."""
        full = self.metrics.shares_full
        self.metrics.pool_limit.labels(pool=name).set(limits.total)
        return Pool(
            limits,
            on_full=lambda share: full.labels(pool=name, share=share).inc(),
            on_change=gauge or (lambda used: None),
        )

    def _endpoint(self) -> str | None:
        if self.settings.endpoint:
            return self.settings.endpoint
        return self._discovery.endpoint if self._discovery else None

    def _health(self) -> tuple[bool, str]:
        if self._server is None or not self._server.is_serving():
            return False, "not serving"
        if self._endpoint() is None:
            return True, "ok (no gateway endpoint yet: large messages are refused)"
        return True, "ok"

    async def start(self) -> None:
        s = self.settings
        self.max_connections = fit_connections(s)
        self._connections = self._pool("connections", s.connection_shares(self.max_connections))
        sockets = self._sockets or Sockets.bind(s)
        # A reader buffers up to twice its limit while the relay waits to write: with 256 KiB
        # (one read) a connection holds at most ~0.5 MiB per direction.
        self._server = self._listener(sockets.mqtt, self._accept)
        await self._server.start()
        self.port = self._server.port
        if s.tls_cert_file is not None:  # loaded just now: its expiry for the alert
            expiry = certificate_expiry(s.tls_cert_file)
            self.metrics.certificate_expiry.labels(certificate="serving").set(expiry)
        if sockets.ws:
            self._ws_server = self._listener(sockets.ws, self._accept_ws)
            await self._ws_server.start()
            self.ws_port = self._ws_server.port
        if self._discovery is not None:
            self._background.append(asyncio.create_task(self._discovery.run()))
        self._background.append(asyncio.create_task(self._give_back_memory()))
        if s.metrics_port is not None:
            self._metrics_server = await serve_metrics(
                self.metrics, self._health, s.metrics_host, s.metrics_port
            )
            self.metrics_port = self._metrics_server.sockets[0].getsockname()[1]
        queue = min(backlog(s.backlog), system_backlog())
        if s.backlog is not None and s.backlog > queue:
            log.warning(
                "backlog capped by the system: raise net.core.somaxconn to keep it",
                extra={"backlog": queue, "configured": s.backlog},
            )
        log.info(
            "listening",
            extra={
                "host": s.host,
                "port": self.port,
                "ws_port": self.ws_port,
                "broker": s.broker,
                "backlog": queue,
            },
        )

    def _listener(
        self,
        sockets: list[socket.socket],
        handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter, str], Awaitable[None]],
    ) -> Listener:
        s = self.settings
        refused = self.metrics.refused
        return Listener(
            sockets,
            handle,
            backlog=backlog(s.backlog),
            trusted_lbs=s.trusted_lbs,
            tls=s.listener_tls(),
            timeout=s.connect_timeout,
            max_pending=self.max_connections,
            per_address=self._connections.limits.per_address,
            refused=lambda why: refused.labels(why=why).inc(),
        )

    async def _give_back_memory(self) -> None:
        """Hand what a burst of logins left in the heaps back to the kernel once it has
        gone (at the CONNECT timeout at the latest): glibc keeps freed blocks for reuse,
        and 250 stalled CONNECTs of 128 KiB left the proxy 35 MiB larger for good."""
        logins = self.services.logins
        while True:
            await asyncio.sleep(TRIM_EVERY)
            if logins.reset_peak() - logins.used >= TRIM_AFTER:
                await asyncio.to_thread(trim_malloc)

    async def _accept_ws(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        """A WebSocket upgrade, then the MQTT connection inside it as any other."""
        PEER.set(peer)
        try:
            ws = await handshake(reader, writer, self.settings.connect_timeout)
        except HandshakeFailed as exc:
            log.info("WebSocket refused", extra={"why": str(exc)})
            await closed(writer, self.settings.idle_timeout)
            return
        await self._accept(
            WebSocketReader(ws, reader, writer), WebSocketWriter(ws, reader, writer), peer
        )

    async def _accept(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        PEER.set(peer)  # this connection's log lines name its device (proxy._listen)
        log.debug("connection accepted")
        session = Session(self.services, reader, writer, peer=peer)
        task = asyncio.current_task()
        assert task is not None
        try:  # each address at most its share of the connections
            slot: Taken | None = self._connections.take_now(Holder(address_key(peer)))
        except PoolFull as exc:
            slot = None
            why = "max-connections" if exc.share == "total" else "max-connections-per-address"
            self.metrics.refused.labels(why=why).inc()
            if self._refusing >= REFUSING:
                writer.close()  # beyond even those waiting for their 0x89: none to spare
                return
            self._refusing += 1
        self._sessions[task] = session
        self.metrics.connections.set(len(self._sessions))
        try:
            await session.run(slot)
        except asyncio.CancelledError:
            pass  # shutdown: ends here (asyncio's stream callback must not see it raised)
        except Exception:  # never a proxy crash: one connection's bug ends that connection
            log.exception("connection failed")
        finally:
            if slot is None:
                self._refusing -= 1
            else:
                slot.give_back()
            del self._sessions[task]
            self.metrics.connections.set(len(self._sessions))
            await closed(writer, self.settings.idle_timeout)

    async def close(self) -> None:
        """Stop accepting; idle connections close at once, transfers under way get
        `shutdown_timeout` seconds to finish."""
        for server in (self._server, self._ws_server):
            if server is not None:
                server.close()
        self._closed.set()
        self.services.closing.set()  # new offloads are refused from here on
        for task in self._background:
            task.cancel()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.shutdown_timeout
        for task, session in list(self._sessions.items()):
            if not session.busy:
                task.cancel()
        busy = [s for s in self._sessions.values() if s.busy]
        if busy:
            log.info("waiting for transfers", extra={"count": len(busy)})
        while any(s.busy for s in self._sessions.values()) and loop.time() < deadline:
            await asyncio.sleep(0.05)  # a transfer, or the broker's ack of its placeholder
        for task in list(self._sessions):
            task.cancel()
        remaining = list(self._sessions) + self._background
        if remaining:
            await asyncio.wait(remaining, timeout=5)
        if self._metrics_server is not None:
            self._metrics_server.close()
        await self._gateway.aclose()

    async def serve_forever(self) -> None:
        """Wait until :meth:`close`."""
        await self._closed.wait()


async def closed(writer: asyncio.StreamWriter, within: float) -> None:
    """Close a client's connection: what is still unsent goes first if the client takes it
    within `within` seconds (`idle_timeout`, as for any write), else it is dropped with the
    connection (a reset). A graceful close waits for the peer to take the unsent bytes: a
    client that never reads again held its socket, the unsent bytes (under uvloop a view of
    the whole shared payload they came from) and this task for as long as it stayed
    connected, its connection slot already given back."""
    writer.close()
    with contextlib.suppress(Exception):  # a TimeoutError too: then the reset
        async with asyncio.timeout(within):
            await writer.wait_closed()
    writer.transport.abort()  # nothing left to drop once it closed
