"""The composition root: listener, shared services, limits, metrics port, shutdown.

:class:`Proxy` is what `offload-proxy` runs and what tests start in-process::

    proxy = Proxy(ProxySettings(broker="mqtt://127.0.0.1:1883", port=0, endpoint=GW))
    await proxy.start()            # proxy.port is the bound port
    ...
    await proxy.close()            # stop accepting; transfers under way get shutdown_timeout

No state is shared between proxies: each client connection has its own broker connection,
so any number of replicas can stand behind one Service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable

from client import load_identities
from client._malloc import trim_malloc

from ._descriptors import REFUSING, fit_connections
from ._discovery import Discovery
from ._gateway import GatewayLink
from ._metrics import Metrics, serve_metrics
from ._session import Session
from ._settings import ProxySettings
from ._shares import Holder, Limits, Pool, PoolFull, Taken, address_key
from ._state import Services
from ._stream import READ_SIZE
from ._websocket import HandshakeFailed, WebSocketReader, WebSocketWriter, handshake

log = logging.getLogger("proxy")

#: Seconds between looks at what logins freed, and how much they must have freed (bytes
#: counted against max_login_bytes) for the heaps to be trimmed.
TRIM_EVERY = 2.0
TRIM_AFTER = 8 * 1024 * 1024


def peer_address(writer: asyncio.StreamWriter) -> str:
    """The device's address as the accepted socket sees it (an IPv4-mapped IPv6 address as
    IPv4): what every per-address rule keys on and what the gateway is told it is."""
    peer = writer.get_extra_info("peername")
    host = peer[0] if isinstance(peer, tuple) and peer else str(peer or "unknown")
    return host.removeprefix("::ffff:") if host.count(".") == 3 else host


class Proxy:
    """The MQTT offload proxy.

    Args:
        settings: every knob (:class:`proxy.ProxySettings`).
    """

    def __init__(self, settings: ProxySettings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self._discovery = None if settings.endpoint else Discovery(settings)
        verify = (
            ssl.create_default_context(cafile=str(settings.ca_file)) if settings.ca_file else True
        )
        self._gateway = GatewayLink(
            timeout=settings.http_timeout, verify=verify, idle=settings.idle_timeout
        )
        metrics = self.metrics
        pool = self._pool
        self.services = Services(
            settings=settings,
            gateway=self._gateway,
            endpoint=self._endpoint,
            metrics=metrics,
            uploads=pool("uploads", settings.upload_shares, metrics.uploads.set),
            fetches=pool("fetches", settings.fetch_shares, metrics.fetches.set),
            logins=pool("logins", settings.login_shares),
            broker_tls=settings.broker_tls(),
            identities=tuple(load_identities(settings.identity_files)),  # a bad file: fails now
        )
        self._sessions: dict[asyncio.Task[None], Session] = {}
        self._server: asyncio.Server | None = None
        self._metrics_server: asyncio.Server | None = None
        self._background: list[asyncio.Task[None]] = []
        self.port = settings.port
        self.ws_port = settings.ws_port
        self._ws_server: asyncio.Server | None = None
        self.metrics_port = settings.metrics_port
        self.max_connections = settings.max_connections  # lowered at start to fit the fds
        self._connections = self._pool("connections", settings.connection_shares(None))
        self._refusing = 0  # connections over a limit waiting for their CONNECT (0x89)

    def _pool(self, name: str, limits: Limits, gauge: Callable[[int], None] | None = None) -> Pool:
        """A pool whose refusals and waits are counted (`offload_proxy_shares_full`)."""
        full = self.metrics.shares_full
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
        # A reader buffers up to twice its limit while the relay waits to write: with 256 KiB
        # (one read) a connection holds at most ~0.5 MiB per direction.
        self._server = await asyncio.start_server(
            self._accept,
            s.host,
            s.port,
            limit=READ_SIZE,
            ssl=s.listener_tls(),
            ssl_handshake_timeout=s.connect_timeout if s.tls_cert_file else None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        if s.ws_port is not None:
            self._ws_server = await asyncio.start_server(
                self._accept_ws,
                s.host,
                s.ws_port,
                limit=READ_SIZE,
                ssl=s.listener_tls(),
                ssl_handshake_timeout=s.connect_timeout if s.tls_cert_file else None,
            )
            self.ws_port = self._ws_server.sockets[0].getsockname()[1]
        if self._discovery is not None:
            self._background.append(asyncio.create_task(self._discovery.run()))
        self._background.append(asyncio.create_task(self._give_back_memory()))
        if s.metrics_port is not None:
            self._metrics_server = await serve_metrics(
                self.metrics, self._health, s.metrics_host, s.metrics_port
            )
            self.metrics_port = self._metrics_server.sockets[0].getsockname()[1]
        log.info(
            "listening",
            extra={"host": s.host, "port": self.port, "ws_port": self.ws_port, "broker": s.broker},
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

    async def _accept_ws(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A WebSocket upgrade, then the MQTT connection inside it as any other."""
        try:
            ws = await handshake(reader, writer, self.settings.connect_timeout)
        except HandshakeFailed as exc:
            log.info("WebSocket refused", extra={"why": str(exc)})
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            return
        await self._accept(WebSocketReader(ws, reader, writer), WebSocketWriter(ws, reader, writer))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The one place the device's address is learnt (a PROXY protocol header would say
        # it here too): every per-address rule, the gateway's X-Forwarded-For and the logs
        # use Session.peer, handed on as Conn.peer.
        peer = peer_address(writer)
        session = Session(self.services, reader, writer, peer)
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
            await session.run(admitted=slot is not None)
        except asyncio.CancelledError:
            pass  # shutdown: ends here (asyncio's stream callback must not see it raised)
        except Exception:  # never a proxy crash: one connection's bug ends that connection
            log.exception("connection failed", extra={"peer": session.peer})
        finally:
            if slot is None:
                self._refusing -= 1
            else:
                slot.give_back()
            del self._sessions[task]
            self.metrics.connections.set(len(self._sessions))
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def close(self) -> None:
        """Stop accepting; idle connections close at once, transfers under way get
        `shutdown_timeout` seconds to finish."""
        for server in (self._server, self._ws_server):
            if server is not None:
                server.close()
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
        assert self._server is not None
        await self._server.serve_forever()
