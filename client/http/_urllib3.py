"""An httpx transport over urllib3, for payload reads: what the fetch client sends through.

Why: httpx's own read path (httpcore's 64 KiB socket reads through h11's receive buffer)
cost 1.7-2.5 CPU-s per GiB on the benchmark machine, urllib3's 0.7-0.9 (bench/RESULTS.md,
"Client reads over urllib3"). Behind this transport a fetch keeps what httpx gives it (auth
flows: SCRAM, bearer; cookies; timeouts), and the body arrives as reads of up to 1 MiB from
urllib3's socket file, handed on without a copy. With a proxy in the environment the fetch
client stays on httpx's own transport (:func:`reader_client`).

Only what a fetch needs: requests without a body or with a small one (read whole), HTTP/1.1,
no redirects or retries here (the caller follows redirects by its own rules), no content
decoding (the caller refuses codings). urllib3's errors become httpx's, so callers catch one
family: a refused or failed connection :class:`httpx.ConnectError`, a timeout
:class:`httpx.ConnectTimeout` / :class:`httpx.ReadTimeout`, a body cut short or a broken
answer :class:`httpx.RemoteProtocolError`.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)

from ._deadline import ON_SOCKET, SOCKET

#: Most bytes asked of the socket per body piece: large enough that per-piece costs vanish
#: (a hashing thread takes each piece as it is), small enough to bound what one read holds.
PIECE = 1 << 20
#: Idle connections kept per origin (httpx's default keep-alive pool is 20).
POOL_SIZE = 20
#: Response extension: `readinto(view) -> int`, the body read straight into the caller's
#: buffer (0 at its end). Offered by :class:`Urllib3Transport` only.
READINTO = "offload.readinto"


@contextlib.contextmanager
def _as_httpx(request: httpx.Request) -> Iterator[None]:
    """urllib3's exceptions raised as the httpx ones callers catch."""
    try:
        yield
    except (NewConnectionError, SSLError) as exc:  # before: it subclasses ConnectTimeoutError
        raise httpx.ConnectError(str(exc), request=request) from exc
    except ConnectTimeoutError as exc:
        raise httpx.ConnectTimeout(str(exc), request=request) from exc
    except ReadTimeoutError as exc:
        raise httpx.ReadTimeout(str(exc), request=request) from exc
    except ProtocolError as exc:  # reset, aborted, IncompleteRead, a malformed answer
        raise httpx.RemoteProtocolError(str(exc), request=request) from exc
    except HTTPError as exc:
        raise httpx.TransportError(str(exc), request=request) from exc


class _Body(httpx.SyncByteStream):
    """A urllib3 response's body in reads of up to :data:`PIECE`; close() frees its connection."""

    def __init__(self, response: urllib3.BaseHTTPResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    def __iter__(self) -> Iterator[bytes]:
        # read1: what one socket read brings, up to PIECE (a fast body fills it), so a
        # slow body is handed on as it comes rather than held until a whole piece is in.
        read1 = self._response.read1
        while True:
            with _as_httpx(self._request):
                piece = read1(PIECE, decode_content=False)
            if not piece:
                return
            yield piece

    def readinto(self, view: memoryview) -> int:
        """Fill `view` from the body, straight from the socket; the bytes read, 0 at the end.

        Reads through http.client's response under urllib3's (its `readinto`: the framing,
        Content-Length or chunked, is kept; urllib3's own `readinto` reads a fresh piece and
        copies it). What a fetch into one buffer of the declared size saves: a piece object
        per read and a second copy of every byte (bench/RESULTS.md, "Reads into the
        payload's buffer"). Errors are httpx's, as from iteration.
        """
        raw: http.client.HTTPResponse = self._response._fp  # type: ignore[attr-defined]
        try:
            return raw.readinto(view)
        except TimeoutError as exc:
            raise httpx.ReadTimeout(str(exc), request=self._request) from exc
        except (http.client.HTTPException, OSError) as exc:  # cut short, reset, TLS
            raise httpx.RemoteProtocolError(repr(exc), request=self._request) from exc

    def close(self) -> None:
        response = self._response
        if not response.closed:
            # Not read to its end (cut off, refused, an error answer): the rest is never
            # drained, so the connection cannot be reused: closed (urllib3 closes its
            # socket too), then its slot freed.
            response.close()
        response.release_conn()


#: The running request's ON_SOCKET hook, per thread (urllib3 sends and reads on the caller's).
_request = threading.local()


def _before_head(sock: socket.socket | None) -> None:
    hook: Callable[[socket.socket | None], object] | None = getattr(_request, "on_socket", None)
    if hook is not None:
        hook(sock)


class _Connection(HTTPConnection):
    """Tells the request's hook its socket before the answer's head is read (a fetch's pace
    then covers a status line and headers that trickle in, not only the body)."""

    def getresponse(self) -> Any:  # urllib3's HTTPResponse
        _before_head(self.sock)
        return super().getresponse()


class _TlsConnection(HTTPSConnection):
    def getresponse(self) -> Any:
        _before_head(self.sock)
        return super().getresponse()


class _Pool(urllib3.HTTPConnectionPool):
    ConnectionCls = _Connection


class _TlsPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _TlsConnection


def _pool_manager(verify: bool | ssl.SSLContext) -> urllib3.PoolManager:
    """The pool, trusting what httpx would trust for the same `verify`."""
    if verify is False:
        # The caller chose no verification by name; httpx does not warn per request either.
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        manager = urllib3.PoolManager(maxsize=POOL_SIZE, cert_reqs="CERT_NONE")
    else:
        context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context()
        manager = urllib3.PoolManager(maxsize=POOL_SIZE, ssl_context=context)
    manager.pool_classes_by_scheme = {"http": _Pool, "https": _TlsPool}
    return manager


class Urllib3Transport(httpx.BaseTransport):
    """Sends httpx requests with a pooled urllib3 `PoolManager`.

    Args:
        verify: TLS verification as httpx takes it (True: httpx's own CA bundle, False: none,
            or an SSL context).
    """

    def __init__(self, *, verify: bool | ssl.SSLContext = True) -> None:
        self._pool = _pool_manager(verify)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        limits: dict[str, Any] = request.extensions.get("timeout", {})
        timeout = urllib3.Timeout(connect=limits.get("connect"), read=limits.get("read"))
        body = request.read() or None
        _request.on_socket = request.extensions.get(ON_SOCKET)
        try:
            with _as_httpx(request):
                response = self._pool.urlopen(
                    request.method,
                    str(request.url),
                    body=body,
                    headers=urllib3.HTTPHeaderDict(request.headers.multi_items()),
                    redirect=False,
                    retries=False,
                    preload_content=False,
                    decode_content=False,
                    timeout=timeout,
                )
        finally:
            _request.on_socket = None
        stream = _Body(response, request)
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1"}
        # For a fetch's deadline (client/http/_deadline.py), which shuts it down to end the fetch.
        extensions[SOCKET] = getattr(response.connection, "sock", None)
        if isinstance(getattr(response, "_fp", None), http.client.HTTPResponse):
            extensions[READINTO] = stream.readinto
        return httpx.Response(
            response.status,
            # As bytes: http.client decoded them as Latin-1, so this gives back what was sent
            # (a gateway's `X-Offload-Topic` is raw UTF-8; as str, httpx would refuse it).
            headers=[
                (k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.iteritems()
            ],
            stream=stream,
            extensions=extensions,
        )

    def close(self) -> None:
        # PoolManager.clear() only forgets its pools (urllib3 2 closes them when they are
        # collected): close their connections now, or a server waits on them until GC.
        pools = self._pool.pools
        for pool in [pools.get(key) for key in pools.keys()]:  # noqa: SIM118 (no __iter__)
            if pool is not None:
                pool.close()
        self._pool.clear()


def reader_client(timeout: float, verify: bool | ssl.SSLContext) -> httpx.Client:
    """The httpx client fetches go through: over urllib3, unless a proxy is configured.

    httpx honours `HTTP(S)_PROXY`/`ALL_PROXY`/`NO_PROXY` only with its own transports, so
    with a proxy in the environment fetches keep them (and their CPU cost per byte).
    """
    if urllib.request.getproxies():
        return httpx.Client(timeout=timeout, verify=verify)
    return httpx.Client(timeout=timeout, transport=Urllib3Transport(verify=verify))
