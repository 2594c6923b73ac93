"""The gateway link's blocking half: one upload or one fetch, run on a worker thread.

Each function is one transfer from start to end on the calling thread, with the library's
blocking HTTP clients (:class:`client.HttpTransport`: httpx's own transport for uploads,
urllib3 under httpx for fetches, the same SCRAM and bearer flows). Payload pieces come from
or go to the event loop through a :mod:`proxy._handoff` channel; the SHA-256 is taken here,
in the same pass. Every failure ends as a :class:`TransferFailed` handed to the caller.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import select
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from client import FetchError, Pace, Watchdog
from client.protocol import QUOTA_HEADER, DiscoveryRecord, Origin, http_origin

from ._exceptions import QUOTA_EXCEEDED, CutOff, TransferFailed
from ._handoff import FromLoop, Stopped, ToLoop

MAX_ERROR_BODY = 4096
#: Largest `GET /` record read from the gateway (a real one is under 1 KiB).
MAX_RECORD_BYTES = 16384
REDIRECTS = frozenset({301, 302, 303, 307, 308})


@dataclass(frozen=True, slots=True)
class Opened:
    """A fetch's answer passed its checks: its pieces follow."""


@dataclass(frozen=True, slots=True)
class Fetched:
    """A fetch's end: every byte handed over, and their SHA-256."""

    size: int
    sha256: str


FetchItem = Opened | bytes | Fetched | TransferFailed


def _bounded(response: httpx.Response, limit: int) -> bytes:
    """At most `limit` bytes of an answer's body."""
    body = b""
    for piece in response.iter_raw():
        body += piece
        if len(body) >= limit:
            break
    return body[:limit]


def _detail(response: httpx.Response) -> str:
    text = _bounded(response, MAX_ERROR_BODY).decode("utf-8", "replace")
    return f"HTTP {response.status_code}: {text[:200]}"


def declared_store(http: httpx.Client, gateway: Origin, pace: Pace | None = None) -> Origin | None:
    """The `DirectStore` of the gateway's own record (`GET /`), whole within `pace`
    (asked inside a fetch: it must not outlast it); None: it declares none.

    Raises:
        TransferFailed: no readable record (asked again next time); CutOff: none within
            the pace.
    """
    url = f"{gateway}/"
    try:
        with Watchdog(url, pace) as watchdog:
            request = watchdog.timing(http.build_request("GET", url))
            with contextlib.closing(http.send(request, stream=True)) as response:
                watchdog.watch(response)
                body = _bounded(response, MAX_RECORD_BYTES + 1)
        if response.status_code != 200 or len(body) > MAX_RECORD_BYTES:
            raise TransferFailed(f"the gateway's record at {url}: HTTP {response.status_code}")
        record = DiscoveryRecord.from_json(body)  # MalformedDiscoveryRecord is a ValueError
    except (httpx.HTTPError, ValueError) as exc:
        raise TransferFailed(f"the gateway's record at {url}: {exc!r}") from exc
    except FetchError as exc:  # behind the pace: cut off
        raise CutOff(f"the gateway's record at {exc}") from exc
    return None if record.direct_store is None else http_origin(record.direct_store)


@dataclass(frozen=True, slots=True)
class PayloadGet:
    """One payload GET, run on a worker thread by :meth:`run`.

    A payload redirect (direct transfers: the gateway answers with a presigned store URL) is
    followed once, without credentials, and only to the store the gateway declares
    (`store_of`, as the library does, client/http/_store_origin.py).

    The whole GET, answer heads and redirect included, keeps `pace` (the library's fetch
    pace: per-read timeouts never end an answer that trickles), else its connection is shut
    down and it fails; time spent handing a piece to a loop that has no room for it yet
    (a device taking its payload slowly) does not count.
    """

    http: httpx.Client
    url: str
    size: int  # the placeholder's: never more is read
    auth: httpx.Auth | None
    store_of: Callable[[Origin], Origin | None]
    peer: str  # the receiving device's address (X-Forwarded-For; not sent to a store)
    traced: tuple[tuple[str, str], ...] = ()  # `traceparent` / `tracestate`, to the gateway
    piece: int = 0  # the most of the body in one piece (0: FETCH_PIECE)
    pace: Pace | None = None  # how slow the whole GET may be (None: per-read timeouts only)
    cut_off: Callable[[CutOff], None] = lambda exc: None  # (worker thread) when the pace did

    def run(self, out: ToLoop[FetchItem]) -> None:
        """Hand `out` :class:`Opened`, the body's pieces, then :class:`Fetched` (or a
        :class:`TransferFailed`, the last item)."""
        try:
            with Watchdog(self.url, self.pace) as watchdog:
                self._exchange(out, watchdog)
        except Stopped:
            return  # the loop side gave up: nobody reads
        except TransferFailed as exc:
            failure = exc
        except FetchError as exc:  # behind its pace: cut off
            failure = CutOff(f"fetch of {exc}")
            self.cut_off(failure)
        except Exception as exc:  # an auth flow's own error, a bad URL: never a dead thread
            failure = TransferFailed(f"fetch of {self.url} failed: {exc!r}")
        else:
            return
        with contextlib.suppress(Stopped):
            out.put(failure)

    def _exchange(self, out: ToLoop[FetchItem], watchdog: Watchdog) -> None:
        url, http = self.url, self.http
        headers = {"Accept-Encoding": "identity", "X-Forwarded-For": self.peer, **dict(self.traced)}
        request = watchdog.timing(http.build_request("GET", url, headers=headers))
        try:
            response = http.send(request, auth=self.auth or httpx.USE_CLIENT_DEFAULT, stream=True)
        except httpx.HTTPError as exc:
            raise TransferFailed(f"fetch of {url} failed: {type(exc).__name__}") from exc
        try:
            watchdog.watch(response)
            location = response.headers.get("location")
            if response.status_code in REDIRECTS and location is not None:
                target = response.url.join(location)
                response.close()
                response = _redirected(http, url, target, self.store_of, watchdog)
            if response.status_code != 200:
                raise TransferFailed(_detail(response), response.status_code)
            if response.headers.get("content-length") != str(self.size):
                raise TransferFailed(f"{url} does not declare the placeholder's size")
            if response.headers.get("content-encoding", "identity") != "identity":
                raise TransferFailed(f"{url} answers with a content coding")
            with watchdog.aside():
                out.put(Opened())
            self._body(response, out, watchdog)
        finally:
            response.close()

    def _body(self, response: httpx.Response, out: ToLoop[FetchItem], watchdog: Watchdog) -> None:
        digest = hashlib.sha256()
        count = 0
        counted = watchdog.counting(None)
        try:
            for piece in _pieces(response, self.piece or FETCH_PIECE):
                if watchdog.cut_off is not None:  # what the shut-down socket still gave
                    raise TransferFailed(f"fetch of {self.url}: {watchdog.cut_off}")
                count += len(piece)
                if count > self.size:
                    raise TransferFailed(f"{self.url} sends more than the placeholder's size")
                counted(count, None)
                digest.update(piece)
                with watchdog.aside():
                    out.put(piece)
        except httpx.HTTPError as exc:
            raise TransferFailed(f"fetch of {self.url} broke off: {type(exc).__name__}") from exc
        if count != self.size:  # closed early (http.client's readinto says no more than that)
            raise TransferFailed(f"fetch of {self.url} broke off after {count} bytes")
        with watchdog.aside():
            out.put(Fetched(count, digest.hexdigest()))


#: The most of a payload one fetch piece holds. A subscriber that reads slowly leaves its
#: fetch's pieces waiting in the proxy (the channel's, the thread's, the loop's two): with the
#: transport's own 1 MiB reads that was ~5 MiB per slow reader, in pieces of this ~1.5 MiB.
FETCH_PIECE = 256 * 1024
#: The library's urllib3 transport hands a response's `readinto` under this extension
#: (client.http._urllib3.READINTO); another transport (a proxy in the environment) has none.
_READINTO = "offload.readinto"


def _pieces(response: httpx.Response, size: int = FETCH_PIECE) -> Iterator[bytes]:
    """The body in pieces of at most `size`, each read straight into a buffer of that size
    (raw pieces as they come where the transport cannot)."""
    readinto: Callable[[memoryview], int] | None = response.extensions.get(_READINTO)
    if readinto is None:
        yield from response.iter_raw()
        return
    view = memoryview(bytearray(size))
    while n := readinto(view):
        yield bytes(view[:n])


def _redirected(
    http: httpx.Client,
    url: str,
    target: httpx.URL,
    store_of: Callable[[Origin], Origin | None],
    watchdog: Watchdog,
) -> httpx.Response:
    """The store's answer for a payload redirect, if it leads to the declared store
    (watched by the fetch's `watchdog` too)."""
    try:
        origin = http_origin(str(target))
    except ValueError as exc:
        raise TransferFailed(f"fetch of {url}: redirect refused: {exc}") from exc
    if origin != store_of(http_origin(url)):
        raise TransferFailed(f"fetch of {url}: redirect to {origin} refused: not its store")
    request = http.build_request("GET", target, headers={"Accept-Encoding": "identity"})
    request.headers.pop("Cookie", None)
    try:
        response = http.send(watchdog.timing(request), auth=None, stream=True)
    except httpx.HTTPError as exc:
        raise TransferFailed(f"fetch of {target} failed: {type(exc).__name__}") from exc
    try:
        watchdog.watch(response)
    except FetchError:
        response.close()
        raise
    return response


#: httpx trace events that hand over a new connection's stream (TCP, then TLS over it).
_CONNECTED = frozenset({"connection.connect_tcp.complete", "connection.start_tls.complete"})
_NO_LINGER = struct.pack("ii", 1, 0)
#: A response's status line (an answer's first bytes).
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3})[^\r\n]*\r\n")
#: Bytes of an early answer looked at: a `100 Continue` and the next status line.
_PEEK = 512


class Wire:
    """The socket an upload's HTTP exchange runs on: the loop cuts it off, the thread looks
    on it for the gateway's answer before the body has ended.

    An upload's thread can wait on the gateway (a write on full buffers, a read for the
    answer) until the HTTP timeout. When the loop gives the upload up (its client left, the
    Will's CONNECT timed out), :meth:`cut` shuts that socket down at once: the thread's
    wait ends, and the connection is reset, not closed, so what the gateway has not taken
    yet is dropped and it keeps nothing of a body cut short. The socket is learnt from
    httpx's `trace` request extension (:meth:`trace`) as each connection is made: uploads
    go over connections of their own (no keep-alive), so each exchange's is seen.

    A refusal (a login, a topic) comes before the body is read: :meth:`answered` sees it
    while the body is still being sent, so the thread stops feeding it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._cut = False
        self.why: str | None = None  # why it was cut off, when a deadline did it
        self._timer: threading.Timer | None = None

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """(worker thread) httpx's trace hook: note each new connection's socket."""
        if event not in _CONNECTED:
            return
        extra = getattr(info.get("return_value"), "get_extra_info", None)
        sock = extra("socket") if extra is not None else None
        if isinstance(sock, socket.socket):
            with self._lock:
                self._sock = sock
                cut = self._cut
            if cut:
                _reset(sock)

    def cut(self, why: str | None = None) -> None:
        """(event loop, or the answer's timer) End the exchange now, and any connection it
        makes later."""
        with self._lock:
            self._cut = True
            self.why = self.why or why
            sock = self._sock
        if sock is not None:
            _reset(sock)

    def answer_within(self, seconds: float) -> None:
        """(worker thread) The body is sent: the answer must be in, whole, within `seconds`
        (per-read timeouts never end one that comes a byte every few seconds)."""
        why = f"no whole answer {seconds:g} s after the body was sent"
        self._timer = threading.Timer(seconds, self.cut, kwargs={"why": why})
        self._timer.daemon = True
        self._timer.start()

    def ended(self) -> None:
        """(worker thread) The exchange is over: no deadline is left running."""
        if self._timer is not None:
            self._timer.cancel()

    def answered(self) -> int | None:
        """(worker thread) The status of an answer already waiting on the connection (not a
        `100 Continue`), looked at without taking it; None: none yet, or over TLS, whose
        records cannot be looked into without taking them."""
        sock = self._sock
        if sock is None or isinstance(sock, ssl.SSLSocket) or sock.fileno() == -1:
            return None
        try:
            if not select.select([sock], [], [], 0)[0]:
                return None
            data = sock.recv(_PEEK, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (OSError, ValueError):
            return None
        return final_status(data)


def final_status(data: bytes) -> int | None:
    """The first status other than 1xx in `data`, the start of an answer; None if none yet."""
    at = 0
    while (line := _STATUS_LINE.match(data, at)) is not None:
        status = int(line[1])
        if status >= 200:
            return status
        end = data.find(b"\r\n\r\n", at)  # an informational answer: its head ends here
        if end < 0:
            return None
        at = end + 4
    return None


def _reset(sock: socket.socket) -> None:
    """Shut `sock` down (a thread blocked on it wakes) so that its close resets it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _NO_LINGER)
    with contextlib.suppress(OSError):
        # The plain socket's shutdown, also for a TLS one: ssl.SSLSocket's own drops its
        # TLS state, which the thread still reading it would trip over.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


#: Seconds between two looks for the gateway's answer while a piece is awaited.
ANSWER_POLL = 0.25


@dataclass(frozen=True, slots=True)
class Upload:
    """One raw upload (`PUT {url}?topic=`) of `size` bytes."""

    url: str
    params: dict[str, str | int]
    headers: list[tuple[str, str]]
    size: int


class _Body:
    """An upload's body: the loop's pieces (at most `idle` seconds apart), hashed on the
    way, ended early by the gateway's answer (:meth:`Wire.answered`); once it is all sent,
    the answer has `answer` seconds (:meth:`Wire.answer_within`)."""

    def __init__(
        self, pieces: FromLoop[bytes], size: int, idle: float, wire: Wire, answer: float
    ) -> None:
        self._pieces = pieces
        self._size = size
        self._idle = idle
        self._wire = wire
        self._answer = answer
        self.digest = hashlib.sha256()
        self.sent = 0

    def __iter__(self) -> Iterator[bytes]:
        while self.sent < self._size:
            piece = self._next()
            self.digest.update(piece)
            self.sent += len(piece)
            yield piece
        self._wire.answer_within(self._answer)

    def _next(self) -> bytes:
        waited = 0.0
        while True:
            status = self._wire.answered()
            if status is not None:
                # What httpcore takes for a write the server cut short: it reads the answer.
                raise httpcore.WriteError(f"the gateway answered {status} before the body")
            try:
                return self._pieces.get(min(ANSWER_POLL, self._idle - waited))
            except TimeoutError:
                waited += ANSWER_POLL
                if waited >= self._idle:
                    raise


def upload(
    http: httpx.Client,
    request: Upload,
    *,
    auth: httpx.Auth | None,
    pieces: FromLoop[bytes],
    idle: float,
    wire: Wire,
    answer: float,
) -> str:
    """Send the pieces as `request`'s body (waiting at most `idle` seconds for each, and
    `answer` seconds for the whole answer after the last); the SHA-256 of what was sent,
    which the gateway's answer must carry too. `wire` learns the exchange's socket, so the
    loop can cut it off.

    The request asks `Expect: 100-continue`: the gateway then answers a refusal (a login,
    the topic's ACL) at once instead of reading the body first (up to 16 MiB, at the
    device's pace: gateway/middleware/_drain.py), and the body stops as soon as that
    answer is seen (:meth:`Wire.answered`, before each piece and while one is awaited), so
    a refused upload holds its slot no longer than its head took. The body is sent
    without waiting for `100 Continue` (httpx does not), which the gateway allows.

    Raises:
        TransferFailed: no answer, a refusal, or an answer for other bytes.
        Stopped: the loop side aborted (the gateway, cut off mid-body, keeps nothing).
    """
    body = _Body(pieces, request.size, idle, wire, answer)
    try:
        answered = _exchange(http, request, auth, body, wire)
    finally:
        wire.ended()
        pieces.gone()
    sha256 = body.digest.hexdigest()
    if not isinstance(answered, dict) or body.sent != request.size:
        raise TransferFailed(f"the gateway stored other bytes than were sent to {request.url}")
    if answered.get("sha256") != sha256 or answered.get("size") != request.size:
        raise TransferFailed(f"the gateway stored other bytes than were sent to {request.url}")
    return sha256


def _exchange(
    http: httpx.Client, request: Upload, auth: httpx.Auth | None, body: _Body, wire: Wire
) -> object:
    """The PUT and its 201 answer's JSON."""
    try:
        response = http.send(
            http.build_request(
                "PUT",
                request.url,
                params=request.params,
                headers=[*request.headers, ("Expect", "100-continue")],
                content=iter(body),
                extensions={"trace": wire.trace},
            ),
            auth=auth or httpx.USE_CLIENT_DEFAULT,
            stream=True,
        )
        try:
            if response.status_code != 201:
                raise TransferFailed(
                    _detail(response), response.status_code, reason=_quota(response)
                )
            return json.loads(_bounded(response, MAX_ERROR_BODY))
        finally:
            response.close()
    except httpx.HTTPError as exc:
        why = wire.why or f"failed: {type(exc).__name__}"
        raise TransferFailed(f"upload to {request.url}: {why}") from exc
    except ValueError as exc:  # JSONDecodeError, or a body that is not UTF-8
        raise TransferFailed(f"upload to {request.url}: the answer is not JSON") from exc
    except (Stopped, TimeoutError, TransferFailed):
        raise
    except Exception as exc:  # the login's own failure (SCRAM): never a dead thread
        # The gateway refused the proof (`e=invalid-proof`), or could not prove itself:
        # the login is refused, whatever a resend would carry (0x87).
        raise TransferFailed(f"upload to {request.url}: the login failed: {exc}", 401) from exc


def _quota(response: httpx.Response) -> int | None:
    """0x97 (Quota exceeded) for a refusal that names the account's stored-bytes quota:
    deleting payloads gives room back, unlike a payload over the size limit (0x83)."""
    return QUOTA_EXCEEDED if QUOTA_HEADER in response.headers else None
