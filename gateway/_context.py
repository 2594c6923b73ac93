"""What every request handler gets: settings, the service, the broker link, auth checks.

Built once in the lifespan and handed out through `Depends(get_context)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from fastapi import Request

from client.protocol import Topic

from ._mqtt import MqttConnection
from ._resumable import ResumableUploads
from ._service import OffloadService
from ._settings import Settings

if TYPE_CHECKING:
    from ._presign import UrlSigner


class Authorizer(Protocol):
    """Checks a request's identity against the topic rules (see gateway.auth)."""

    async def authorize(self, request: Request, topic: Topic, *, write: bool) -> None: ...


@dataclass
class Context:
    settings: Settings
    service: OffloadService
    broker: MqttConnection | None = None
    authorizer: Authorizer | None = None
    public_url: str | None = None
    extras: dict[str, object] = field(default_factory=dict)
    # HTTP publish extras (issue 4): resumable uploads and presigned-URL signing.
    uploads: ResumableUploads | None = None
    signer: UrlSigner | None = None

    @property
    def base_path(self) -> str:
        return urlsplit(self.public_url).path.rstrip("/") if self.public_url else ""

    async def authorize_write(self, request: Request, topic: Topic) -> None:
        if self.authorizer is not None:
            await self.authorizer.authorize(request, topic, write=True)

    async def authorize_read(self, request: Request, topic: Topic) -> None:
        if self.authorizer is not None:
            await self.authorizer.authorize(request, topic, write=False)


def get_context(request: Request) -> Context:
    ctx: Context = request.state.ctx
    return ctx
