"""asyncio face of the blocking :class:`Client`: same surface, run on worker threads.

Not a second implementation: every call that does I/O goes to the blocking core through
`asyncio.to_thread`, so routing, offload, chunking and fetching behave exactly the same.
`tests/test_client_surface.py` checks that every public method and property of
:class:`Client` exists here with the same parameters (a coroutine where the blocking one
waits), so the two cannot drift apart again.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Unpack

import httpx

from ._client import Client, unfinished_errors
from .config._load import load_settings
from .config._overrides import SettingsOverrides
from .config._settings import ClientSettings
from .core._message import Message, PublishResult
from .core._source import PayloadLike
from .core._tracing import TracerProviderLike, Tracing
from .http._transport import HttpTransport
from .mqtt._paho import MqttConnection
from .protocol import DiscoveryRecord, MessageId, Placeholder, PublishProperties
from .receive._fetcher import FetchProgress
from .receive._receive import Delivery

# How long one executor thread waits for a delivery before checking back with the event
# loop: bounds how long a cancelled `async for` keeps a thread busy.
_POLL = 0.25


class AsyncClient:
    """The asyncio client (`async with`, `await publish`, `async for` over messages).

    Args:
        broker: `mqtt[s]://[user:pass@]host[:port]`.
        settings: a complete settings object; keyword overrides apply on top.
        connection: the MQTT connection to use (see :class:`Client`).
        transport: the HTTP transport to the gateway.
        http_auth: credentials for the gateway, sent only to the advertised endpoint.
        on_fetch_progress: called as `(topic, bytes received, total)` while fetching (from a
            worker thread, not the event loop).
        tracer_provider: as for :class:`Client` (each call runs in a thread that has the
            caller's OpenTelemetry context: `asyncio.to_thread` copies it).
        **overrides: any :class:`ClientSettings` field.
    """

    def __init__(
        self,
        broker: str | None = None,
        *,
        settings: ClientSettings | None = None,
        connection: MqttConnection | None = None,
        transport: HttpTransport | None = None,
        http_auth: httpx.Auth | None = None,
        on_fetch_progress: FetchProgress | None = None,
        tracer_provider: TracerProviderLike | Tracing | None = None,
        **overrides: Unpack[SettingsOverrides],
    ) -> None:
        #: The blocking client every call is delegated to.
        self.sync = Client(
            broker,
            settings=settings,
            connection=connection,
            transport=transport,
            http_auth=http_auth,
            on_fetch_progress=on_fetch_progress,
            tracer_provider=tracer_provider,
            **overrides,
        )

    @classmethod
    def from_config(
        cls,
        broker: str | None = None,
        *,
        config_file: str | os.PathLike[str] | None = None,
        connection: MqttConnection | None = None,
        transport: HttpTransport | None = None,
        http_auth: httpx.Auth | None = None,
        on_fetch_progress: FetchProgress | None = None,
        tracer_provider: TracerProviderLike | Tracing | None = None,
        **overrides: Unpack[SettingsOverrides],
    ) -> AsyncClient:
        """Like :meth:`Client.from_config` (reads the environment and config file).

        Args:
            broker: broker URL.
            config_file: TOML file instead of the default.
            connection: as for the constructor.
            transport: as for the constructor.
            http_auth: as for the constructor.
            on_fetch_progress: as for the constructor.
            tracer_provider: as for the constructor.
            **overrides: settings that win over every other layer.
        """
        explicit: dict[str, object] = {"broker": broker, **overrides}
        return cls(
            settings=load_settings(explicit, environ=os.environ, config_file=config_file),
            connection=connection,
            transport=transport,
            http_auth=http_auth,
            on_fetch_progress=on_fetch_progress,
            tracer_provider=tracer_provider,
        )

    # -- state (no I/O) --------------------------------------------------------------------

    @property
    def settings(self) -> ClientSettings:
        """The settings in force."""
        return self.sync.settings

    @property
    def connection(self) -> MqttConnection:
        """The MQTT connection in use."""
        return self.sync.connection

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self.sync.closed

    @property
    def max_packet_size(self) -> int:
        """The limit in force (see :attr:`Client.max_packet_size`)."""
        return self.sync.max_packet_size

    @property
    def endpoint(self) -> str | None:
        """The offload endpoint in force (see :attr:`Client.endpoint`)."""
        return self.sync.endpoint

    @property
    def discovery_record(self) -> DiscoveryRecord | None:
        """The discovery record currently in force, if any."""
        return self.sync.discovery_record

    @property
    def discovery_refused(self) -> str | None:
        """Why the broker refused the discovery subscription, if it did (`Client`'s too)."""
        return self.sync.discovery_refused

    # -- lifecycle -------------------------------------------------------------------------

    async def connect(self, timeout: float = 10.0) -> None:
        """Connect (see :meth:`Client.connect`)."""
        await asyncio.to_thread(self.sync.connect, timeout)

    async def close(self) -> None:
        """Disconnect and end :meth:`messages` iterators (see :meth:`Client.close`)."""
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def wait_for_endpoint(self, timeout: float) -> str | None:
        """Wait for a discovery record (see :meth:`Client.wait_for_endpoint`)."""
        return await asyncio.to_thread(self.sync.wait_for_endpoint, timeout)

    # -- publishing and receiving ----------------------------------------------------------

    async def publish(
        self,
        topic: str,
        payload: PayloadLike,
        *,
        qos: int = 0,
        retain: bool = False,
        properties: PublishProperties | None = None,
        timeout: float | None = 60.0,
        message_id: MessageId | str | None = None,
    ) -> PublishResult:
        """Publish a message of any size (see :meth:`Client.publish`).

        Args:
            topic: topic name.
            payload: bytes, text, a binary file object or a path.
            qos: 0, 1 or 2.
            retain: retain flag.
            properties: MQTT 5 properties.
            timeout: seconds to wait for acknowledgements.
            message_id: the id an offloaded payload is stored under.
        """
        return await asyncio.to_thread(
            self.sync.publish,
            topic,
            payload,
            qos=qos,
            retain=retain,
            properties=properties,
            timeout=timeout,
            message_id=message_id,
        )

    async def subscribe(self, topic_filter: str, qos: int = 1, *, timeout: float = 10.0) -> None:
        """Subscribe and wait for SUBACK (see :meth:`Client.subscribe`)."""
        await asyncio.to_thread(self.sync.subscribe, topic_filter, qos, timeout=timeout)

    async def unsubscribe(self, topic_filter: str) -> None:
        """Stop receiving `topic_filter` (see :meth:`Client.unsubscribe`)."""
        await asyncio.to_thread(self.sync.unsubscribe, topic_filter)

    async def next_message(self, timeout: float | None = None) -> Delivery | None:
        """The next delivery, or None after `timeout` or close (see :meth:`Client.next_message`).

        Waits in slices of a quarter second, so a cancelled wait frees its thread soon.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = _POLL if deadline is None else min(_POLL, max(deadline - loop.time(), 0.0))
            item = await asyncio.to_thread(self.sync.next_message, left)
            if item is not None or self.sync.closed:
                return item
            if deadline is not None and loop.time() >= deadline:
                return None

    async def fetch_range(self, placeholder: Placeholder | Message, start: int, end: int) -> bytes:
        """Bytes `[start, end)` of an offloaded payload, reading only the stored bytes that
        hold them (see :meth:`Client.fetch_range`)."""
        return await asyncio.to_thread(self.sync.fetch_range, placeholder, start, end)

    async def messages(
        self, timeout: float | None = None, *, report_unfinished: bool = False
    ) -> AsyncIterator[Delivery]:
        """Deliveries as they arrive (see :meth:`Client.messages`).

        Args:
            timeout: stop after this many seconds without a delivery; None: until close.
            report_unfinished: as for :meth:`Client.messages`.
        """
        while (item := await self.next_message(timeout)) is not None:
            yield item
        if report_unfinished:
            for error in unfinished_errors(self.sync, timeout):
                yield error
