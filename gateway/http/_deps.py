"""One FastAPI dependency per resource a route uses, so a handler's signature says what it needs.

`Ctx` (``gateway.http._context``) hands out the whole services object; the aliases here hand out
one part of it each, the way starlette and FastAPI's own docs do (`SettingsDep`): a route
that only reads the store takes `Service`, one that only answers with limits takes
`AppSettings`, and a test or a reader sees at a glance what a handler can touch. They all
resolve through `get_context`, so `app.dependency_overrides[get_context]` still replaces
everything at once.

`Access` is the caller's identity as routes need it: the topic is known only once the request
is parsed (often only once the stored message is loaded), so authentication cannot run before
the handler. `Access` checks on demand and returns the authenticated principal, instead of
handlers reading what the authorizer left in ``request.state`` by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from client.protocol import Topic

from ..core import Settings
from ..direct import Direct
from ..ingest import OffloadService
from ..tus import ResumableUploads
from ._authz import principal_of
from ._context import Authorizer, Broker, Ctx


@dataclass(frozen=True, slots=True)
class TopicAccess:
    """The caller's rights on topics, checked when the handler knows the topic."""

    request: Request
    authorizer: Authorizer

    async def authenticate(self) -> str | None:
        """Authenticate the caller (401/429 otherwise) before any topic is known.

        For resources that belong to a principal: whose they are is checked before the
        topic, so that another principal's resource looks like none at all.
        """
        return await self.authorizer.authenticate(self.request)

    async def read(self, topic: Topic) -> str | None:
        """Admit the caller to read `topic` (401/403/429 otherwise); its user, None if anonymous.

        Args:
            topic: the topic of the message to be read.
        """
        await self.authorizer.authorize(self.request, topic, write=False)
        return principal_of(self.request)

    async def write(self, topic: Topic) -> str | None:
        """Admit the caller to write `topic` (401/403/429 otherwise); its user, None if anonymous.

        Args:
            topic: the topic of the message to be written.
        """
        await self.authorizer.authorize(self.request, topic, write=True)
        return principal_of(self.request)


async def _settings(ctx: Ctx) -> Settings:
    return ctx.settings


async def _service(ctx: Ctx) -> OffloadService:
    return ctx.service


async def _uploads(ctx: Ctx) -> ResumableUploads:
    return ctx.uploads


async def _broker(ctx: Ctx) -> Broker:
    return ctx.broker


async def _direct(ctx: Ctx) -> Direct:
    return ctx.direct


async def _access(request: Request, ctx: Ctx) -> TopicAccess:
    return TopicAccess(request, ctx.authorizer)


#: The settings the application was built with (not re-read from the environment).
AppSettings = Annotated[Settings, Depends(_settings)]
#: The offload service: manifests and payloads in the object store.
Service = Annotated[OffloadService, Depends(_service)]
#: The resumable (tus) uploads.
Uploads = Annotated[ResumableUploads, Depends(_uploads)]
#: The broker link (`NoBroker` on a gateway without one).
BrokerLink = Annotated[Broker, Depends(_broker)]
#: Direct transfers (grants, commits, download redirects); `Direct.off` unless configured.
DirectTransfers = Annotated[Direct, Depends(_direct)]
#: Topic authorization for this request, returning the authenticated principal.
Access = Annotated[TopicAccess, Depends(_access)]

__all__ = [
    "Access",
    "AppSettings",
    "BrokerLink",
    "DirectTransfers",
    "Service",
    "TopicAccess",
    "Uploads",
]
