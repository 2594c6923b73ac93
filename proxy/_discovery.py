"""The gateway endpoint when none is configured: the retained discovery record on the
broker, as the client library reads it (:class:`client.protocol.DiscoveryRecord`).

One small MQTT 3.1.1 subscription of the proxy's own (credentials from
`OFFLOAD_PROXY_DISCOVERY_USERNAME` / `_PASSWORD`), reconnected with a capped back-off;
every record is hostile until `DiscoveryRecord.from_json` accepted it (size and depth
bounded before it decodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

from client.protocol import DISCOVERY_TOPIC, DiscoveryRecord, MalformedDiscoveryRecord

from ._exceptions import PeerGone, PeerTimeout
from ._settings import ProxySettings
from ._stream import PacketStream
from .protocol import (
    CONNACK,
    PUBLISH,
    ProxyProtocolError,
    connect_packet,
    publish_header,
    subscribe_packet,
)

log = logging.getLogger("proxy.discovery")

KEEPALIVE = 30
MAX_RECORD_PACKET = 32768


class Discovery:
    """The endpoint the latest valid record names (None until one came)."""

    def __init__(self, settings: ProxySettings) -> None:
        self.settings = settings
        self.endpoint: str | None = None

    async def run(self) -> None:
        delay = 0.5
        while True:
            try:
                await self._once()
                delay = 0.5
            except (OSError, TimeoutError, PeerGone, PeerTimeout, ProxyProtocolError) as exc:
                log.info("discovery link lost", extra={"why": repr(exc)})
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)

    async def _once(self) -> None:
        s = self.settings
        host, port = s.broker_address
        async with asyncio.timeout(s.connect_timeout):
            reader, writer = await asyncio.open_connection(host, port, ssl=s.broker_tls())
        try:
            password = s.discovery_password.get_secret_value() if s.discovery_password else None
            writer.write(
                connect_packet(
                    f"offload-proxy-{uuid.uuid4().hex[:12]}",
                    keepalive=KEEPALIVE,
                    username=s.discovery_username,
                    password=password,
                )
            )
            stream = PacketStream(reader, max_length=1 << 28, idle=s.idle_timeout)
            head = await stream.head(timeout=s.connect_timeout)
            if head is None or head.type != CONNACK or head.length != 2:
                raise PeerGone("no CONNACK on the discovery link")
            connack = await stream.body(head)
            if connack[1] != 0:
                raise PeerGone(f"the broker refused the discovery link ({connack[1]})")
            writer.write(subscribe_packet(1, DISCOVERY_TOPIC, 0))
            pinger = asyncio.create_task(self._ping(writer))
            try:
                await self._read(stream)
            finally:
                pinger.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pinger
        finally:
            writer.close()

    async def _ping(self, writer: asyncio.StreamWriter) -> None:
        while True:
            await asyncio.sleep(KEEPALIVE / 2)
            writer.write(b"\xc0\x00")

    async def _read(self, stream: PacketStream) -> None:
        while True:
            head = await stream.head()
            if head is None:
                raise PeerGone("the broker closed the discovery link")
            if head.type != PUBLISH or head.length > MAX_RECORD_PACKET:
                async for _ in stream.pieces(head):
                    pass
                continue
            body = await stream.body(head)
            header = publish_header(body, qos=(head.first >> 1) & 3, v5=False)
            if header is None or header.topic_text != DISCOVERY_TOPIC:
                continue
            try:
                record = DiscoveryRecord.from_json(body[header.size :])
            except MalformedDiscoveryRecord as exc:
                log.warning("discovery record refused", extra={"why": str(exc)})
                continue
            if record.endpoint.rstrip("/") != self.endpoint:
                self.endpoint = record.endpoint.rstrip("/")
                log.info("gateway endpoint", extra={"endpoint": self.endpoint})
