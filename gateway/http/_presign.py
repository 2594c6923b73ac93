"""Presigned, expiring download URLs for one message's raw payload.

    POST /msg/{id}/presign?ttl=SECONDS   (needs read access to the message's topic)
    -> {"url": ".../msg/{id}/payload?expires=<unix>&sig=<hmac>", "expires": <unix>}

Anyone holding the URL - a browser, a Lambda-style function without broker credentials -
can GET or HEAD that one payload until it expires. The signature is an HMAC-SHA256 over the
path and the expiry, keyed with a key derived from `OFFLOAD_AUTH_SECRET`; an altered id,
path or expiry, an expired URL, or a malformed `sig` or `expires`, is refused with 403 and
a reason. Without the secret each process draws
a random key: URLs then work only on the replica that signed them (and not after a restart),
so replicas behind one load balancer need the same `OFFLOAD_AUTH_SECRET`.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from client.protocol import MessageId, Topic

from ..core import COMMON_RESPONSES, Forbidden, JSONAnswer
from ._context import Authorizer, Ctx
from ._ingest import message_url
from ._responses import Presigned
from ._signing import UrlSigner

__all__ = ["SignedUrls", "UrlSigner", "payload_path_suffix", "router"]

log = logging.getLogger("gateway")

router = APIRouter()


class SignedUrls:
    """An `Authorizer` that lets a valid signature stand in for credentials on reads.

    Requests carrying `sig` or `expires` are judged by the signature alone (403 when it does
    not hold, whether or not other credentials came along); the rest go to `inner`.

    Args:
        signer: checks the signatures.
        inner: the credential-based authorizer; None when the gateway has no auth.
    """

    def __init__(self, signer: UrlSigner, inner: Authorizer | None) -> None:
        self.signer = signer
        self.inner = inner

    async def authorize(self, request: Request, topic: Topic, *, write: bool) -> None:
        query = request.query_params
        if "sig" in query or "expires" in query:
            message_id = request.path_params.get("message_id", "")
            suffix = payload_path_suffix(str(message_id))
            if write or request.method not in ("GET", "HEAD"):
                raise Forbidden("a presigned URL only grants GET and HEAD")
            if not request.url.path.endswith(suffix):
                raise Forbidden("a presigned URL only grants /msg/{id}/payload")
            if len(query.getlist("sig")) > 1 or len(query.getlist("expires")) > 1:
                raise Forbidden("presigned URL: `sig` and `expires` may appear once each")
            problem = self.signer.problem(
                suffix, query.get("expires", ""), query.get("sig", ""), now=time.time()
            )
            if problem is not None:
                raise Forbidden(problem)
            return
        if self.inner is not None:
            await self.inner.authorize(request, topic, write=write)

    async def authenticate(self, request: Request) -> str | None:
        """The inner authorizer's answer; a signed request is judged by `authorize` alone."""
        query = request.query_params
        if self.inner is None or "sig" in query or "expires" in query:
            return None
        return await self.inner.authenticate(request)


def payload_path_suffix(message_id: str) -> str:
    # Signed over the app-relative path, so a proxy prefix (public_url's path) does not matter.
    return f"/msg/{message_id}/payload"


@router.post(
    "/msg/{message_id}/presign",
    tags=["offload"],
    response_model=Presigned,
    responses={**COMMON_RESPONSES, 400: {"description": "malformed id or ttl"}},
)
async def presign(
    message_id: str,
    request: Request,
    ctx: Ctx,
    ttl: Annotated[int | None, Query(ge=1, description="seconds the URL stays valid")] = None,
) -> Response:
    """A URL that fetches this message's payload without credentials until it expires."""
    message = MessageId.parse(message_id)
    await ctx.authenticate(request)  # before the lookup: no 401/404 oracle for unknown callers
    manifest = await ctx.service.load(message)
    await ctx.authorize_read(request, manifest.topic)
    limit = ctx.settings.presign_max_ttl
    seconds = min(ttl or limit, limit)
    expires = int(time.time()) + seconds
    if manifest.expires is not None:  # never outlive the message itself
        expires = min(expires, manifest.expires // 1000)
    query = ctx.signer.sign(payload_path_suffix(str(manifest.id)), expires)
    url = f"{message_url(ctx, request, manifest.id)}/payload?{query}"
    body: dict[str, Any] = {"url": url, "expires": expires}
    return JSONAnswer(body, headers={"Cache-Control": "no-store"})
