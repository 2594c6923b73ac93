"""asyncio face of the blocking :class:`Client`: same behaviour, run on worker threads.

Not a second implementation: every call goes to the blocking core through
`asyncio.to_thread`, so routing, offload, chunking and fetching behave exactly the same.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Unpack

import httpx

from ._client import Client
from ._config import ClientSettings, SettingsOverrides
from ._http import HttpTransport
from ._message import PublishResult
from ._receive import Delivery
from ._source import PayloadLike
from .protocol import PublishProperties

# How long one executor thread waits for a delivery before checking back with the event
# loop: bounds how long a cancelled `async for` keeps a thread busy.
_POLL = 0.25


class AsyncClient:
    """The asyncio client (`async with`, `await publish`, `async for` over messages).

    Args:
        broker: `mqtt[s]://[user:pass@]host[:port]`.
        settings: a complete settings object; keyword overrides apply on top.
        transport: the HTTP transport to the gateway.
        http_auth: credentials for the gateway, sent only to the advertised endpoint.
        **overrides: any :class:`ClientSettings` field.
    """

    def __init__(
        self,
        broker: str | None = None,
        *,
        settings: ClientSettings | None = None,
        transport: HttpTransport | None = None,
        http_auth: httpx.Auth | None = None,
        **overrides: Unpack[SettingsOverrides],
    ) -> None:
        self.sync = Client(
            broker, settings=settings, transport=transport, http_auth=http_auth, **overrides
        )

    @classmethod
    def from_config(
        cls,
        broker: str | None = None,
        *,
        config_file: str | os.PathLike[str] | None = None,
        **overrides: Unpack[SettingsOverrides],
    ) -> AsyncClient:
        """Like :meth:`Client.from_config` (reads the environment and config file).

        Args:
            broker: broker URL.
            config_file: TOML file instead of the default.
            **overrides: settings that win over every other layer.
        """
        self = cls.__new__(cls)
        self.sync = Client.from_config(broker, config_file=config_file, **overrides)
        return self

    @property
    def max_packet_size(self) -> int:
        return self.sync.max_packet_size

    @property
    def endpoint(self) -> str | None:
        return self.sync.endpoint

    async def connect(self, timeout: float = 10.0) -> None:
        """Connect (see :meth:`Client.connect`)."""
        await asyncio.to_thread(self.sync.connect, timeout)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def publish(
        self,
        topic: str,
        payload: PayloadLike,
        *,
        qos: int = 0,
        retain: bool = False,
        properties: PublishProperties | None = None,
        timeout: float | None = 60.0,
    ) -> PublishResult:
        """Publish a message of any size (see :meth:`Client.publish`).

        Args:
            topic: topic name.
            payload: bytes, text, a binary file object or a path.
            qos: 0, 1 or 2.
            retain: retain flag.
            properties: MQTT 5 properties.
            timeout: seconds to wait for acknowledgements.
        """
        return await asyncio.to_thread(
            self.sync.publish,
            topic,
            payload,
            qos=qos,
            retain=retain,
            properties=properties,
            timeout=timeout,
        )

    async def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        """Subscribe and wait for SUBACK (see :meth:`Client.subscribe`)."""
        await asyncio.to_thread(self.sync.subscribe, topic_filter, qos)

    async def unsubscribe(self, topic_filter: str) -> None:
        await asyncio.to_thread(self.sync.unsubscribe, topic_filter)

    async def messages(self, timeout: float | None = None) -> AsyncIterator[Delivery]:
        """Deliveries as they arrive (see :meth:`Client.messages`).

        Args:
            timeout: stop after this many seconds without a delivery; None: until close.
        """
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        while True:
            item = await asyncio.to_thread(self.sync.next_message, _POLL)
            if item is not None:
                idle_since = loop.time()
                yield item
                continue
            if self.sync.closed:
                return
            if timeout is not None and loop.time() - idle_since >= timeout:
                return
