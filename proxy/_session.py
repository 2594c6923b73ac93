"""One client connection: its CONNECT read and checked, one broker connection opened for it,
then the two relay directions (:mod:`proxy._inbound`, :mod:`proxy._outbound`) until either
side ends.

The CONNECT must arrive whole within `connect_timeout` and at most `max_connect_bytes`, and
is forwarded unchanged (the broker decides who gets in; AUTH packets pass both ways; a 3.1.1
client's in its MQTT 5 form, :mod:`proxy.protocol._v311`), unless its Will is over the
broker's limit: the CONNECT then carries the Will's placeholder and the payload is stored
once the broker accepted the login (:mod:`proxy._will`). Nothing the client sends after its
CONNECT is read before its login is answered (but AUTH), and nothing is uploaded or fetched
for it before the broker's CONNACK 0.

What a connection holds before its login is answered (its CONNECT, read and parsed) is
counted against `max_login_bytes` for all connections, one address at most its share
(:attr:`proxy.ProxySettings.login_shares`): a CONNECT beyond is refused at once, so many
connections that send large CONNECTs slowly cannot grow the proxy's memory, nor one address
keep others from logging in. A client that breaks the protocol gets an MQTT 5 DISCONNECT
with the reason (3.1.1: the connection closed); its broker connection is closed without a
DISCONNECT, so the broker publishes its Will, as it would for a client that vanished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback

from client.protocol import address_key

from ._account import account
from ._chunks import release
from ._exceptions import PeerGone, PeerTimeout
from ._gateway import credentials
from ._inbound import relay_up
from ._outbound import relay_down
from ._shares import Holder, PoolFull, Taken
from ._state import Conn, PendingWill, Services
from ._stream import READ_SIZE, PacketStream
from ._will import prepare
from .protocol import (
    CONNECT,
    Connect,
    Head,
    ProxyProtocolError,
    connack_refusal,
    disconnect,
    keeps_session_without_id,
    parse_connect,
    slim,
    upgrade_connect,
)

log = logging.getLogger("proxy")

SERVER_BUSY = 0x89
SERVER_UNAVAILABLE = 0x88
IDENTIFIER_REJECTED = b"\x20\x02\x00\x02"  # 3.1.1's CONNACK
#: Bytes a login is charged beyond twice what its CONNECT sent (read in pieces, then joined
#: and parsed): the objects around it.
LOGIN_OVERHEAD = 4096


class Session:
    """Serves one accepted client connection (:meth:`run`)."""

    def __init__(
        self,
        services: Services,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        peer: str,
    ) -> None:
        self.services = services
        self.writer = writer
        self.peer = peer  # the device's address (proxy._listen: a PROXY header's, or the peer's)
        self._login: Taken | None = None
        self._connect: tuple[Connect, bytes] | None = None  # as read, until served
        settings = services.settings
        self.client = PacketStream(
            reader,
            max_length=settings.max_packet_size - 5,
            idle=settings.idle_timeout,
            **services.metrics.counting("up"),
        )
        self.conn: Conn | None = None

    @property
    def busy(self) -> bool:
        return self.conn is not None and self.conn.busy

    async def run(self, slot: Taken | None) -> None:
        """Serve the connection until it ends; every expected end (a timeout, a reset, a
        refusal) is one INFO line, never a traceback.

        Args:
            slot: its connection slot (its account's share is claimed at the broker's
                CONNACK, :mod:`proxy._admit`); None: over a limit, answered 0x89.
        """
        try:
            await self._run(slot)
        finally:
            self._end_login()

    async def _run(self, slot: Taken | None) -> None:
        try:
            self._connect = await self._read_connect()
        except (ProxyProtocolError, PeerTimeout, PeerGone) as exc:
            log.info("connection refused before CONNECT", extra={"why": str(exc)})
            return
        v5 = self._connect[0].v5
        if slot is None:  # (counted when it was accepted)
            await self._answer(connack_refusal(v5=v5, reason=SERVER_BUSY))
            return
        try:
            await self._serve(slot)
        except ProxyProtocolError as exc:
            self.services.metrics.protocol_errors.inc()
            log.info("protocol error", extra={"why": str(exc), "reason": exc.reason})
            if v5:
                await self._answer(disconnect(exc.reason))
        except (PeerGone, PeerTimeout, OSError) as exc:
            log.info("connection ended", extra={"why": str(exc) or repr(exc)})

    def _end_login(self) -> None:
        """What the login held is free (its CONNACK is out, or the connection ended)."""
        if self._login is not None:
            self._login.give_back()

    async def _answer(self, packet: bytes) -> None:
        with contextlib.suppress(OSError):
            self.writer.write(packet)
            async with asyncio.timeout(5):
                await self.writer.drain()

    async def _read_connect(self) -> tuple[Connect, bytes]:
        """The CONNECT, whole within `connect_timeout`, its bytes counted against the
        login budget.

        Raises:
            PeerTimeout: not whole in time.
            PeerGone: closed before it, or no room in the login budget for it.
            ProxyProtocolError: not a CONNECT, too large, malformed.
        """
        settings = self.services.settings
        try:
            async with asyncio.timeout(settings.connect_timeout):
                head = await self.client.head()
                if head is None:
                    raise PeerGone("closed before CONNECT")
                if head.type != CONNECT:
                    raise ProxyProtocolError(f"packet type {head.type} before CONNECT")
                if head.length > settings.max_connect_bytes:
                    raise ProxyProtocolError(f"a CONNECT of {head.length} bytes")
                body = await self._read_counted(head)
        except TimeoutError as exc:
            raise PeerTimeout(f"no whole CONNECT within {settings.connect_timeout} s") from exc
        return parse_connect(body), head.raw + body

    async def _read_counted(self, head: Head) -> bytes:
        """The CONNECT's body, each piece counted against the login budget as it arrives
        (twice: it is held in pieces, then joined), so that a connection holds what it sent,
        not what it announced: announcing 128 KiB and sending 10 bytes costs 4 KiB.

        Raises:
            PeerGone: no room left in the budget (the total, or the address's share).
        """
        logins = self.services.logins
        try:
            self._login = logins.take_now(Holder(address_key(self.peer)), LOGIN_OVERHEAD)
            pieces = []
            async for piece in self.client.pieces(head):
                self._login.more(2 * len(piece))
                pieces.append(piece)
        except PoolFull as exc:
            self.services.metrics.refused.labels(why="login-budget").inc()
            raise PeerGone(f"no room for a CONNECT of {head.length} bytes: {exc}") from exc
        return b"".join(pieces)

    async def _upstream(
        self, connect: Connect, packet: bytes
    ) -> tuple[Connect, bytes, PendingWill | None] | None:
        """The CONNECT the broker gets, its bytes and the Will it promises to store: a 3.1.1
        login in its MQTT 5 form (`upgrade_v311`), a Will over the broker's limit replaced
        by its placeholder (:mod:`proxy._will`). None: the client was refused (answered)."""
        settings = self.services.settings
        upstream = connect
        if not connect.v5 and settings.upgrade_v311:
            if keeps_session_without_id(connect):
                await self._answer(IDENTIFIER_REJECTED)
                return None
            upstream = upgrade_connect(connect)
            packet = upstream.packet
        will = None
        if upstream.will is not None and len(packet) > settings.broker_max_packet_size:
            endpoint = self.services.endpoint()
            if endpoint is None:
                log.warning("Will over the limit and no gateway endpoint known; CONNECT refused")
                await self._answer(connack_refusal(v5=connect.v5, reason=SERVER_UNAVAILABLE))
                return None
            packet, will = prepare(upstream, endpoint)
        return upstream, packet, will

    async def _open_broker(
        self, v5: bool
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to the broker within `connect_timeout`; None: the client was
        refused (answered 0x88, counted)."""
        settings = self.services.settings
        host, port = settings.broker_address
        try:
            async with asyncio.timeout(settings.connect_timeout):
                return await asyncio.open_connection(
                    host, port, limit=READ_SIZE, ssl=self.services.broker_tls
                )
        except (OSError, TimeoutError) as exc:
            log.warning("broker unreachable", extra={"why": repr(exc)})
            self.services.metrics.refused.labels(why="broker-unreachable").inc()
            await self._answer(connack_refusal(v5=v5, reason=SERVER_UNAVAILABLE))
            return None

    async def _serve(self, slot: Taken) -> None:
        """Serve the session of the CONNECT read (taken out of `self._connect`: the relays
        keep what they need of it, and a CONNECT of up to `max_connect_bytes` is not held
        for the connection's life)."""
        assert self._connect is not None
        (connect, packet), self._connect = self._connect, None
        settings = self.services.settings
        auth = credentials(connect, settings.gateway_login)
        prepared = await self._upstream(connect, packet)
        if prepared is None:
            return
        upstream, packet, will = prepared
        del prepared  # its CONNECT and bytes go with the names below (memory per connection)
        broker = await self._open_broker(connect.v5)
        if broker is None:
            return
        broker_reader, broker_writer = broker
        conn = Conn(
            # What the relays need of the CONNECT; its body, Will and password stay no longer
            # than the login (`auth` keeps the credentials the gateway gets).
            connect=slim(connect),
            account=account(connect, auth, settings.jwt_username_claim, self.services.tokens),
            peer=self.peer,
            client=self.client,
            client_writer=self.writer,
            broker=PacketStream(
                broker_reader,
                max_length=2**28,
                idle=settings.idle_timeout,
                **self.services.metrics.counting("down"),
            ),
            broker_writer=broker_writer,
            auth=auth,
            broker_limit=settings.broker_max_packet_size,
            keepalive=connect.keepalive,
            upgraded=upstream is not connect,
            will=will,
            login=self._login,
            slot=slot,
        )
        del connect, upstream, will  # the relays hold what they need (memory per connection)
        self.conn = conn
        try:
            broker_writer.write(packet)
            del packet
            failure, client_ended = await _relay(conn, self.services)
            if failure is not None:
                try:
                    raise failure
                finally:
                    del failure  # its traceback holds this frame: no cycle through it
            if client_ended:  # the client said DISCONNECT or closed: let the broker see it
                with contextlib.suppress(OSError, TimeoutError):
                    async with asyncio.timeout(5):
                        await broker_writer.drain()
        finally:
            release(conn, self.services)
            broker_writer.close()


async def _relay(conn: Conn, services: Services) -> tuple[BaseException | None, bool]:
    """Relay both ways until either side ends; the error it ended with (None: a clean
    end), and whether it was the client's side.

    The error's traceback keeps no frame's variables: a relay task that ends with an error
    raised from an `asyncio.timeout` (a peer that took or sent too little within
    idle_timeout) is in a reference cycle with it (the error's cause, the timeout's frame,
    the timeout, the task, its error), which only the collector breaks, and the proxy's
    comes rarely (proxy/_heap.py). Until then every frame of the relay stayed alive with
    what it held: a device cut off for not reading a shared payload kept the whole spool
    its last piece was a view of (8 MiB of resident memory for each such device, for as
    long as no full collection came). Nor are the tasks awaited where they failed: each
    raise of the error through a frame holding them made one more such cycle.
    """
    up = asyncio.create_task(relay_up(conn, services))
    down = asyncio.create_task(relay_down(conn, services))
    try:
        done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (up, down):
            task.cancel()
        await asyncio.wait({up, down})  # their cleanup runs before the session's
    for task in done:
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            _forget_frames(failure)
            return failure, up in done
    return None, up in done


def _forget_frames(error: BaseException) -> None:
    """Drop the variables of the frames in `error`'s tracebacks, its cause's and its
    context's (the file names and lines stay, for a log line)."""
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        traceback.clear_frames(link.__traceback__)
        link = link.__cause__ or link.__context__
