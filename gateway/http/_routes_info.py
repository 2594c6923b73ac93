"""`GET /`: what this gateway is, as the discovery record it advertises, plus links.

A client configured with an `endpoint` (no discovery topic) still needs what the record
says, above all the store origin that payload redirects lead to (`DirectStore`): it reads
it here, once, from the gateway its user named (client/http/_store_origin.py). The record is
built by :func:`advertised_record`, the one function the discovery advertiser uses too
(gateway/_app.py), so the topic and this route cannot disagree. The answer is public, as
the retained record on the broker is: no credentials, no secrets, nothing per caller.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request

from discovery import DiscoveryRecord

from ..core import JSONAnswer
from ._context import Context, Ctx
from ._responses import GatewayInfo

router = APIRouter(tags=["operations"])

#: Lifespan state key: the SASL mechanisms the gateway offers (set by gateway/_app.py).
MECHANISMS_KEY = "offload_auth_mechanisms"


def advertised_record(ctx: Context, mechanisms: tuple[str, ...], endpoint: str) -> DiscoveryRecord:
    """The discovery record this gateway advertises for `endpoint`.

    Args:
        ctx: the gateway's services (settings, direct transfers).
        mechanisms: the SASL mechanisms its authenticator offers.
        endpoint: the URL clients are told to use.
    """
    return DiscoveryRecord(
        endpoint,
        max_upload_bytes=ctx.settings.max_body_bytes,
        auth_mechanisms=mechanisms,
        direct_store=ctx.direct.public_url,
    )


@router.get(
    "/",
    response_model=GatewayInfo,
    responses={
        200: {
            "description": "the discovery record (LargeMessageUploadEndpoint, "
            "OffloadProtocolVersion, MaxUploadBytes, AuthMechanisms, DirectStore) and links"
        }
    },
)
async def gateway_info(request: Request, ctx: Ctx) -> JSONAnswer:
    """This gateway's discovery record, the one it publishes on the discovery topic, and links.

    `links` names the API documentation (`docs`), the OpenAPI document (`openapi`) and the
    liveness probe (`health`). Readers of the record ignore keys they do not know.
    """
    endpoint = ctx.public_url or str(request.base_url).rstrip("/")
    mechanisms: tuple[str, ...] = getattr(request.state, MECHANISMS_KEY, ())
    doc: dict[str, Any] = json.loads(advertised_record(ctx, mechanisms, endpoint).to_json())
    doc["links"] = {
        "docs": f"{endpoint}/docs",
        "openapi": f"{endpoint}/openapi.json",
        "health": f"{endpoint}/healthz",
    }
    return JSONAnswer(doc)
