"""Byte ranges of an offloaded payload, reading only the stored bytes that hold them.

:meth:`client.Client.fetch_range` (and `offload fetch --range`, :mod:`client.commands._range`).
A plain payload's range is one HTTP Range request for those bytes. An age file's range is of
its plaintext: the header is read first (:data:`HEADER_READ` bytes, more only for a header
that long), then exactly the 64 KiB chunks that hold the range, each authenticated and
decrypted on its own (:class:`client.protocol._age.OpenedHeader`): a few hundred KiB of a
multi-GiB object cross the network and the cipher, not the object. A compressed payload has
no plaintext offsets to seek to: fetch it whole.

What is checked: an encrypted range chunk by chunk (ChaCha20-Poly1305 under the file key the
header's MAC vouches for: a changed byte is a :class:`DecryptionFailed`), and every answer's
`Content-Range` against the placeholder's size. A plain range cannot be checked against the
placeholder's SHA-256, which covers the whole object only.

Redirects (a gateway with direct transfers answers 307 to a presigned store URL, which
honours Range) are followed as by a whole fetch: to the URL's own origin or one the caller
allows, never with credentials.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import httpx

from ..core._exceptions import (
    DecryptionFailed,
    FetchError,
    MalformedPlaceholder,
    PayloadDecodeError,
    PayloadNotFound,
)
from ..core._message import Message
from ..protocol import Origin, TraceContext
from ..protocol._age import CHUNK, NONCE, Layout, OpenedHeader
from ..protocol._age_header import MAX_HEADER, Header
from ..protocol._age_keys import Identity
from ..protocol._placeholder import MAX_PLACEHOLDER_BYTES, Placeholder, is_tagged, parse
from ._answers import _detail
from ._fetching import _NO_AUTH, MAX_REDIRECTS, REDIRECTS, _origin
from ._scram import ScramFailure

#: The first read of an age file: its header (~100 bytes a recipient) and nonce.
HEADER_READ = 4096
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
_UNSATISFIED = re.compile(r"bytes \*/(\d+)")

#: Stored bytes [a, b) of the object.
Get = Callable[[int, int], bytes]


def age_range(
    get: Get,
    size: int,
    start: int,
    end: int,
    identities: Sequence[Identity],
    key_ids: tuple[str, ...] = (),
    head: bytes = b"",
) -> tuple[bytes, int]:
    """Plaintext [start, end) of the `size`-byte age file `get` reads, and the stored bytes
    read for it (`head`: the object's first bytes, already read).

    Raises:
        NoMatchingIdentity: no identity opens the header.
        DecryptionFailed: a malformed header, or a damaged or truncated chunk.
    """
    read = 0
    want = min(size, HEADER_READ)
    if len(head) < want:
        head = get(0, want)
        read += len(head)
    header = Header.parse(head)
    if header is None or len(head) < header.length + NONCE:  # a long header: read the rest
        more = get(len(head), min(size, MAX_HEADER + NONCE))
        head, read = head + more, read + len(more)
        header = Header.parse(head)
    if header is None or len(head) < header.length + NONCE:
        raise DecryptionFailed("age file truncated inside its header")
    nonce = head[header.length : header.length + NONCE]
    opened = OpenedHeader(header, nonce, identities, key_ids)
    layout = Layout.of(header.length, size)
    if start >= min(end, layout.plain_size):
        return b"", read
    a, b, first = layout.span(start, end)
    sealed = head[a:b] if b <= len(head) else get(a, b)
    read += 0 if b <= len(head) else len(sealed)
    if len(sealed) != b - a:
        raise DecryptionFailed("age file truncated: a chunk is missing")
    plain = opened.open_run(first, sealed, layout)
    offset = start - first * CHUNK
    return plain[offset : offset + min(end, layout.plain_size) - start], read


class RangeReader:
    """Reads stored byte ranges of one payload URL over an httpx client.

    Args:
        http: the client (the transport's reader).
        url: the raw payload URL.
        size: the object's size (the placeholder's): every answer must agree. None when
            not known (`offload fetch URL --range`): :meth:`first` learns it.
        auth: credentials, only when the URL may receive them.
        redirect_ok: which other origins a redirect may lead to.
        trace: the fetch's trace context: its headers go to the URL itself, never to a
            redirect's target (a presigned store URL), as every fetch's do.
    """

    def __init__(
        self,
        http: httpx.Client,
        url: str,
        size: int | None,
        *,
        auth: httpx.Auth | None,
        redirect_ok: Callable[[Origin], bool] | None,
        trace: TraceContext | None = None,
    ) -> None:
        self._http = http
        self._url = url
        self._size = size
        self._auth = auth
        self._redirect_ok = redirect_ok
        self._trace = dict(trace.pairs()) if trace is not None else {}

    @property
    def size(self) -> int | None:
        """The object's size: given, or learnt by :meth:`first`."""
        return self._size

    def first(self, a: int, b: int) -> bytes:
        """Stored bytes [a, b) of an object whose size is not known yet, fewer where it ends
        first (none from its end on); its size is :attr:`size` from then on.

        Raises:
            As :meth:`get`.
        """
        return self._exchange(a, b)

    def get(self, a: int, b: int) -> bytes:
        """Stored bytes [a, b) (`0 <= a < b <= size`), exactly those.

        Raises:
            PayloadNotFound: 404 or 410.
            FetchError: no answer, another status, a redirect refused, an answer that is
                not exactly the range asked for.
        """
        if self._size is None:
            raise ValueError("the object's size is not known: read its first range first")
        return self._exchange(a, b)

    def _exchange(self, a: int, b: int) -> bytes:
        url = self._url
        home = _origin(url, httpx.URL(url))
        request = self._request(httpx.URL(url), a, b)
        request.headers.update(self._trace)
        auth = self._auth or httpx.USE_CLIENT_DEFAULT
        try:
            for _ in range(MAX_REDIRECTS + 1):
                response = self._http.send(request, stream=True, auth=auth)
                try:
                    location = response.headers.get("Location")
                    if response.status_code in REDIRECTS and location is not None:
                        target = response.url.join(location)
                        origin = _origin(url, target)
                        if origin != home and not (self._redirect_ok and self._redirect_ok(origin)):
                            raise FetchError(url, f"redirect to {origin} refused")
                        request, auth = self._request(target, a, b), _NO_AUTH
                        request.headers.pop("Cookie", None)
                        continue
                    return self._body(response, a, b)
                finally:
                    response.close()
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            raise FetchError(url, f"range fetch failed: {exc!r}") from exc
        except ScramFailure as exc:
            raise FetchError(url, str(exc), 401) from exc
        raise FetchError(url, f"more than {MAX_REDIRECTS} redirects")

    def _request(self, target: httpx.URL, a: int, b: int) -> httpx.Request:
        headers = {"Range": f"bytes={a}-{b - 1}", "Accept-Encoding": "identity"}
        return self._http.build_request("GET", target, headers=headers)

    def _body(self, response: httpx.Response, a: int, b: int) -> bytes:
        url, status = self._url, response.status_code
        if status in (404, 410):
            raise PayloadNotFound(url, _detail(response), status)
        if status == 200:  # the whole object: never read for a range
            raise FetchError(url, "the server ignored the Range request (200, not 206)", status)
        if status == 416 and self._size is None:  # from the end on: nothing, and the size
            unsatisfied = _UNSATISFIED.fullmatch(response.headers.get("content-range", ""))
            if unsatisfied is None or int(unsatisfied[1]) > a:
                raise FetchError(url, f"416 to bytes={a}-{b - 1} without a size past which {a} is")
            self._size = int(unsatisfied[1])
            return b""
        if status != 206:
            raise FetchError(url, _detail(response), status)
        match = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", ""))
        if match is None:
            raise FetchError(url, f"no Content-Range answers bytes={a}-{b - 1}")
        first, end, total = int(match[1]), int(match[2]) + 1, int(match[3])
        size = total if self._size is None else self._size  # learnt from the first answer
        if (first, end, total) != (a, min(b, size), size):
            raise FetchError(url, f"Content-Range does not answer bytes={a}-{b - 1}/{size}")
        self._size, b = size, end
        body = bytearray()
        for piece in response.iter_raw():
            body += piece
            if len(body) > b - a:
                raise FetchError(url, "body runs past the range asked for: cut off")
        if len(body) != b - a:
            raise FetchError(url, f"body ends after {len(body)} of {b - a} bytes")
        return bytes(body)


def as_placeholder(value: Placeholder | Message) -> Placeholder:
    """`value`, or the placeholder a message delivered as it is carries.

    Raises:
        MalformedPlaceholder: the message is not a placeholder, or an unreadable one.
    """
    if isinstance(value, Placeholder):
        return value
    if value.size > MAX_PLACEHOLDER_BYTES or not is_tagged(value.payload, value.properties):
        raise MalformedPlaceholder(f"the message on {value.topic!r} is not a placeholder")
    return parse(value.payload, value.properties)


def payload_range(
    reader: RangeReader,
    ref: Placeholder,
    start: int,
    end: int,
    identities: Sequence[Identity],
) -> bytes:
    """Payload bytes [start, end) of the object `ref` points at (see the module docstring).

    Raises:
        PayloadDecodeError: a compressed payload, no identity, a damaged object.
        FetchError: as :meth:`RangeReader.get`.
    """
    if ref.encoding.compressed:
        raise PayloadDecodeError("a range of a compressed payload: fetch it whole")
    if ref.encoding.encrypted:
        return age_range(reader.get, ref.size, start, end, identities, ref.encoding.key_ids)[0]
    end = min(end, ref.size)
    return reader.get(start, end) if start < end else b""
