"""What every request handler gets: settings, the service, the broker link, auth checks.

One frozen value, built once in the lifespan by `gateway._app.build_context`. Routes take
one dependency per resource they use (`gateway.http._deps`: `Service`, `Access`, `AppSettings`,
`Uploads`, `BrokerLink`, `DirectTransfers`); `Ctx`, defined here once, hands out the whole
value to the few that pass it on (the ingest pipeline). It has
no Optional services: a gateway without a broker holds `NoBroker`, which says why nothing can
be published, and the authorizer is always there (it refuses or admits by configuration).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Annotated, Protocol
from urllib.parse import urlsplit

from fastapi import Depends, Request

from client.protocol import PublishProperties, Topic

from ..core import Settings
from ..direct import Direct
from ..ingest import OffloadService, Quotas
from ..retention import Retention
from ..tus import ResumableUploads
from ._signing import UrlSigner


class Authorizer(Protocol):
    """Checks a request's identity against the topic rules (see gateway.auth)."""

    async def authorize(self, request: Request, topic: Topic, *, write: bool) -> None: ...

    async def authenticate(self, request: Request) -> str | None:
        """Who sent the request (401/429 otherwise), before its topic is known; None: anonymous.

        Decided once per request: `authorize` afterwards reuses it.
        """
        ...


class Broker(Protocol):
    """The broker link the gateway publishes placeholders and its discovery record through."""

    @property
    def broker(self) -> object: ...

    @property
    def connected(self) -> bool: ...

    @property
    def max_packet_size(self) -> int | None:
        """The broker's Maximum Packet Size from its CONNACK; None when it states none."""

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 1,
        retain: bool = False,
        properties: PublishProperties | None = None,
    ) -> Future[None]: ...

    def on_connected(self, callback: Callable[[], None]) -> None: ...

    def start(self) -> None: ...

    def close(self) -> None: ...


class NoBroker:
    """The broker of a gateway with no `OFFLOAD_MQTT_URL`: never connected, publishes nothing.

    Routes that must publish refuse with 503 before reading a body (`require_broker`), and
    /readyz leaves the broker out of its checks.
    """

    broker = "no broker configured (OFFLOAD_MQTT_URL)"
    connected = False
    max_packet_size = None

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 1,
        retain: bool = False,
        properties: PublishProperties | None = None,
    ) -> Future[None]:
        future: Future[None] = Future()
        future.set_exception(ConnectionError(self.broker))
        return future

    def on_connected(self, callback: Callable[[], None]) -> None:
        """Nothing to connect to, so nothing to call back."""

    def start(self) -> None:
        """Nothing to start."""

    def close(self) -> None:
        """Nothing to close."""


@dataclass(frozen=True, slots=True)
class Context:
    """The gateway's services, built once per application (see `gateway._app`)."""

    settings: Settings
    service: OffloadService
    broker: Broker
    authorizer: Authorizer
    uploads: ResumableUploads  # HTTP publish extras (issue 4): resumable uploads
    signer: UrlSigner  # and presigned-URL signing
    quotas: Quotas  # per-user caps on open uploads (gateway/ingest/_quotas.py)
    retention: Retention  # groups, one object per payload, stored-bytes quotas
    public_url: str = ""  # the endpoint URL clients are told; "": the request's own
    # Direct transfers (gateway/direct/_transfers.py): always there, off unless a public store
    # URL is set.
    direct: Direct = field(default_factory=lambda: Direct.off("direct transfers are off"))

    @property
    def base_path(self) -> str:
        return urlsplit(self.public_url).path.rstrip("/") if self.public_url else ""

    async def authorize_write(self, request: Request, topic: Topic) -> None:
        await self.authorizer.authorize(request, topic, write=True)

    async def authorize_read(self, request: Request, topic: Topic) -> None:
        await self.authorizer.authorize(request, topic, write=False)

    async def authenticate(self, request: Request) -> str | None:
        return await self.authorizer.authenticate(request)


async def get_context(request: Request) -> Context:
    ctx: Context = request.state.ctx
    return ctx


Ctx = Annotated[Context, Depends(get_context)]
