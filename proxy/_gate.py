"""The PROXY-protocol gate (`OFFLOAD_PROXY_TRUSTED_LBS`): each accepted socket checked
before any transport or TLS exists, and how many may wait there at once.

From a trusted address a PROXY header (v1 or v2, :class:`proxy.protocol.ProxyHeaderReader`)
is required within `connect_timeout`, read exactly to its last byte (what follows, the MQTT
CONNECT, a TLS ClientHello or a WebSocket upgrade, stays on the socket), and its source
address is the device's; a trusted peer that sends none is refused. From any other address
the first bytes are peeked at (not read) and a PROXY header is refused: nobody else may say
whose connection it is. Then the socket becomes an asyncio stream (TLS when the listener has
it) and is served as any other.

A connection waits at the gate until its first bytes come, so the gate is a pool, and it
has shares: at most `max_pending` connections at once (`gate-full`); one address that is
not a trusted balancer at most `per_address` of them (`gate-full-address`), and all such
addresses together at most half (:data:`UNTRUSTED_PART`, `gate-full`): the other half is
kept for the balancers, whose connections carry the fleet and leave the gate as soon as
their header is read. Before, the gate had only its total: one address reopening silent
sockets filled it (490,312 refusals in 25 s), and every device, the balancers' too, was
reset. A balancer's own address has no share of its own: it is the whole fleet's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from client.protocol import address_key

from ._stream import READ_SIZE
from .protocol import BadProxyHeader, ProxyHeaderReader
from .protocol._proxy_header import V1_PREFIX, V2_SIGNATURE

log = logging.getLogger("proxy")

#: Addresses that are not trusted balancers may hold at most 1 / this of the gate together.
UNTRUSTED_PART = 2

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Served = tuple[asyncio.StreamReader, asyncio.StreamWriter, str]
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, str], Awaitable[None]]


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


class Gate:
    """Accepted sockets on their way to `handle(reader, writer, device address)`.

    Args:
        trusted: whether an address (:func:`device_address`) is a trusted load balancer's.
        tls: the listener's TLS context, None for plain TCP.
        timeout: seconds for the PROXY header and the TLS handshake (`connect_timeout`).
        max_pending: connections at the gate at once (`max_connections`).
        per_address: connections one address that is not a trusted balancer may have at
            the gate at once (`max_connections_per_address`).
        refused: called with a short reason for each connection the gate refuses.
    """

    def __init__(
        self,
        trusted: Callable[[str], bool],
        *,
        tls: ssl.SSLContext | None,
        timeout: float,
        max_pending: int,
        per_address: int,
        refused: Callable[[str], None],
    ) -> None:
        self._trusted = trusted
        self._tls = tls
        self._timeout = timeout
        self._max_pending = max_pending
        self._untrusted_max = max(1, max_pending // UNTRUSTED_PART)
        self._per_address = per_address
        self._refused = refused
        self.waiting: set[asyncio.Task[None]] = set()
        self._from: collections.Counter[str] = collections.Counter()  # untrusted, by key
        self._untrusted = 0

    def _full(self, key: str | None) -> str | None:
        """Which bound one more connection from `key` (None: a trusted balancer) passes."""
        if len(self.waiting) >= self._max_pending:
            return "gate-full"
        if key is None:
            return None
        if self._untrusted >= self._untrusted_max:
            return "gate-full"
        if self._from[key] >= self._per_address:
            return "gate-full-address"
        return None

    def enter(self, conn: socket.socket, address: str, handle: Handler) -> None:
        """Take `conn` (accepted from `address`) through the gate, then `handle` it; or
        close it at once when its share of the gate is full."""
        lb = self._trusted(address)
        key = None if lb else address_key(address)
        why = self._full(key)
        if why is not None:
            self._refused(why)
            conn.close()
            return
        if key is not None:
            self._from[key] += 1
            self._untrusted += 1
        task = asyncio.create_task(self._serve(conn, address, lb, key, handle))
        self.waiting.add(task)

    def _leave(self, key: str | None) -> None:
        """The current task's connection is through the gate (or refused, or gone)."""
        task = asyncio.current_task()
        if task is not None:
            self.waiting.discard(task)  # served now: close() leaves it to the proxy's shutdown
        if key is not None:
            self._untrusted -= 1
            self._from[key] -= 1
            if not self._from[key]:
                del self._from[key]

    async def _serve(
        self, conn: socket.socket, address: str, lb: bool, key: str | None, handle: Handler
    ) -> None:
        try:
            served = await self._through(conn, address, lb)
        finally:
            self._leave(key)
        if served is not None:
            await handle(*served)

    def close(self) -> None:
        """Drop the connections still at the gate."""
        for task in self.waiting:
            task.cancel()

    async def _through(self, conn: socket.socket, address: str, lb: bool) -> Served | None:
        """One accepted socket: its PROXY header (or its absence) checked; None when it was
        refused or closed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        try:
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            async with asyncio.timeout_at(deadline):
                if lb:
                    proxied = await _proxied(loop, conn, address)
                    if proxied is None:  # a TCP health check: connected, closed, said nothing
                        log.debug("closed before its first byte", extra={"from": address})
                        conn.close()
                        return None
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
            return None
        except asyncio.CancelledError:  # the listener closed while this one was at the gate
            conn.close()
            raise
        except Exception:  # never the listener's end: one connection's bug ends that one
            log.exception("connection failed at the gate", extra={"from": address})
            conn.close()
            return None
        if lb:
            log.debug("PROXY header", extra={"from": address, "peer": peer})
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop), peer


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
