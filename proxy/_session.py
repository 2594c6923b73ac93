"""One client connection: its CONNECT read and checked, one broker connection opened for it,
then the two relay directions (:mod:`proxy._inbound`, :mod:`proxy._outbound`) until either
side ends.

The CONNECT must arrive whole within `connect_timeout` and at most `max_connect_bytes`, and
is forwarded unchanged (the broker decides who gets in; AUTH packets pass both ways; a 3.1.1
client's in its MQTT 5 form, :mod:`proxy.protocol._v311`), unless
its Will is over the broker's limit: the Will's payload is then stored and the CONNECT
carries its placeholder. A client that breaks the protocol gets an MQTT 5 DISCONNECT with
the reason (3.1.1: the connection closed); its broker connection is closed without a
DISCONNECT, so the broker publishes its Will, as it would for a client that vanished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import httpx

from ._chunks import release
from ._exceptions import QUOTA_EXCEEDED, PeerGone, PeerTimeout, TransferFailed
from ._gateway import credentials
from ._inbound import relay_up
from ._outbound import relay_down
from ._state import Conn, Services
from ._stream import READ_SIZE, PacketStream
from .protocol import (
    CONNECT,
    Connect,
    ProxyProtocolError,
    connack_refusal,
    connect_with_will,
    disconnect,
    keeps_session_without_id,
    parse_connect,
    placeholder_will,
    upgrade_connect,
)

log = logging.getLogger("proxy")

SERVER_BUSY = 0x89
SERVER_UNAVAILABLE = 0x88
IDENTIFIER_REJECTED = b"\x20\x02\x00\x02"  # 3.1.1's CONNACK


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
        settings = services.settings
        self.client = PacketStream(
            reader, max_length=settings.max_packet_size - 5, idle=settings.idle_timeout
        )
        self.conn: Conn | None = None

    @property
    def busy(self) -> bool:
        return self.conn is not None and self.conn.busy

    async def run(self, admitted: bool) -> None:
        try:
            connect, packet = await self._read_connect()
        except (ProxyProtocolError, PeerTimeout, PeerGone) as exc:
            log.info("connection refused before CONNECT", extra={"why": str(exc)})
            return
        if not admitted:
            self.services.metrics.refused.labels(why="max-connections").inc()
            await self._answer(connack_refusal(v5=connect.v5, reason=SERVER_BUSY))
            return
        try:
            await self._serve(connect, packet)
        except ProxyProtocolError as exc:
            self.services.metrics.protocol_errors.inc()
            log.info("protocol error", extra={"why": str(exc), "reason": exc.reason})
            if connect.v5:
                await self._answer(disconnect(exc.reason))
        except (PeerGone, PeerTimeout) as exc:
            log.info("connection ended", extra={"why": str(exc)})

    async def _answer(self, packet: bytes) -> None:
        with contextlib.suppress(OSError):
            self.writer.write(packet)
            async with asyncio.timeout(5):
                await self.writer.drain()

    async def _read_connect(self) -> tuple[Connect, bytes]:
        settings = self.services.settings
        async with asyncio.timeout(settings.connect_timeout):
            head = await self.client.head()
            if head is None:
                raise PeerGone("closed before CONNECT")
            if head.type != CONNECT:
                raise ProxyProtocolError(f"packet type {head.type} before CONNECT")
            if head.length > settings.max_connect_bytes:
                raise ProxyProtocolError(f"a CONNECT of {head.length} bytes")
            body = await self.client.body(head)
        return parse_connect(body), head.raw + body

    async def _serve(self, connect: Connect, packet: bytes) -> None:
        settings = self.services.settings
        auth = credentials(connect, settings.gateway_login)
        upstream = connect  # the CONNECT the broker gets
        if not connect.v5 and settings.upgrade_v311:
            if keeps_session_without_id(connect):
                await self._answer(IDENTIFIER_REJECTED)
                return
            upstream = upgrade_connect(connect)
            packet = upstream.packet
        if upstream.will is not None and len(packet) > settings.broker_max_packet_size:
            try:
                packet = await self._offload_will(upstream, auth)
            except TransferFailed as exc:
                log.warning("Will not stored; CONNECT refused", extra={"why": str(exc)})
                await self._answer(connack_refusal(v5=connect.v5, reason=exc.reason))
                return
        host, port = settings.broker_address
        try:
            async with asyncio.timeout(settings.connect_timeout):
                broker_reader, broker_writer = await asyncio.open_connection(
                    host, port, limit=READ_SIZE, ssl=self.services.broker_tls
                )
        except (OSError, TimeoutError) as exc:
            log.warning("broker unreachable", extra={"why": repr(exc)})
            await self._answer(connack_refusal(v5=connect.v5, reason=SERVER_UNAVAILABLE))
            return
        conn = Conn(
            connect=connect,
            client=self.client,
            client_writer=self.writer,
            broker=PacketStream(broker_reader, max_length=2**28, idle=settings.idle_timeout),
            broker_writer=broker_writer,
            auth=auth,
            broker_limit=settings.broker_max_packet_size,
            keepalive=connect.keepalive,
            upgraded=upstream is not connect,
        )
        self.conn = conn
        try:
            broker_writer.write(packet)
            up = asyncio.create_task(relay_up(conn, self.services))
            down = asyncio.create_task(relay_down(conn, self.services))
            try:
                done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (up, down):
                    task.cancel()
                for task in (up, down):
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            for task in done:
                failure = task.exception()
                if failure is not None:
                    raise failure
            if up in done:  # the client said DISCONNECT or closed: let the broker see it
                with contextlib.suppress(OSError, TimeoutError):
                    async with asyncio.timeout(5):
                        await broker_writer.drain()
        finally:
            release(conn, self.services)
            broker_writer.close()

    async def _offload_will(self, connect: Connect, auth: httpx.Auth | None) -> bytes:
        """Store the Will's payload; the CONNECT with its placeholder instead."""
        will = connect.will
        assert will is not None
        endpoint = self.services.endpoint()
        if endpoint is None:
            raise TransferFailed("no gateway endpoint known yet (no discovery record)")

        async def payload() -> AsyncIterator[bytes]:
            yield will.payload

        uploads = self.services.uploads
        if uploads.locked():  # a Will's upload takes a slot as a PUBLISH's does
            raise TransferFailed("too many uploads at once", reason=QUOTA_EXCEEDED)
        async with uploads:
            stored = await self.services.gateway.upload(
                endpoint,
                topic=will.topic,
                size=len(will.payload),
                pieces=payload(),
                headers=(),
                ttl=None,
                auth=auth,
            )
        props, body = placeholder_will(will, stored, v5=connect.v5)
        self.services.metrics.offloaded.inc()
        return connect_with_will(connect, props, body)
