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
  through the gate first (:class:`proxy._gate.Gate`), before any transport or TLS exists:
  a trusted balancer's PROXY header read, anyone else's refused, each address held to its
  share of the gate.

The device's address (:func:`device_address`: an IP address, IPv4-mapped IPv6 as IPv4) is
what the per-address rules, the gateway's `X-Forwarded-For` and the logs use.

The kernel queues connections for `accept` up to the listen backlog (:func:`backlog`: the
system's most, `net.core.somaxconn`, or `OFFLOAD_PROXY_BACKLOG`). A reconnect storm that
overflows the queue costs each device whose SYN it drops a second or more before its SYN is
sent again: with asyncio's default of 100, 5,000 devices connecting 1,000 at a time met
7,911 such drops (`python bench/proxy_storm.py`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import socket
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path

from ._gate import Gate, Handler, Network, device_address, trusted
from ._stream import READ_SIZE

log = logging.getLogger("proxy")

#: Where Linux says the most connections it queues for one listener.
SOMAXCONN = Path("/proc/sys/net/core/somaxconn")

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


def system_backlog() -> int:
    """The most connections the kernel queues for one listener: Linux's
    `net.core.somaxconn` (which also caps any larger backlog asked for), else Python's
    `socket.SOMAXCONN`."""
    try:
        return max(1, int(SOMAXCONN.read_text()))
    except (OSError, ValueError):
        return socket.SOMAXCONN


def backlog(configured: int | None) -> int:
    """The listen backlog: `configured` (`OFFLOAD_PROXY_BACKLOG`), else the system's most."""
    return configured or system_backlog()


def bind(host: str, port: int, queue: int) -> list[socket.socket]:
    """Listening sockets for `host`:`port`, one per address it resolves to, set up as
    asyncio's `create_server` sets up its own (SO_REUSEADDR, IPv6 only on IPv6 sockets,
    non-blocking), each queueing up to `queue` connections (:func:`backlog`). Port 0: the
    first socket's port for all."""
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
            sock.listen(queue)
            sock.setblocking(False)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        # Named, for the one line offload-proxy prints (socket.bind's error names nothing).
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {reason}") from exc
    return sockets


def peer_address(sockaddr: object) -> str:
    """:func:`device_address` of an accepted socket's peer, without parsing an IPv4 one: an
    AF_INET socket's address is (host, port), its host the kernel's dotted quad already."""
    if type(sockaddr) is tuple and len(sockaddr) == 2 and type(sockaddr[0]) is str:
        return sockaddr[0]
    return device_address(sockaddr)


class Listener:
    """Serves the bound `sockets` with `handle(reader, writer, device address)`.

    Args:
        sockets: from :func:`bind` (or inherited from the `--workers` parent).
        handle: serves one connection (:meth:`proxy.Proxy._accept` and its WebSocket twin).
        backlog: connections the kernel queues for `accept` (:func:`backlog`).
        trusted_lbs: load balancers that must send a PROXY header; empty: no gate.
        tls: the listener's TLS context, None for plain TCP.
        timeout: seconds for the PROXY header and the TLS handshake (`connect_timeout`).
        max_pending: connections at the gate at once (`max_connections`); beyond, a new
            one is closed at once (`refused("gate-full")`).
        per_address: connections one address that is not a trusted balancer may have at
            the gate at once (`refused("gate-full-address")`).
        refused: called with a short reason for each connection the gate refuses.
    """

    def __init__(
        self,
        sockets: Sequence[socket.socket],
        handle: Handler,
        *,
        backlog: int = socket.SOMAXCONN,
        trusted_lbs: Sequence[Network] = (),
        tls: ssl.SSLContext | None = None,
        timeout: float = 10.0,
        max_pending: int = 10_000,
        per_address: int = 1_250,
        refused: Callable[[str], None] = lambda why: None,
    ) -> None:
        self._sockets = list(sockets)
        self._handle = handle
        self._backlog = backlog
        self._trusted = tuple(trusted_lbs)
        self._tls = tls
        self._timeout = timeout
        self._servers: list[asyncio.Server] = []
        self._accepting: list[asyncio.Task[None]] = []
        self.gate = Gate(
            functools.partial(trusted, networks=self._trusted),
            tls=tls,
            timeout=timeout,
            max_pending=max_pending,
            per_address=per_address,
            refused=refused,
        )

    @property
    def port(self) -> int:
        return int(self._sockets[0].getsockname()[1])

    async def start(self) -> None:
        if not self._trusted:
            for sock in self._sockets:
                self._servers.append(
                    await asyncio.start_server(  # (it listens again, with its own backlog)
                        self._plain,
                        sock=sock,
                        limit=READ_SIZE,
                        backlog=self._backlog,
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
        for task in self._accepting:
            task.cancel()
        self.gate.close()
        if self._accepting:
            for sock in self._sockets:
                sock.close()

    async def _plain(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._handle(reader, writer, peer_address(writer.get_extra_info("peername")))

    async def _accept_loop(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(listening)
            except OSError as exc:  # out of file descriptors, a connection reset in the queue
                log.warning("accept failed", extra={"why": repr(exc)})
                await asyncio.sleep(0.1)
                continue
            self.gate.enter(conn, peer_address(address), self._handle)
