"""The store's HTTP on the event loop: presigned GETs of objects, presigned PUTs of small
ones, over asyncio, h11 for the heads.

Why: read in a transfer thread (urllib3 under the MinIO SDK), every piece of a proxied
download crossed from that thread to the event loop, and the two threads took the GIL from
each other for each batch; on two cores shared with the store that was the gateway's cost
over nginx (bench/RESULTS.md, "Issue 31"). Here the store's socket is one more connection of
the event loop: each piece goes from the store's socket to the client's in one callback and
one task step, with no thread. The small writes of every upload's commit (its sidecar and
its id index, a few hundred bytes of JSON each) go the same way: through the SDK in a store
thread they cost a thread hop and urllib3's, http.client's and the SDK's Python each, about
a fifth of a small upload's gateway CPU (bench/RESULTS.md, "Round 16").

Only what those need: GET and PUT, HTTP/1.1, Content-Length framed answers (S3's always
are), idle connections kept for the next request. Signing is the presigned URL's (standard
SigV4 query signing, on every S3 store); TLS is the default context's (the system's CAs,
`SSL_CERT_FILE` / `SSL_CERT_DIR` as for the store's other requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11

from ._base import StoreError
from ._pool import KeptConnections, content_length, keeps_alive
from ._store_connection import StoreConnection

#: Idle connections kept per store, and for how long (under common keep-alive timeouts).
KEEP = 16
KEEP_ALIVE = 4.0
#: Most of an answer's body a PUT reads (S3's answers to one are empty, or an error
#: document); a longer one is not read, and its connection not kept.
MAX_ANSWER = 64 * 1024
#: Answers retried (as the store's other requests are, `gateway.storage._s3`).
RETRY_STATUS = frozenset({500, 502, 503, 504})
RETRIES = 2


@dataclass(frozen=True, slots=True)
class _Where:
    """Where a presigned URL points: its connection's origin, and the request target."""

    scheme: str
    host: str
    port: int
    netloc: str
    target: str

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{self.netloc}"

    @classmethod
    def of(cls, url: str) -> _Where:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        return cls(parts.scheme, parts.hostname or "", port, parts.netloc, target)


class Body:
    """An answer's body: an async iterator of the pieces as they arrive; `close` (sync,
    idempotent) gives the connection back when read to the end, else drops it."""

    def __init__(
        self, reads: AsyncStoreHttp, origin: str, conn: StoreConnection, length: int, *, keep: bool
    ) -> None:
        self._reads = reads
        self._origin = origin
        self._conn: StoreConnection | None = conn
        self._remaining = length
        self._keep = keep
        self._on_close: list[Callable[[], None]] = []
        self._on_piece: Callable[[], None] | None = None

    def on_piece(self, callback: Callable[[], None]) -> None:
        """Call `callback` for each piece handed on."""
        self._on_piece = callback

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call `callback` (never raising) once the body is closed."""
        if self._conn is None:
            callback()
        else:
            self._on_close.append(callback)

    def __aiter__(self) -> Body:
        return self

    async def __anext__(self) -> memoryview:
        conn = self._conn
        if conn is None or not self._remaining:
            self.close()
            raise StopAsyncIteration
        try:
            piece = await conn.read(self._remaining, self._reads.read_timeout)
        except TimeoutError as exc:
            self.close()
            raise StoreError("the store sent nothing within the read timeout") from exc
        except BaseException:
            self.close()
            raise
        if not piece:
            self.close()
            raise StoreError("the store's answer was cut short")
        self._remaining -= len(piece)
        if self._on_piece is not None:
            self._on_piece()
        return piece

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._remaining or not self._keep:  # not read to the end: never drained
            conn.close()
        else:
            conn.shed()
            self._reads.release(self._origin, conn)
        callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            callback()


class AsyncStoreHttp:
    """GETs and PUTs of presigned URLs on the running event loop, connections kept per
    origin.

    Args:
        connect_timeout: seconds to connect (and for TLS to set up).
        read_timeout: seconds to wait for the store's next bytes.
    """

    def __init__(self, *, connect_timeout: float, read_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._ssl: ssl.SSLContext | None = None
        self._kept = _kept()
        self._loop: asyncio.AbstractEventLoop | None = None

    def release(self, origin: str, conn: StoreConnection) -> None:
        self._kept.release(origin, conn)

    async def _open(self, where: _Where) -> tuple[StoreConnection, bool]:
        """A connection to `where`'s origin: a kept one (True) or a new one (False)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that made them
            self._kept, self._loop = _kept(), loop
        conn = self._kept.take(where.origin)
        if conn is not None:
            return conn, True
        return await self._connect(where.scheme, where.host, where.port), False

    async def _connect(self, scheme: str, host: str, port: int) -> StoreConnection:
        if scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await asyncio.get_running_loop().create_connection(
                    StoreConnection, host, port, ssl=self._ssl if scheme == "https" else None
                )
        except (TimeoutError, OSError) as exc:  # SSLError is an OSError
            raise StoreError(f"cannot connect to the store at {host}:{port}: {exc!r}") from exc
        return conn

    async def get(self, url: str, *, start: int = 0, length: int | None = None) -> Body:
        """The object (or `length` bytes from `start`) at a presigned GET URL.

        Raises:
            FileNotFoundError: the store answered 404.
            StoreError: the store is unreachable, failed, or answered something else.
        """
        where = _Where.of(url)
        headers = [("Host", where.netloc), ("Accept-Encoding", "identity")]
        if start or length is not None:
            end = "" if length is None else str(start + length - 1)
            headers.append(("Range", f"bytes={start}-{end}"))
        request = h11.Request(method="GET", target=where.target, headers=headers)
        for attempt in range(RETRIES + 1):
            conn, kept = await self._open(where)
            try:
                return await self._exchange(request, where.origin, conn)
            except _Retry as exc:
                if attempt == RETRIES:
                    raise StoreError(f"the store answered {exc.status}") from None
                await asyncio.sleep(0.2 * 2**attempt)
            except (ConnectionError, TimeoutError) as exc:
                if not kept:  # else: the store closed a kept connection meanwhile
                    raise StoreError(f"read from the store failed: {exc!r}") from exc
        raise StoreError("the store's kept connections all failed")

    async def put(
        self,
        url: str,
        body: bytes,
        headers: Sequence[tuple[str, str]] = (),
        *,
        retry: bool = True,
    ) -> tuple[int, bytes]:
        """PUT `body` (a small one: it is sent whole) at a presigned PUT URL.

        Returns the store's status and the start of its answer's body (an error document),
        for any status but those retried. With `retry`, 500, 502, 503 and 504 are tried
        again (RETRIES times); a kept connection that the store closed meanwhile is
        always replaced by a new one. A store that does not answer within the timeouts is
        not asked again.

        Raises:
            StoreError: the store is unreachable, failed, or answered malformed.
        """
        where = _Where.of(url)
        fields = [("Host", where.netloc), ("Content-Length", str(len(body))), *headers]
        request = h11.Request(method="PUT", target=where.target, headers=fields)
        for attempt in range(RETRIES + 1):
            conn, kept = await self._open(where)
            try:
                status, answer = await self._put(request, body, where.origin, conn)
            except TimeoutError as exc:  # a store that stalls: not asked again
                raise StoreError("the store did not answer a write in time") from exc
            except ConnectionError as exc:
                if not kept:  # else: the store closed a kept connection meanwhile
                    raise StoreError(f"write to the store failed: {exc!r}") from exc
                continue
            if retry and status in RETRY_STATUS and attempt < RETRIES:
                await asyncio.sleep(0.2 * 2**attempt)
                continue
            return status, answer
        raise StoreError("the store's kept connections all failed")

    async def _put(
        self, request: h11.Request, body: bytes, origin: str, conn: StoreConnection
    ) -> tuple[int, bytes]:
        with _dropped_on_error(conn):
            parser = h11.Connection(h11.CLIENT)
            # One vectored write of head and body, the body not copied (h11's `send` joins
            # what it frames): each write to the store's socket also wakes the store.
            head = parser.send(request) or b""
            framed = parser.send_with_data_passthrough(h11.Data(data=body)) or []
            conn.writelines([head, *framed, parser.send(h11.EndOfMessage()) or b""])
            event = await self._answer_head(parser, conn)
            length = content_length(event)
            if length is None or length > MAX_ANSWER:
                conn.close()  # not read: the connection is not reused
                return event.status_code, b""
            conn.expect(length)
            pieces: list[bytes] = []
            while length:
                piece = await conn.read(length, self.read_timeout)
                if not piece:
                    raise ConnectionResetError("the store's answer was cut short")
                pieces.append(bytes(piece))
                length -= len(piece)
        if keeps_alive(event):
            conn.shed()
            self.release(origin, conn)
        else:
            conn.close()
        return event.status_code, b"".join(pieces)

    async def _answer_head(self, parser: h11.Connection, conn: StoreConnection) -> h11.Response:
        """The store's answer to the request just sent (1xx answers skipped)."""
        while True:
            parser.receive_data(await conn.head(self.connect_timeout + self.read_timeout))
            event = parser.next_event()
            if isinstance(event, h11.Response):
                return event
            if not isinstance(event, h11.InformationalResponse):
                raise StoreError("a malformed answer head from the store")

    async def _exchange(self, request: h11.Request, origin: str, conn: StoreConnection) -> Body:
        with _dropped_on_error(conn):
            parser = h11.Connection(h11.CLIENT)
            conn.write(parser.send(request) or b"")
            conn.write(parser.send(h11.EndOfMessage()) or b"")
            event = await self._answer_head(parser, conn)
        status = event.status_code
        if status not in (200, 206):
            conn.close()  # an error body is not read: the connection is not reused
            if status == 404:
                raise FileNotFoundError(request.target.decode())
            if status in RETRY_STATUS:
                raise _Retry(status)
            raise StoreError(f"the store answered {status}")
        length = content_length(event)
        if length is None:
            conn.close()
            raise StoreError("the store's answer has no Content-Length")
        conn.expect(length)
        return Body(self, origin, conn, length, keep=keeps_alive(event))

    def close(self) -> None:
        self._kept.close()


@contextlib.contextmanager
def _dropped_on_error(conn: StoreConnection) -> Iterator[None]:
    """Close `conn` when the block fails (a half-done exchange leaves it unusable); a
    malformed answer becomes a StoreError."""
    try:
        yield
    except h11.RemoteProtocolError as exc:
        conn.close()
        raise StoreError(f"a malformed answer from the store: {exc}") from exc
    except BaseException:
        conn.close()
        raise


class _Retry(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _kept() -> KeptConnections[str, StoreConnection]:
    return KeptConnections(size=KEEP, keep_alive=KEEP_ALIVE)
