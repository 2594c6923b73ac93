"""What the gateway or store answered, read defensively: bounded error bodies, statuses, checks.

Shared by the proxied transport (:mod:`client.http._transport`) and direct transfers
(:mod:`client.http._direct`): an answer is untrusted input, so an error body is read only up to
:data:`MAX_ERROR_BODY` bytes, a content coding is refused, and a payload is handed on only
when its size and SHA-256 are the declared ones.
"""

from __future__ import annotations

import json

import httpx

from ..core._exceptions import FetchError, PayloadChecksumMismatch, PayloadNotFound, UploadError
from ..core._message import Payload
from ..protocol import loads_object

#: Most bytes of an error response read to find its `detail`.
MAX_ERROR_BODY = 65536


class TransientFetchError(FetchError):
    """A fetch failure that may pass: no connection, a reset, a timeout, a 5xx or a 429.

    The receiver retries these for `fetch_retry_for` seconds (a gateway or store restart)
    before reporting them; every other FetchError is final at once.
    """


#: Statuses a restarting gateway or store answers for a moment.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


_AUTH_HINTS = {
    401: "the gateway refused the credentials (or none were sent)",
    403: "authenticated, but not allowed this topic",
}


def _bounded_body(response: httpx.Response) -> bytes:
    """At most MAX_ERROR_BODY bytes of a response body, read or streamed."""
    try:
        return response.content[:MAX_ERROR_BODY]
    except httpx.ResponseNotRead:
        pass
    body = b""
    for piece in response.iter_raw():
        body += piece
        if len(body) >= MAX_ERROR_BODY:
            break
    return body[:MAX_ERROR_BODY]


def _detail(response: httpx.Response) -> str:
    status = response.status_code
    text = f"HTTP {status}"
    try:
        raw = _bounded_body(response)
        doc = json.loads(raw) if raw[:1] == b"{" else None
    except (ValueError, RecursionError, httpx.HTTPError, httpx.StreamError):
        doc = None
    if isinstance(doc, dict) and "detail" in doc:
        text = f"{text}: {str(doc['detail'])[:500]}"
    if status in _AUTH_HINTS:
        text = f"{text} ({_AUTH_HINTS[status]})"
    return text


def _check_status(url: str, response: httpx.Response) -> None:
    """Refuse every answer but 200, with the endpoint's reason (bounded)."""
    if response.status_code in (404, 410):
        raise PayloadNotFound(url, _detail(response), response.status_code)
    if response.status_code in TRANSIENT_STATUSES:
        raise TransientFetchError(url, _detail(response), response.status_code)
    if response.status_code != 200:
        raise FetchError(url, _detail(response), response.status_code)
    coding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if coding not in ("", "identity"):
        raise FetchError(url, f"refused Content-Encoding {coding[:50]!r}")


def _verified(
    url: str,
    payload: Payload,
    actual: str,
    expected_size: int | None,
    expected_sha256: str | None,
    received: int | None = None,
) -> Payload:
    """The payload when its size and SHA-256 are the declared ones; else discarded, raised.

    Args:
        received: the body's size when the payload does not hold it (a fetch that was
            only tapped); else the payload's size.
    """
    got = payload.size if received is None else received
    if expected_size is not None and got < expected_size:
        payload.discard()  # the connection ended early (a restart): worth another try
        raise TransientFetchError(url, f"size mismatch: expected {expected_size}, got {got}")
    if expected_size is not None and got != expected_size:
        payload.discard()
        raise FetchError(url, f"size mismatch: expected {expected_size}, got {got}")
    if expected_sha256 is not None and actual != expected_sha256:
        payload.discard()
        raise PayloadChecksumMismatch(url, expected_sha256, actual)
    return payload


#: The largest 201 answer to a raw upload read for its `sha256`.
MAX_RECEIPT_BYTES = 64 * 1024


def _same_digest(url: str, response: httpx.Response, sha256: str) -> None:
    """The gateway's `sha256` for what it stored must be the one the client sent.

    Raises:
        UploadError: another digest (damaged on the way: the placeholder would point at
            bytes no reader accepts), or an answer without one.
    """
    try:
        answer = loads_object(response.content, max_bytes=MAX_RECEIPT_BYTES)
    except ValueError as exc:
        raise UploadError(url, f"unreadable upload answer: {exc}") from exc
    if answer.get("sha256") != sha256:
        raise UploadError(
            url, f"the gateway stored bytes hashing to {str(answer.get('sha256'))[:64]!r}, "
            f"not the {sha256} sent: damaged on the way"
        )  # fmt: skip
