"""The gateway's retention calls: link before an upload, confirm after a verified fetch,
read the account's usage (docs/operations.md, "Retention by consumer group").

    POST {endpoint}/msg/{id}/link?topic=T[&ttl=N]   X-Offload-Sha256, X-Offload-Size
    POST {message url}/confirm?group=G
    GET  {endpoint}/usage

`link` asks the gateway whether the account stores the payload already (by SHA-256 and
size, as git-lfs's batch API asks): 201 commits the message with it and no payload byte is
sent; anything else (404: not stored, or a gateway that predates the route; a failure) is
an answer of "upload it", never an error of its own. `confirm` tells the gateway, for a
consumer group, that its consumer holds the payload, verified; a refusal or a failure is
logged and the payload stays until its expiry. Error bodies are read bounded, as every
answer of the gateway (:mod:`client.http._answers`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import httpx

from ..core._exceptions import UploadError
from ..protocol import MessageId
from ..protocol._tracecontext import TraceContext
from ._answers import _bounded_body
from ._scram import ScramFailure
from ._upload_forms import header_fields, raw_upload_url

log = logging.getLogger("client")

#: Statuses `link` reads as "upload it" without a word: not stored (404), or no such route
#: on an older gateway (404, 405).
NOT_LINKED = frozenset({404, 405})


def link_payload(
    http: httpx.Client,
    endpoint: str,
    topic: str,
    *,
    sha256: str,
    size: int,
    message_id: MessageId,
    headers: Sequence[tuple[str, bytes]] = (),
    auth: httpx.Auth | None = None,
    ttl: int | None = None,
    trace: TraceContext | None = None,
) -> str | None:
    """The message's URL when the gateway linked it to the account's stored copy of the
    payload (nothing to upload); None: upload it.

    Raises:
        UploadError: the gateway refused the login or the access (401/403): an upload
            would be refused alike, so the caller reports it as it would the upload's; or
            it did not answer within the client's timeout (the upload is not tried).
    """
    url = f"{raw_upload_url(endpoint, message_id)}/link"
    params: dict[str, str | int] = {"topic": topic}
    if ttl:
        params["ttl"] = ttl
    fields = [("X-Offload-Sha256", sha256), ("X-Offload-Size", str(size))]
    fields += [("X-Offload-Header", field) for field in header_fields(headers)]
    fields += list(trace.pairs()) if trace is not None else []
    try:
        status, body = _exchange(http, "POST", url, params=params, headers=fields, auth=auth)
    except httpx.TimeoutException as exc:
        # A gateway that does not answer within http_timeout would not answer the upload
        # either: waiting for it again would cost the caller its timeout twice.
        raise UploadError(url, f"the link question got no answer: {exc!r}") from exc
    except (httpx.HTTPError, ScramFailure) as exc:
        log.info("link of %s not asked (%r): uploading", message_id, exc)
        return None
    if status == 201:
        return raw_upload_url(endpoint, message_id)
    if status in (401, 403):
        raise UploadError(url, _reason(status, body), status)
    if status not in NOT_LINKED:
        log.info("link of %s: %s; uploading", message_id, _reason(status, body))
    return None


def confirm_payload(
    http: httpx.Client,
    message_url: str,
    group: str,
    *,
    auth: httpx.Auth | None = None,
    trace: TraceContext | None = None,
) -> bool:
    """Confirm the message for `group`; whether the gateway recorded it (never raises)."""
    url = f"{message_url.rstrip('/')}/confirm"
    extra = dict(trace.pairs()) if trace is not None else {}
    try:
        status, body = _exchange(
            http, "POST", url, params={"group": group}, headers=list(extra.items()), auth=auth
        )
    except (httpx.HTTPError, ScramFailure) as exc:
        log.warning("confirmation of %s for %s failed (%r): kept until it expires", url, group, exc)
        return False
    if status != 200:
        log.warning("confirmation of %s for %s refused: %s", url, group, _reason(status, body))
        return False
    doc = _object(body)
    if doc is not None and not doc.get("counted", False):
        log.warning("confirmation of %s for %s not counted: %s", url, group, doc.get("detail"))
    return True


def read_usage(
    http: httpx.Client, endpoint: str, *, auth: httpx.Auth | None = None
) -> dict[str, Any]:
    """The account's usage as the gateway answers `GET /usage`.

    Raises:
        UploadError: no answer, or another status than 200 (with the gateway's reason).
    """
    url = f"{endpoint.rstrip('/')}/usage"
    try:
        status, body = _exchange(http, "GET", url, auth=auth)
    except httpx.HTTPError as exc:
        raise UploadError(url, f"usage not read: {exc!r}") from exc
    except ScramFailure as exc:
        raise UploadError(url, str(exc), 401) from exc
    if status != 200:
        raise UploadError(url, _reason(status, body), status)
    doc = _object(body)
    if doc is None:
        raise UploadError(url, "usage: the answer is not a JSON object")
    return doc


def _exchange(
    http: httpx.Client,
    method: str,
    url: str,
    *,
    auth: httpx.Auth | None,
    params: dict[str, str | int] | None = None,
    headers: Sequence[tuple[str, str]] = (),
) -> tuple[int, bytes]:
    """One request; its status and at most MAX_ERROR_BODY bytes of its body."""
    with http.stream(
        method, url, params=params, headers=list(headers), auth=auth or httpx.USE_CLIENT_DEFAULT
    ) as response:
        return response.status_code, _bounded_body(response)


def _object(body: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _reason(status: int, body: bytes) -> str:
    doc = _object(body)
    detail = f": {str(doc['detail'])[:500]}" if doc is not None and "detail" in doc else ""
    return f"HTTP {status}{detail}"
