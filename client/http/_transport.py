"""HTTP transport to the offload gateway: streaming upload and verified, spooled fetch.

An upload is the raw payload (`PUT /msg/<id>`, any size), or hop-client's BSON document for
a gateway that predates that route (:mod:`client.http._upload_forms` decides).

The only module that imports httpx. Every httpx error crossing in becomes an
:class:`UploadError` or :class:`FetchError` carrying the URL and status. Authentication is a
seam: callers pass an `httpx.Auth` per request (:mod:`client.http._scram`: SCRAM or a bearer
token) and decide, by the credential rule, whether a URL may receive it at all; a SCRAM
failure becomes an UploadError / FetchError with status 401.

A fetch trusts nothing the endpoint says beyond the placeholder's declared size: a
Content-Length that differs is refused before the body is read, a body that runs past the
size is cut off (the connection is closed, not drained), content codings are refused (a
10-byte gzip body may inflate to gigabytes), and error bodies are read only up to
:data:`client.http._answers.MAX_ERROR_BODY` bytes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import quote

import httpx

from ..core._exceptions import (
    FetchError,
    UploadError,
)
from ..core._message import Payload
from ..core._source import PayloadSource
from ..protocol import MessageId, Origin
from ..protocol._tracecontext import TraceContext
from ..seal._seal import SealedStream
from ._answers import TransientFetchError, _check_status, _detail, _same_digest, _verified
from ._deadline import ON_SOCKET, Pace, Watchdog, counted_body, upload_watchdog
from ._fetching import (
    _NO_AUTH,
    MAX_REDIRECTS,
    REDIRECTS,
    _checked_length,
    _origin,
    read_body,
)
from ._scram import ScramFailure
from ._upload_forms import (
    BSON_PAYLOAD_LIMIT,
    HEADER_BUDGET,
    PROBE_ABOVE,
    UNSUPPORTED,
    UploadRequest,
    allows_put,
    bson_request,
    fits_headers,
    header_fields,
    raw_request,
    raw_upload_url,
)
from ._upload_forms import (
    upload_url as upload_url,  # re-exported: its home was here
)
from ._urllib3 import reader_client

log = logging.getLogger("client")


@dataclass(frozen=True, slots=True)
class UploadReceipt:
    """A stored upload: where to fetch it, and what it is."""

    message_id: MessageId
    url: str
    size: int
    sha256: str


class HttpTransport:
    """Talks to offload gateways over pooled `httpx.Client`s.

    Uploads go through httpx's own transport; fetches through a second client whose
    transport is urllib3 (:mod:`client.http._urllib3`: the same auth flows and timeouts, less
    than half the CPU per byte read; httpx's own with a proxy in the environment). A
    `client` given is used for both.

    Nothing waits for ever: each connect, read and write has `timeout`; a fetch has its
    pace; an upload's body must average :data:`client.http._deadline.UPLOAD_MIN_RATE`
    after `timeout` seconds,
    and its answer must be in, whole, `timeout` seconds after the body (a peer that takes
    or answers a byte every few seconds is cut off). The raw and BSON uploads go over
    connections of their own for that (no keep-alive), so their socket can be shut down.

    Args:
        timeout: seconds for connect and for each read/write.
        verify: TLS verification, as httpx takes it (True, False or an SSL context).
        client: an httpx client to use instead of new ones (not closed by :meth:`close`).
        bson_limit: the largest payload sent as a BSON upload document (an old gateway's
            only form); BSON's own 2 GiB by default. Lower only to test the decision.
    """

    def __init__(
        self,
        *,
        timeout: float = 60.0,
        verify: bool | ssl.SSLContext = True,
        client: httpx.Client | None = None,
        bson_limit: int = BSON_PAYLOAD_LIMIT,
    ) -> None:
        self._owned = client is None
        self._timeout = timeout
        self._client = client or httpx.Client(timeout=timeout, verify=verify)
        self._uploads = client or httpx.Client(
            timeout=timeout, verify=verify, limits=httpx.Limits(max_keepalive_connections=0)
        )
        self._reader = client or reader_client(timeout, verify)
        self._bson_limit = bson_limit
        # Whether each endpoint takes raw uploads, once known (False: an old gateway, BSON).
        self._raw_support: dict[str, bool] = {}

    def close(self) -> None:
        if self._owned:
            self._client.close()
            self._uploads.close()
            self._reader.close()

    def __enter__(self) -> HttpTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def upload(
        self,
        endpoint: str,
        topic: str,
        source: PayloadSource | SealedStream,
        *,
        message_id: MessageId,
        headers: Sequence[tuple[str, bytes]] = (),
        auth: httpx.Auth | None = None,
        ttl: int | None = None,
        trace: TraceContext | None = None,
    ) -> UploadReceipt:
        """Stream one payload to the gateway under `message_id`, never whole in memory.

        The raw form first (`PUT {endpoint}/msg/{id}?topic=`: any size); the hop-compatible
        BSON document (`POST {endpoint}/topic/{topic}+oversized`) when the gateway predates
        the raw route (remembered per endpoint; above 16 MiB it is asked with `OPTIONS`
        first, so an old gateway is not sent the body for nothing) or the headers are too
        large for HTTP header fields, provided the payload fits BSON's 2 GiB
        (:mod:`client.http._upload_forms`).

        Args:
            endpoint: the gateway base URL.
            topic: the MQTT topic the message is for.
            source: the payload; a :class:`SealedStream` is sealed while it is sent, and
                the SHA-256 the gateway answers must be the one taken on the way.
            message_id: the id to store it under (the gateway keeps the client's id).
            headers: extra (name, value) headers stored beside the payload.
            auth: credentials, only when the endpoint may receive them.
            ttl: seconds the gateway should keep the payload (the placeholder's Message
                Expiry Interval); None: the gateway's default.
            trace: the upload's trace context, sent as `traceparent` / `tracestate`
                headers with every request of it (W3C Trace Context).

        Raises:
            UploadError: no answer, a non-201 answer, or no wire form can carry the payload.
        """
        base = endpoint.rstrip("/")
        traced = list(trace.pairs()) if trace is not None else []
        reason = self._raw_upload(base, topic, source, message_id, headers, auth, ttl, traced)
        if isinstance(reason, UploadReceipt):
            return reason
        if source.size > self._bson_limit:
            raise UploadError(
                raw_upload_url(base, message_id),
                f"{reason}, and a payload of {source.size} bytes is more than a BSON upload "
                f"document can carry ({self._bson_limit} bytes): upgrade the gateway",
            )
        self._send(bson_request(base, topic, source, message_id, headers, ttl), auth, traced)
        # hop-client ignores the body and builds the URL from the id it sent; so do we.
        return UploadReceipt(
            message_id, raw_upload_url(base, message_id), source.size, source.sha256
        )

    def _raw_upload(
        self,
        base: str,
        topic: str,
        source: PayloadSource | SealedStream,
        message_id: MessageId,
        headers: Sequence[tuple[str, bytes]],
        auth: httpx.Auth | None,
        ttl: int | None,
        traced: list[tuple[str, str]],
    ) -> UploadReceipt | str:
        """The upload in the raw form (`PUT /msg/<id>`), or why it cannot be (for the BSON
        form to say, if it cannot carry the payload either)."""
        fields = header_fields(headers)
        raw = self._raw_support.get(base)
        if raw is None and source.size > PROBE_ABOVE:
            raw = self._probe_raw(base, message_id)
        if raw is False:
            return f"the gateway at {base} has no raw upload route (PUT /msg/<id>)"
        if not fits_headers(fields):
            return f"the stored headers exceed {HEADER_BUDGET} bytes as HTTP header fields"
        try:
            request = raw_request(base, topic, source, message_id, fields, ttl)
            answer = self._send(request, auth, traced)
        except UploadError as exc:
            if exc.status not in UNSUPPORTED:
                raise
            self._raw_support[base] = False
            reason = f"the gateway at {base} has no raw upload route ({exc.status})"
            log.info("%s: uploading as a BSON document instead", reason)
            return reason
        self._raw_support[base] = True
        if isinstance(source, SealedStream):  # no X-Offload-Sha256 was sent ahead
            _same_digest(request.url, answer, source.sha256)
        return UploadReceipt(
            message_id, raw_upload_url(base, message_id), source.size, source.sha256
        )

    def _probe_raw(self, endpoint: str, message_id: MessageId) -> bool | None:
        """Ask `OPTIONS /msg/<id>` whether the gateway takes raw uploads; None: unknown.

        Raises:
            UploadError: no answer (refused, reset, timed out): the upload would fare no
                better, and a gateway that never answers must cost one timeout, not two.
        """
        url = raw_upload_url(endpoint, message_id)
        try:
            response = self._client.options(url)
        except httpx.TransportError as exc:
            raise UploadError(url, f"upload failed: OPTIONS: {exc!r}") from exc
        except httpx.HTTPError:
            return None  # the upload itself will say what is wrong
        answer = allows_put(response.status_code, response.headers.get("allow"))
        if answer is not None:
            self._raw_support[endpoint] = answer
        return answer

    def _send(
        self, request: UploadRequest, auth: httpx.Auth | None, traced: list[tuple[str, str]]
    ) -> httpx.Response:
        """One upload request; anything but 201 is an UploadError with the status."""
        watchdog = upload_watchdog(request.url, self._timeout)
        try:
            with watchdog:
                response = self._uploads.request(
                    request.method,
                    request.url,
                    content=counted_body(request.body, watchdog),
                    headers=request.headers + traced,
                    params=request.params or None,
                    auth=auth or httpx.USE_CLIENT_DEFAULT,
                    extensions={"trace": watchdog.trace},
                )
        except httpx.HTTPError as exc:
            raise UploadError(request.url, f"upload failed: {exc!r}") from exc
        except ScramFailure as exc:
            raise UploadError(request.url, str(exc), 401) from exc
        finally:
            # A body left half-read stops now (a SealedStream's worker thread), before any
            # retry reads the source again.
            close = getattr(request.body, "close", None)
            if close is not None:
                close()
        if response.status_code != 201:
            raise UploadError(request.url, _detail(response), response.status_code)
        return response

    @property
    def client(self) -> httpx.Client:
        """The pooled httpx client (direct transfers reuse its connections)."""
        return self._client

    @property
    def reader(self) -> httpx.Client:
        """The httpx client fetches read with (over urllib3, whose head the pace times too)."""
        return self._reader

    def fetch(
        self,
        url: str,
        *,
        expected_sha256: str | None,
        expected_size: int | None = None,
        max_bytes: int | None = None,
        spool_threshold: int = 64 << 20,
        spool_dir: str | os.PathLike[str] | None = None,
        auth: httpx.Auth | None = None,
        on_bytes: Callable[[int, int | None], None] | None = None,
        redirect_ok: Callable[[Origin], bool] | None = None,
        pace: Pace | None = None,
        topic: str | None = None,
        tap: Callable[[Sequence[bytes | memoryview]], None] | None = None,
        keep: bool = True,
        trace: TraceContext | None = None,
    ) -> Payload:
        """GET a raw payload, verifying its SHA-256 while it streams in, never reading more.

        At most `expected_size` bytes (else `max_bytes`) are read: a Content-Length that
        differs from `expected_size` (or exceeds `max_bytes`) is refused before the body, a
        body that runs past it is cut off and the connection closed. Payloads larger than
        `spool_threshold` are written to a temporary file, deleted on any failure. A payload
        is handed over only after its whole digest is known and matched (a mismatch
        discards it, spool file included); how it is hashed and what memory it holds meanwhile
        is :func:`client.http._fetching.read_body`'s, the redirects it follows :meth:`_open`'s.

        Args:
            url: the raw payload URL (`{endpoint}/msg/{id}/payload`); http or https only.
            expected_sha256: lowercase hex the payload must hash to; None skips the check.
            expected_size: the size the placeholder declared: the most that is read.
            max_bytes: refuse a declared size (or, without one, a body) larger than this.
            spool_threshold: payloads above this many bytes go to a temporary file.
            spool_dir: where spool files are made (default: the system temp directory).
            auth: credentials, only when the URL may receive them.
            on_bytes: called with (bytes received so far, total or None) as pieces arrive.
            redirect_ok: which other origins a redirect may lead to (the advertised store).
            pace: how slow the whole fetch may be, redirects included (a grace period, then
                a minimum average rate); behind it the connection is shut down and the
                fetch fails (:mod:`client.http._deadline`). None: only `timeout` per read.
            topic: the topic the placeholder came on, told to the gateway (never to a
                redirect's target): with delete-after-fetch it deletes only its own topic's
                messages, not those a hostile placeholder pointed at.
            tap: sees the body's pieces in order as they are hashed (on the hashing thread
                for a large payload); must not raise nor keep a piece past the call. What
                it makes of them is the caller's to discard if this raises.
            keep: False: the body is only hashed and tapped, never held (the receive path
                decrypts it on the tap): the payload returned, once verified, is empty.
            trace: the fetch's trace context, sent as `traceparent` / `tracestate` to the
                URL's own origin (never to a redirect's target: a presigned store URL).

        Raises:
            PayloadNotFound: 404 or 410.
            PayloadChecksumMismatch: the bytes do not hash to `expected_sha256`.
            FetchError: a refused URL, size or redirect, no answer, another error status,
                a body shorter or longer than declared, slower than `pace`.
        """
        if expected_size is not None and max_bytes is not None and expected_size > max_bytes:
            raise FetchError(
                url,
                f"declared size {expected_size} is more than max_fetch_bytes ({max_bytes})",
            )
        limit = expected_size if expected_size is not None else max_bytes
        with Watchdog(url, pace) as watchdog:
            if pace is not None:
                on_bytes = watchdog.counting(on_bytes)
            with (
                _fetch_errors(url, transient=True),
                self._open(url, auth, redirect_ok, watchdog, topic, trace) as response,
            ):
                # Named by `url`, never `response.url`: after a redirect that is a
                # presigned store URL, whose signature must not reach errors and logs.
                size = _checked_length(url, response, expected_size, limit)
                payload, digest, received = read_body(
                    response,
                    url,
                    size,
                    limit,
                    hashed=expected_sha256 is not None,
                    tap=tap,
                    keep=keep,
                    spool_threshold=spool_threshold,
                    spool_dir=spool_dir,
                    on_bytes=on_bytes,
                )
            return _verified(url, payload, digest, expected_size, expected_sha256, received)

    @contextlib.contextmanager
    def _open(
        self,
        url: str,
        auth: httpx.Auth | None,
        redirect_ok: Callable[[Origin], bool] | None,
        watchdog: Watchdog | None = None,
        topic: str | None = None,
        trace: TraceContext | None = None,
    ) -> Iterator[httpx.Response]:
        """The final 200 response for `url`.

        A redirect (a gateway with direct transfers answers 307 to a presigned store URL)
        is followed, at most :data:`MAX_REDIRECTS` times, only to the URL's own origin or
        one `redirect_ok` accepts, and never with credentials: no `auth`, no cookies.
        """
        target = httpx.URL(url)
        home = _origin(url, target)
        # The body is counted as it travels: no content coding may inflate it.
        headers = {"Accept-Encoding": "identity"}
        if topic is not None:
            headers["X-Offload-Placeholder-Topic"] = quote(topic, safe="")
        if trace is not None:
            headers.update(trace.pairs())
        request = self._reader.build_request("GET", target, headers=headers)
        if watchdog is not None:
            request.extensions[ON_SOCKET] = watchdog.attach
        first_auth: httpx.Auth | None = auth
        for hop in range(MAX_REDIRECTS + 1):
            response = self._reader.send(
                request, stream=True, auth=first_auth or httpx.USE_CLIENT_DEFAULT
            )
            try:
                if watchdog is not None:
                    watchdog.watch(response)
                location = response.headers.get("Location")
                if response.status_code in REDIRECTS and location is not None:
                    if hop == MAX_REDIRECTS:
                        raise FetchError(url, f"more than {MAX_REDIRECTS} redirects")
                    request = self._redirected(url, response.url.join(location), home, redirect_ok)
                    if watchdog is not None:
                        request.extensions[ON_SOCKET] = watchdog.attach
                    first_auth = _NO_AUTH  # credentials never follow a redirect
                    continue
                _check_status(url, response)
                yield response
                return
            finally:
                response.close()
        raise AssertionError("unreachable")  # pragma: no cover

    def _redirected(
        self,
        url: str,
        target: httpx.URL,
        home: Origin,
        redirect_ok: Callable[[Origin], bool] | None,
    ) -> httpx.Request:
        """The request for a redirect's target: allowed origins only, no credentials at all."""
        origin = _origin(url, target)
        if origin != home and (redirect_ok is None or not redirect_ok(origin)):
            raise FetchError(
                url, f"redirect to {origin} refused: not the gateway or its advertised store"
            )
        request = self._reader.build_request("GET", target, headers={"Accept-Encoding": "identity"})
        # httpx adds the client's cookie jar to every request it builds: not to the store.
        request.headers.pop("Cookie", None)
        request.headers.pop("Authorization", None)
        return request

    def fetch_to(
        self,
        url: str,
        out: BinaryIO,
        *,
        auth: httpx.Auth | None = None,
        redirect_ok: Callable[[Origin], bool] | None = None,
        trace: TraceContext | None = None,
    ) -> int:
        """Stream a URL's body into a file object without verification (CLI `fetch`).

        Redirects are followed as by :meth:`fetch` (:meth:`_open`): to the URL's own origin
        or one `redirect_ok` accepts, never with credentials.

        Args:
            url: any payload URL.
            out: binary file to write to.
            auth: credentials, only when the URL may receive them.
            redirect_ok: which other origins a redirect may lead to.
            trace: the fetch's trace context (headers to the URL's own origin only).

        Raises:
            PayloadNotFound: 404 or 410.
            FetchError: no answer, another error status or a refused redirect.
        """
        with (
            _fetch_errors(url, transient=False),
            self._open(url, auth, redirect_ok, trace=trace) as response,
        ):
            written = 0
            for piece in response.iter_raw():  # no re-chunking copy
                out.write(piece)
                written += len(piece)
            return written


@contextlib.contextmanager
def _fetch_errors(url: str, *, transient: bool) -> Iterator[None]:
    """httpx's errors and a refused SCRAM login as :class:`FetchError`s naming `url`; with
    `transient`, a connection refused, reset, timed out or cut short as a
    :class:`TransientFetchError` (the receive path retries those)."""
    try:
        yield
    except httpx.TransportError as exc:
        if transient:
            raise TransientFetchError(url, f"fetch failed: {exc!r}") from exc
        raise FetchError(url, f"fetch failed: {exc!r}") from exc
    except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
        raise FetchError(url, f"fetch failed: {exc!r}") from exc
    except ScramFailure as exc:
        raise FetchError(url, str(exc), 401) from exc
