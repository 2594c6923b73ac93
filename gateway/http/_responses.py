"""What the routes answer on success, as the OpenAPI document (and ReDoc) shows it.

Documentation only: every route builds its own `Response` (FastAPI sends a returned
`Response` as it is, never through `response_model`), so nothing here changes a byte on
the wire. The models mirror the JSON bodies the routes write; `tests/test_openapi.py`
checks that no success response is left without a schema, and schemathesis
(`tests/test_schemathesis.py`) checks the real answers against them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Stored(BaseModel):
    """A message stored: `POST /topic/{topic}+oversized`, `PUT /msg/{id}`, `/direct/commit`."""

    id: str = Field(description="the message id (UUID)")
    url: str = Field(description="where the message is fetched: GET it for hop's BSON document")
    topic: str = Field(description="the MQTT topic it was stored for")
    size: int = Field(description="payload bytes")
    sha256: str = Field(description="SHA-256 of the payload, hex")
    created: bool = Field(description="false when the same id and content were already stored")


class Published(Stored):
    """`POST|PUT /publish/{topic}`: stored, and its placeholder published on the topic."""


class Abandoned(BaseModel):
    """`POST /direct/commit` with `{"abandon": true}`: the grant's upload is removed."""

    detail: str = Field(description="what was removed")


class Presigned(BaseModel):
    """`POST /msg/{id}/presign`: a URL that fetches the payload without credentials."""

    url: str = Field(description=".../msg/{id}/payload?expires=<unix>&sig=<hmac>")
    expires: int = Field(description="unix seconds after which the URL is refused (403)")


class UploadGrant(BaseModel):
    """`POST /direct/grant/{topic}`: presigned store URLs for the parts, and the grant."""

    grant: str = Field(description="sealed grant to send to POST /direct/commit")
    expires: int = Field(description="unix seconds the grant and its URLs stay valid until")
    part_size: int = Field(description="bytes per part (the last one shorter)")
    urls: list[str] = Field(description="one presigned PUT URL per part, in order")


class GatewayInfo(BaseModel):
    """`GET /`: the discovery record this gateway advertises, plus links."""

    LargeMessageUploadEndpoint: str = Field(description="the gateway's public URL")
    OffloadProtocolVersion: int = Field(description="the offload protocol version (1)")
    MaxUploadBytes: int | None = Field(None, description="largest payload accepted, bytes")
    AuthMechanisms: list[str] = Field([], description="SASL mechanisms offered (SCRAM-SHA-*)")
    DirectStore: str | None = Field(
        None, description="the store origin direct transfers and payload redirects lead to"
    )
    links: dict[str, str] = Field(description="`docs`, `openapi` and `health` URLs")


class Health(BaseModel):
    """`GET /healthz`: alive, and each worker pool's figures."""

    status: str = Field(description="`ok` (200) or `wedged` (503)")
    workers: dict[str, Any] = Field(description="per pool: threads, queued and running jobs")
    auth: dict[str, Any] = Field(
        {},
        description="`problems`: why a dynamic security file or JWKS in force is an older "
        "good version (the current one is unreadable or invalid); empty when all is current",
    )


class Ready(BaseModel):
    """`GET /readyz`: what the gateway depends on, one verdict each."""

    status: str = Field(description="`ready` (200) or `not ready` (503)")
    checks: dict[str, str] = Field(description="workers, storage, broker: `ok` or why not")


_BINARY = {"schema": {"type": "string", "format": "binary"}}

#: hop-client's download document (`{message, metadata}`), BSON as hop-client reads it.
BSON_DOCUMENT: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "hop-client's BSON download document `{message, metadata}`",
        "content": {"application/bson": _BINARY},
    }
}

#: A stored payload's bytes, served with the Content-Type it was stored with.
PAYLOAD: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the payload bytes (`Content-Type` as stored, else "
        "application/octet-stream); `ETag` and `X-Offload-Sha256` are its SHA-256",
        "content": {"*/*": _BINARY},
    },
    206: {
        "description": "the byte range asked for with `Range` (`Content-Range`)",
        "content": {"*/*": _BINARY},
    },
    304: {"description": "`If-None-Match` named this payload's ETag: no body"},
}


def headers_only(status: int, description: str, *names: str) -> dict[int | str, dict[str, Any]]:
    """A success answer with no body: what it says is in the named headers.

    Args:
        status: the success status.
        description: what the answer means.
        names: the response headers that carry it.
    """
    headers = {name: {"schema": {"type": "string"}} for name in names}
    return {status: {"description": description, "headers": headers}}


class Confirmed(BaseModel):
    """`POST /msg/{id}/confirm`: what a group's confirmation did."""

    id: str = Field(description="the message id")
    group: str = Field(description="the group that confirmed")
    counted: bool = Field(description="the group's confirmation is recorded (now or before)")
    remaining: list[str] = Field(description="groups that have not confirmed the message yet")
    deleted: bool = Field(description="every group confirmed: the message is deleted")
    detail: str = Field("", description="why nothing was recorded, when nothing was")


class AccountUsage(BaseModel):
    """`GET /usage`: the caller's account, as its ledger counts it."""

    user: str | None = Field(description="the account (null: anonymous callers)")
    counted: bool = Field(description="false: no quota on this gateway, nothing is counted")
    stored_bytes: int | None = Field(description="payload bytes stored, a shared one once")
    held_bytes: int | None = Field(description="bytes reserved by uploads in flight")
    limit_bytes: int | None = Field(description="OFFLOAD_MAX_STORED_BYTES_PER_USER")
