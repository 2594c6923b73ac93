"""The two wire forms of an upload: raw `PUT /msg/<id>` first, hop's BSON document as fallback.

Request builders without I/O for :meth:`client.http._transport.HttpTransport.upload`, which
sends them.
The raw form carries the payload bytes as they are, so a payload of any size fits; the BSON
document (what hop-client sends, `POST /topic/<t>+oversized`) is capped at 2 GiB by the
format's signed 32-bit length and is used only where the raw form cannot go:

* the gateway predates the raw route: it answers 404, 405 or 415 (:data:`UNSUPPORTED`);
* the stored headers (the message's user properties) are too large for HTTP header fields:
  proxies and servers commonly refuse more than 8 KiB of them (:data:`HEADER_BUDGET`).

A payload over the BSON cap with either of those is an UploadError that says why.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import quote, quote_from_bytes

from ..core._exceptions import ProtocolError, UploadError
from ..core._source import PIECE, PayloadSource
from ..protocol import MessageId
from ..seal._seal import SealedStream

#: Statuses of a gateway without `PUT /msg/<id>`: no route (404), a route for other methods
#: only (405: FastAPI's answer, since `GET /msg/<id>` exists), or the body refused (415).
UNSUPPORTED = frozenset({404, 405, 415})
#: Most bytes of `X-Offload-Header` fields the client sends: nginx's default buffer for one
#: header line and a common total limit; more goes as a BSON document (when it fits).
HEADER_BUDGET = 8 * 1024
#: The largest payload a BSON upload document can carry: the document's length is a signed
#: 32-bit integer and holds the headers too, so the exact bound is checked when encoding.
BSON_PAYLOAD_LIMIT = 2**31 - 1
#: Above this size, the client asks `OPTIONS /msg/<id>` before the first raw upload to an
#: endpoint: an old gateway reads and drops up to 16 MiB of a refused body before its 405
#: (gateway/middleware/_drain.py); a larger body would be sent for nothing, then again as BSON.
PROBE_ABOVE = 16 * 1024 * 1024
RAW_CONTENT_TYPE = "application/octet-stream"
BSON_TYPE = "application/bson"


@dataclass(frozen=True, slots=True)
class UploadRequest:
    """One upload request, ready to send; `body` streams the payload from its source."""

    method: str
    url: str
    body: Iterator[bytes]
    headers: list[tuple[str, str]]
    params: dict[str, str | int]


def _quote_level(level: str) -> str:
    # `.` and `..` levels are RFC 3986 dot segments: httpx (like any URL library) would
    # remove them, so `a/../b` would reach the gateway as `b`. Percent-encoded dots are
    # not dot segments, and the gateway decodes them back into the topic's own levels.
    if level in (".", ".."):
        return level.replace(".", "%2E")
    return quote(level, safe="")


def topic_path(topic: str) -> str:
    """The topic as URL path segments: each level percent-encoded, `.` and `..` kept.

    Every level travels as it is (they are ordinary MQTT levels).
    """
    return "/".join(_quote_level(level) for level in topic.split("/"))


def upload_url(endpoint: str, topic: str) -> str:
    """`{endpoint}/topic/{topic}+oversized`, each topic level percent-encoded."""
    return f"{endpoint.rstrip('/')}/topic/{topic_path(topic)}+oversized"


def raw_upload_url(endpoint: str, message_id: MessageId) -> str:
    """`{endpoint}/msg/{id}`: the message's own URL, which the raw upload creates."""
    return f"{endpoint.rstrip('/')}/msg/{message_id}"


def header_fields(headers: Sequence[tuple[str, bytes]]) -> list[str]:
    """The stored headers as `X-Offload-Header` values: `NAME=VALUE`, percent-encoded."""
    return [f"{quote(name, safe='')}={quote_from_bytes(value, safe='')}" for name, value in headers]


def fits_headers(fields: Sequence[str]) -> bool:
    """Whether the encoded header fields stay within :data:`HEADER_BUDGET`."""
    return sum(len(field) + len("X-Offload-Header: \r\n") for field in fields) <= HEADER_BUDGET


def allows_put(status: int, allow: str | None) -> bool | None:
    """What an `OPTIONS /msg/<id>` answer says about the raw route; None: it does not say."""
    if status in UNSUPPORTED:
        return False
    if 200 <= status < 300 and allow is not None:
        return "PUT" in {method.strip().upper() for method in allow.split(",")}
    return None


def raw_request(
    endpoint: str,
    topic: str,
    source: PayloadSource | SealedStream,
    message_id: MessageId,
    fields: list[str],
    ttl: int | None,
) -> UploadRequest:
    """`PUT {endpoint}/msg/{id}?topic=&ttl=`, the payload as the body, headers as fields.

    The topic travels as a query parameter (httpx percent-encodes it whole, `/` included).
    A :class:`SealedStream`'s SHA-256 is known only once it is sent: no `X-Offload-Sha256`
    then (the caller compares the gateway's answer instead).
    """
    params: dict[str, str | int] = {"topic": topic}
    if ttl:
        params["ttl"] = ttl
    headers = [("Content-Type", RAW_CONTENT_TYPE), ("Content-Length", str(source.size))]
    if isinstance(source, PayloadSource):
        # The gateway checks the bytes it got against it: damage on the way is a 400.
        headers.append(("X-Offload-Sha256", source.sha256))
    headers += [("X-Offload-Header", field) for field in fields]
    url = raw_upload_url(endpoint, message_id)
    return UploadRequest("PUT", url, source.pieces(PIECE), headers, params)


def bson_request(
    endpoint: str,
    topic: str,
    source: PayloadSource | SealedStream,
    message_id: MessageId,
    headers: Sequence[tuple[str, bytes]],
    ttl: int | None,
) -> UploadRequest:
    """hop-client's `POST /topic/{topic}+oversized`, the document built around the payload.

    Raises:
        UploadError: the document cannot be built (too large for BSON, a bad header).
    """
    from ..protocol._envelope import encode_upload  # only old gateways need the codec

    url = upload_url(endpoint, topic)
    try:
        head, tail = encode_upload(source.size, headers=[("_id", message_id.bytes), *headers])
    except ProtocolError as exc:
        raise UploadError(url, f"cannot build upload document: {exc}") from exc

    def body() -> Iterator[bytes]:
        yield head
        yield from source.pieces(PIECE)
        yield tail

    length = len(head) + source.size + len(tail)
    request_headers = [("Content-Type", BSON_TYPE), ("Content-Length", str(length))]
    return UploadRequest("POST", url, body(), request_headers, {"ttl": ttl} if ttl else {})
