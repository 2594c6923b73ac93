"""Where clients connect: the listening sockets, and the device's address for each
connection.

The sockets are bound here (:func:`bind`, as asyncio's own server binds them), so that
`offload-proxy --workers N` can bind once and hand the same sockets to every worker
(:mod:`proxy._workers`). A :class:`Listener` serves them one of two ways:

* **no trusted load balancers** (`trusted_lbs` empty, the default): asyncio's server, TLS
  and all, as before; the device's address is the connection's peer. A PROXY header is
  refused there by what reads the first bytes (MQTT: a packet type 0 or 5 before CONNECT;
  TLS and WebSocket: a failed handshake).
* **trusted load balancers** (`OFFLOAD_PROXY_TRUSTED_LBS`): each accepted socket goes
  through the gate first, before any transport or TLS exists. From a trusted address a
  PROXY header (v1 or v2, :class:`proxy.protocol.ProxyHeaderReader`) is required within
  `connect_timeout`, read exactly to its last byte (what follows, the MQTT CONNECT, a TLS
  ClientHello or a WebSocket upgrade, stays on the socket), and its source address is the
  device's; a trusted peer that sends none is refused. From any other address the first
  bytes are peeked at (not read) and a PROXY header is refused: nobody else may say whose
  connection it is. Then the socket becomes an asyncio stream (TLS when the listener has
  it) and is served as any other.

The device's address (:func:`device_address`: an IP address, IPv4-mapped IPv6 as IPv4) is
what the per-address rules, the gateway's `X-Forwarded-For` and the logs use.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ipaddress
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ._stream import READ_SIZE
from .protocol import BadProxyHeader, ProxyHeaderReader
from .protocol._proxy_header import V1_PREFIX, V2_SIGNATURE

log = logging.getLogger("proxy")

#: Connections the kernel queues for `accept` (asyncio's own default).
BACKLOG = 100

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, str], Awaitable[None]]

#: The device's address for the connection this task (and the tasks it starts) serves.
PEER: contextvars.ContextVar[str | None] = contextvars.ContextVar("peer", default=None)


class _PeerField(logging.Filter):
    """Adds `peer` (:data:`PEER`) to every record logged while a connection is served,
    unless the record names one itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        peer = PEER.get()
        if peer is not None and not hasattr(record, "peer"):
            record.peer = peer
        return True


_PEER_FIELD = _PeerField()


def peer_in_logs(logger: logging.Logger) -> None:
    """Name the device in `logger`'s records of a connection (once per logger)."""
    logger.addFilter(_PEER_FIELD)  # the same filter twice is kept once


def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for `host`:`port`, one per address it resolves to, set up as
    asyncio's `create_server` sets up its own (SO_REUSEADDR, IPv6 only on IPv6 sockets,
    non-blocking, backlog :data:`BACKLOG`). Port 0: the first socket's port for all."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:  # every family on the port the first got
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        # Named, for the one line offload-proxy prints (socket.bind's error names nothing).
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {reason}") from exc
    return sockets


def device_address(host: object) -> str:
    """The address a device is known by: an IP address as text, an IPv4-mapped IPv6 one
    (a dual-stack socket's view of an IPv4 peer) as IPv4, 'unknown' when there is none."""
    if isinstance(host, tuple | list) and host:
        host = host[0]  # a socket address: (host, port, ...)
    if not isinstance(host, str):
        return "unknown"
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return "unknown"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def trusted(address: str, networks: Sequence[Network]) -> bool:
    """Whether `address` (from :func:`device_address`) is one of `networks`."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in networks if net.version == ip.version)


def looks_like_proxy_header(first: bytes) -> bool:
    """Whether a connection's first bytes (however few) can be the start of a PROXY header."""
    return bool(first) and (
        V2_SIGNATURE.startswith(first[: len(V2_SIGNATURE)])
        or V1_PREFIX.startswith(first[: len(V1_PREFIX)])
    )


class Listener:
    """Serves the bound `sockets` with `handle(reader, writer, device address)`.

    Args:
        sockets: from :func:`bind` (or inherited from the `--workers` parent).
        handle: serves one connection (:meth:`proxy.Proxy._accept` and its WebSocket twin).
        trusted_lbs: load balancers that must send a PROXY header; empty: no gate.
        tls: the listener's TLS context, None for plain TCP.
        timeout: seconds for the PROXY header and the TLS handshake (`connect_timeout`).
        max_pending: connections at the gate at once (`max_connections`); beyond, a new
            one is closed at once (`refused("gate-full")`).
        refused: called with a short reason for each connection the gate refuses.
    """

    def __init__(
        self,
        sockets: Sequence[socket.socket],
        handle: Handler,
        *,
        trusted_lbs: Sequence[Network] = (),
        tls: ssl.SSLContext | None = None,
        timeout: float = 10.0,
        max_pending: int = 10_000,
        refused: Callable[[str], None] = lambda why: None,
    ) -> None:
        self._sockets = list(sockets)
        self._handle = handle
        self._trusted = tuple(trusted_lbs)
        self._tls = tls
        self._timeout = timeout
        self._refused = refused
        self._max_pending = max_pending
        self._servers: list[asyncio.Server] = []
        self._accepting: list[asyncio.Task[None]] = []
        self._gated: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        return int(self._sockets[0].getsockname()[1])

    async def start(self) -> None:
        if not self._trusted:
            for sock in self._sockets:
                self._servers.append(
                    await asyncio.start_server(
                        self._plain,
                        sock=sock,
                        limit=READ_SIZE,
                        ssl=self._tls,
                        ssl_handshake_timeout=self._timeout if self._tls else None,
                    )
                )
            return
        for sock in self._sockets:
            sock.setblocking(False)
            self._accepting.append(asyncio.create_task(self._accept_loop(sock)))

    def is_serving(self) -> bool:
        if self._servers:
            return all(server.is_serving() for server in self._servers)
        return bool(self._accepting) and not any(task.done() for task in self._accepting)

    def close(self) -> None:
        """Stop accepting (connections already served go on); connections still at their
        PROXY header are dropped."""
        for server in self._servers:
            server.close()
        for task in (*self._accepting, *self._gated):
            task.cancel()
        if self._accepting:
            for sock in self._sockets:
                sock.close()

    async def _plain(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._handle(reader, writer, device_address(writer.get_extra_info("peername")))

    async def _accept_loop(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(listening)
            except OSError as exc:  # out of file descriptors, a connection reset in the queue
                log.warning("accept failed", extra={"why": repr(exc)})
                await asyncio.sleep(0.1)
                continue
            if len(self._gated) >= self._max_pending:  # silent connections would pile up
                self._refused("gate-full")
                conn.close()
                continue
            task = asyncio.create_task(self._gate(conn, device_address(address)))
            self._gated.add(task)
            task.add_done_callback(self._gated.discard)

    async def _gate(self, conn: socket.socket, address: str) -> None:
        """One accepted socket: its PROXY header (or its absence) checked, then served."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        lb = trusted(address, self._trusted)
        try:
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            async with asyncio.timeout_at(deadline):
                if lb:
                    proxied = await _proxied(loop, conn, address)
                    if proxied is None:  # a TCP health check: connected, closed, said nothing
                        log.debug("closed before its first byte", extra={"from": address})
                        conn.close()
                        return
                    peer = proxied
                elif looks_like_proxy_header(await _peek(loop, conn)):
                    raise BadProxyHeader("a PROXY header from an address not trusted")
                else:
                    peer = address
            reader = asyncio.StreamReader(limit=READ_SIZE)
            protocol = asyncio.StreamReaderProtocol(reader)
            timeout = max(deadline - loop.time(), 0.1) if self._tls else None
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, conn, ssl=self._tls, ssl_handshake_timeout=timeout
            )
        except (BadProxyHeader, TimeoutError, OSError) as exc:
            why = _why(exc, lb)
            self._refused(why)
            log.info("connection refused", extra={"why": str(exc) or why, "from": address})
            conn.close()
            return
        except asyncio.CancelledError:  # the listener closed while this one was at the gate
            conn.close()
            raise
        except Exception:  # never the listener's end: one connection's bug ends that one
            log.exception("connection failed at the gate", extra={"from": address})
            conn.close()
            return
        if lb:
            log.debug("PROXY header", extra={"from": address, "peer": peer})
        task = asyncio.current_task()
        if task is not None:
            self._gated.discard(task)  # served now: close() leaves it to the proxy's shutdown
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        await self._handle(reader, writer, peer)


def _why(exc: BaseException, lb: bool) -> str:
    """The `why` label of `offload_proxy_refused_connections` for a connection the gate
    refused."""
    if isinstance(exc, BadProxyHeader):
        return "proxy-header" if lb else "proxy-header-untrusted"
    if isinstance(exc, TimeoutError):
        return "proxy-header-timeout" if lb else "timeout"
    return "tls-handshake" if isinstance(exc, ssl.SSLError) else "closed"


async def _proxied(loop: asyncio.AbstractEventLoop, conn: socket.socket, lb: str) -> str | None:
    """The device's address from the PROXY header `conn` starts with (`lb`'s own when the
    header names no client: LOCAL, UNKNOWN, AF_UNSPEC); None when `conn` closed before
    its first byte.

    Raises:
        BadProxyHeader: none, a malformed one, or the connection closed inside it.
    """
    reader = ProxyHeaderReader()
    first = True
    while True:
        data = await loop.sock_recv(conn, reader.wanted)  # never past the header
        if not data and first:
            return None
        first = False
        if not data:
            raise BadProxyHeader("closed before its PROXY header was whole")
        header = reader.feed(data)
        if header is not None:
            return device_address(header.source) if header.source else lb


async def _peek(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bytes:
    """The first bytes waiting on `conn`, left there (b"" when it closed)."""
    ready: asyncio.Future[None] = loop.create_future()
    fd = conn.fileno()
    loop.add_reader(fd, _set, ready)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
    with contextlib.suppress(BlockingIOError):
        return conn.recv(len(V2_SIGNATURE), socket.MSG_PEEK)
    return b""  # pragma: no cover - readable, yet nothing: treated as no header


def _set(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_result(None)
