"""The proxy's HTTP side: the library's raw upload (`PUT /msg/<id>?topic=`) fed from the
client's socket while it arrives, and the payload fetch for placeholders it resolves.

Each transfer runs on a worker thread of its own with the library's blocking clients
(:mod:`proxy._gateway_calls`); the event loop hands it the client's pieces or takes the
payload's from it (:mod:`proxy._handoff`). Credentials are the client's own
(:func:`credentials`): the gateway checks them against the broker's password file and the
topic against its ACL, so nothing is stored under a topic the client could not publish to.
Every request names the device's address in `X-Forwarded-For`: a gateway that trusts the
proxy (`OFFLOAD_TRUSTED_PROXIES`) counts its per-address limits (uploads, failed logins)
against the device, not against the proxy that the whole fleet shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import ssl
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from client import HttpTransport, Pace, gateway_auth
from client.protocol import MessageId, Origin, Placeholder, TraceContext

from ._exceptions import CutOff, TransferFailed
from ._gateway_calls import (
    FETCH_PIECE,
    Fetched,
    FetchItem,
    Opened,
    PayloadGet,
    Upload,
    Wire,
    declared_store,
    upload,
)
from ._handoff import FromLoop, Stopped, ToLoop
from ._stat import Stat, payload_stat
from .protocol import Connect, Stored

RAW_CONTENT_TYPE = "application/octet-stream"
FORWARDED_FOR = "X-Forwarded-For"
R = TypeVar("R")
#: The gateway's request head limit (gateway/middleware/_protocol.py `MAX_HEAD_BYTES`: over
#: it, 431 and the connection closed), and what of it an upload's own fields take at most
#: (request line with the topic, login, trace context, forwarded address).
GATEWAY_HEAD = 64 * 1024
#: An upload's whole answer is due this many `http_timeout`s after its body (a silent
#: gateway is ended by the read timeout first; this ends one that answers a byte at a time).
ANSWER_TIMES = 1.5
HEAD_ROOM = 8 * 1024
log = logging.getLogger("proxy")


def header_fields(headers: tuple[tuple[str, str], ...]) -> list[str]:
    """A PUBLISH's user properties as the upload's `X-Offload-Header` values."""
    return [f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in headers]


def head_fits(headers: tuple[tuple[str, str], ...]) -> bool:
    """Whether an upload with these stored headers fits the gateway's request head: one
    that does not is refused without sending anything (the gateway's 431 would come only
    once the head is sent, and a resend would fare no better)."""
    size = sum(len("X-Offload-Header: \r\n") + len(f) for f in header_fields(headers))
    return size <= GATEWAY_HEAD - HEAD_ROOM


def credentials(connect: Connect, scheme: str = "auto") -> httpx.Auth | None:
    """The device's own login for the gateway: a CONNECT password that is a JWT as a bearer
    token (the device's claims then decide what the gateway stores and serves for it), else
    SCRAM with the user name and password; ``scheme`` names one instead (`gateway_auth`).
    None without a password (anonymous, or a certificate login: the gateway then serves only
    if it allows anonymous uploads), or without a user name where one is needed."""
    if connect.password is None:
        return None
    try:
        password = connect.password.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return gateway_auth(username=connect.username, password=password, token=None, scheme=scheme)


#: Bytes hashed per hop to a worker thread (hashlib releases the GIL): the event loop serves
#: other connections while a large message is hashed, and one hop per MiB (not per 64 KiB
#: piece) keeps the hand-over cheap.
HASH_BATCH = 1 << 20


class Hasher:
    """SHA-256 of a stream, taken in batches on a worker thread (at most one batch held)."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def _update(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self._digest.update(piece)

    async def add(self, piece: bytes) -> None:
        self._pending.append(piece)
        self._pending_bytes += len(piece)
        if self._pending_bytes >= HASH_BATCH:
            await self._flush()

    async def _flush(self) -> None:
        pieces, self._pending, self._pending_bytes = self._pending, [], 0
        if sum(len(p) for p in pieces) >= 65536:
            await asyncio.to_thread(self._update, pieces)
        else:
            self._update(pieces)

    async def hexdigest(self) -> str:
        await self._flush()
        return self._digest.hexdigest()


#: Pieces an upload's channel holds (each up to 256 KiB, as the client's socket gives them).
DEPTH = 4
#: Pieces a fetch's channel holds (each up to 1 MiB, as the gateway's socket gives them):
#: with a subscriber that reads slowly, this much waits here, one more on the thread and
#: two on the loop (the piece being written, the one held back until the digest is known).
FETCH_DEPTH = 2


class Fetch:
    """A payload arriving from a worker thread: its pieces (``async for``), then
    :attr:`sha256` of all of them, taken on the thread."""

    def __init__(self, channel: ToLoop[FetchItem], url: str) -> None:
        self._channel = channel
        self._url = url
        self.sha256: str | None = None  # once every piece is read
        self.size = 0

    async def _next(self) -> Opened | bytes | Fetched:
        item = await self._channel.get()
        if isinstance(item, TransferFailed):
            raise item
        return item

    async def opened(self) -> None:
        item = await self._next()
        if not isinstance(item, Opened):
            raise TransferFailed(f"fetch of {self._url}: no answer head")  # pragma: no cover

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            item = await self._next()
            if isinstance(item, Fetched):
                self.sha256, self.size = item.sha256, item.size
                return
            if not isinstance(item, bytes):  # pragma: no cover - the thread's order
                raise TransferFailed(f"fetch of {self._url}: out of order")
            yield item


class Threads(Executor):
    """A daemon thread for each call. A transfer's thread can sit in a read until the HTTP
    timeout after its connection was given up (a silent gateway at shutdown): a pool's
    worker would hold the proxy's exit that long (the interpreter joins them), these end
    with the process."""

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        future: Future[R] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        threading.Thread(target=run, name="gateway-link", daemon=True).start()
        return future


class GatewayLink:
    """Uploads and fetches against the gateway, each on a worker thread of its own (a
    blocking transfer: :mod:`proxy._gateway_calls`), the event loop moving only pieces.

    Args:
        timeout: seconds for connect and for each read or write.
        idle: seconds an upload waits for the client's next piece.
        pace: how slow a fetch may be, whole (a `HEAD`, a payload `GET` with its redirect
            and the store's record): `fetch_deadline` seconds of grace, then
            `fetch_min_rate` on average, else its connection is shut down and it fails (a
            gateway or store that trickles its answer holds no device, slot or spool past
            it); None: only `timeout` per read.
        cut_off: told each request the pace cut off (`head`, `payload`, `record`), from
            the loop or a worker thread; it is logged here.

    A transfer's thread is its own (:class:`Threads`), so none waits for another's; the
    callers' admission limits (`max_uploads`, Wills included, and `max_fetches`) bound how
    many there are. An upload given up by the loop (its client left, an error) has its
    connection cut off at once (:class:`proxy._gateway_calls.Wire`), so its thread ends
    then, not at the HTTP timeout: uploads go over connections of their own for that (a
    connection is a small cost beside a payload over the broker's limit), and so do the
    calls an offload waits on (:meth:`call` with `cut_off`: the dedup's link).
    """

    def __init__(
        self,
        *,
        timeout: float,
        verify: ssl.SSLContext | bool = True,
        idle: float = 30.0,
        pace: Pace | None = None,
        cut_off: Callable[[str], None] = lambda request: None,
    ) -> None:
        self._http = HttpTransport(timeout=timeout, verify=verify)
        self._pace = pace
        self._cut_off = cut_off
        self._timeout = timeout
        # The calls that may be cut off (:meth:`call`) each name their Wire on their thread.
        self._wires = threading.local()
        self._uploads = httpx.Client(
            timeout=timeout,
            verify=verify,
            limits=httpx.Limits(max_keepalive_connections=0),
            event_hooks={"request": [self._on_wire]},
        )
        self._threads = Threads()
        self._idle = idle
        # Per gateway origin: the store origin its `GET /` declares (None: it declares none).
        self._stores: dict[Origin, Origin | None] = {}

    def _store_of(self, gateway: Origin) -> Origin | None:
        """(worker thread) The store a payload redirect from `gateway` may lead to."""
        if gateway not in self._stores:
            try:
                self._stores[gateway] = declared_store(self._http.reader, gateway, self._pace)
            except CutOff as exc:
                self._cutting("record", exc)
                return None  # asked again next time
            except TransferFailed:
                return None
        return self._stores[gateway]

    def _cutting(self, request: str, exc: CutOff) -> None:
        """(loop or worker thread) A `request` the pace cut off: counted, and why logged."""
        self._cut_off(request)
        log.warning("gateway answer too slow; cut off", extra={"why": str(exc)})

    async def aclose(self) -> None:
        self._http.close()
        self._uploads.close()

    async def call(self, fn: Callable[[httpx.Client], R], *, cut_off: bool = False) -> R:
        """`fn` with the link's HTTP client, on a worker thread of its own (a short
        request: the retention calls of :mod:`proxy._lifecycle`).

        With `cut_off` (a call a device's offload waits on: the dedup's link), its requests
        go over connections of their own and, when the loop gives the call up (the device
        left), are cut off as an upload's are (:class:`proxy._gateway_calls.Wire`): its
        thread does not wait for a silent gateway until the timeout.
        """
        loop = asyncio.get_running_loop()
        if not cut_off:
            return await loop.run_in_executor(
                self._threads, functools.partial(fn, self._http.client)
            )
        wire = Wire()
        job = loop.run_in_executor(self._threads, functools.partial(self._wired, fn, wire))
        try:
            return await job
        except BaseException:
            wire.cut()
            job.add_done_callback(_retrieved)
            raise

    def _wired(self, fn: Callable[[httpx.Client], R], wire: Wire) -> R:
        """(worker thread) `fn` over connections of its own that `wire` learns."""
        self._wires.wire = wire
        try:
            return fn(self._uploads)
        finally:
            self._wires.wire = None

    def _on_wire(self, request: httpx.Request) -> None:
        """(worker thread) httpx's request hook: the requests of a call that may be cut off
        (the SCRAM login's legs too) tell its :class:`Wire` their connection."""
        wire: Wire | None = getattr(self._wires, "wire", None)
        if wire is not None:
            request.extensions["trace"] = wire.trace

    async def upload(
        self,
        endpoint: str,
        *,
        topic: str,
        size: int,
        pieces: AsyncIterator[bytes],
        headers: tuple[tuple[str, str], ...],
        ttl: int | None,
        auth: httpx.Auth | None,
        peer: str,
        on_bytes: Callable[[int], None] = lambda n: None,
        message_id: MessageId | None = None,
        trace: TraceContext | None = None,
        on_exchanged: Callable[[], None] = lambda: None,
    ) -> Stored:
        """Stream `size` bytes from `pieces` to `message_id` (a new one by default); what
        the gateway stored.

        The SHA-256 is taken while the bytes pass (on the worker thread) and must equal the
        one the gateway answers (it takes its CRC-32C in the same pass). `peer` is the
        device's address, forwarded; `trace` goes as `traceparent` / `tracestate`.
        `on_exchanged` is called (on the loop) once the HTTP exchange has ended, which for
        a refusal is before `pieces` has ended: the rest of a refused body is the device's
        to send, not the gateway's to take.

        Raises:
            TransferFailed: no answer, a refusal, or a stored payload that is not the bytes
                sent. An error from `pieces` (the client went silent or away) propagates
                and the gateway, cut off mid-body, keeps nothing.
        """
        message_id = message_id or MessageId.new()
        url = f"{endpoint}/msg/{message_id}"
        params: dict[str, str | int] = {"topic": topic}
        if ttl:
            params["ttl"] = ttl
        fields = header_fields(headers)
        request = Upload(
            url,
            params,
            [
                ("Content-Type", RAW_CONTENT_TYPE),
                ("Content-Length", str(size)),
                (FORWARDED_FOR, peer),
                *(("X-Offload-Header", field) for field in fields),
                *(trace.pairs() if trace is not None else ()),  # W3C Trace Context
            ],
            size,
        )
        loop = asyncio.get_running_loop()
        channel: FromLoop[bytes] = FromLoop(loop, DEPTH)
        wire = Wire()
        job = loop.run_in_executor(
            self._threads,
            functools.partial(
                upload,
                self._uploads,
                request,
                auth=auth,
                pieces=channel,
                idle=self._idle,
                wire=wire,
                answer=ANSWER_TIMES * self._timeout,  # beyond a silent gateway's timeout
            ),
        )
        job.add_done_callback(lambda _: on_exchanged())
        try:
            try:
                async for piece in pieces:
                    await channel.put(piece)
                    on_bytes(len(piece))
            except Stopped:
                pass  # the upload ended early: its own error says why
            try:
                sha256 = await job
            except (Stopped, TimeoutError) as exc:
                raise TransferFailed(f"upload to {url} broke off: {exc!r}") from exc
        except BaseException:
            channel.abort()  # the thread sends no more of the body
            wire.cut()  # nor waits on the gateway: its connection is reset (if still open)
            job.add_done_callback(_retrieved)
            raise
        return Stored(url, size, sha256, message_id)

    @contextlib.asynccontextmanager
    async def fetch(
        self,
        ref: Placeholder,
        auth: httpx.Auth | None,
        peer: str,
        trace: TraceContext | None = None,
        piece: int = FETCH_PIECE,
    ) -> AsyncIterator[Fetch]:
        """The payload, once the answer is 200 with the declared size; `peer` is the
        receiving device's address, forwarded; `trace` goes with the GET as `traceparent` /
        `tracestate` (not with a redirect to the store); `piece`: the most of it in one
        piece (larger for a fetch that nothing slow reads: fewer hops to the loop).

        Raises:
            TransferFailed: another answer, another length, no answer, behind the pace.
        """
        loop = asyncio.get_running_loop()
        channel: ToLoop[FetchItem] = ToLoop(loop, FETCH_DEPTH)
        get = PayloadGet(
            self._http.reader,
            ref.payload_url,
            ref.size,
            auth,
            self._store_of,
            peer,
            trace.pairs() if trace is not None else (),
            piece,
            self._pace,
            functools.partial(self._cutting, "payload"),
        )
        job = loop.run_in_executor(self._threads, functools.partial(get.run, channel))
        job.add_done_callback(_retrieved)
        try:
            fetched = Fetch(channel, ref.payload_url)
            await fetched.opened()
            yield fetched
        finally:
            channel.stop()

    async def stat(
        self,
        ref: Placeholder,
        auth: httpx.Auth | None,
        peer: str,
        trace: TraceContext | None = None,
    ) -> Stat:
        """What the gateway holds for `ref`, asked with the receiving device's own login
        (`HEAD`: :mod:`proxy._stat`); `peer` and `trace` as for :meth:`fetch`.

        Raises:
            TransferFailed: no answer (none whole within the pace), or not 200 (the device
                may not read it, it is gone).
        """
        traced = trace.pairs() if trace is not None else ()
        call = functools.partial(
            payload_stat, self._http.reader, ref.payload_url, auth, peer, traced, self._pace
        )
        try:
            return await asyncio.get_running_loop().run_in_executor(self._threads, call)
        except CutOff as exc:
            self._cutting("head", exc)
            raise


def _retrieved(job: asyncio.Future[Any]) -> None:
    """A worker's result nobody awaits any more (its error was someone else's to report)."""
    if not job.cancelled():
        job.exception()
