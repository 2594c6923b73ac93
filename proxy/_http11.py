"""An httpx transport on the proxy's own event loop: h11 for the heads, the payload bytes
written and read on asyncio streams in pieces of up to 1 MiB.

Why: through httpx's default transport a 64 MiB fetch is 1,024 reads of 64 KiB, each a round
through anyio and httpcore's layers, and an upload awaits each piece's drain; on two shared
cores that per-piece work is what made the proxy's 64 MiB transfer slower than the library's
(bench/RESULTS.md, "Proxy: the issue's table"). The library took the same step for its
fetches (client/http/_urllib3.py). httpx stays in front: auth flows (SCRAM), timeouts and the
caller's redirect rules are unchanged; with a proxy in the environment the gateway link keeps
httpx's own transport (:func:`proxy._gateway.http_client`), which honours it.

Only what the gateway link sends: HTTP/1.1, no redirects or retries here, no content decoding
(the callers refuse codings). Errors are httpx's, so callers catch one family.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import Any

import h11
import httpx

from client.http._pool import KeptConnections, content_length, keeps_alive

#: Most bytes taken from the socket per body piece (and the stream reader's limit).
PIECE = 1 << 20
#: Largest response head accepted (the gateway's are under 2 KiB).
MAX_HEAD = 65536
#: Idle connections kept per origin, and for how long (under uvicorn's 5 s keep-alive).
POOL_SIZE = 20
KEEP_ALIVE = 4.0
#: Bytes a connection may hold unsent before an upload waits for the socket.
HIGH_WATER = 256 * 1024

Origin = tuple[str, str, int]


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @property
    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.transport.is_closing()

    def close(self) -> None:
        self.writer.close()


def _timeout(request: httpx.Request, kind: str) -> float | None:
    limits: dict[str, float | None] = request.extensions.get("timeout", {})
    return limits.get(kind)


async def _read(request: httpx.Request, conn: _Connection, size: int) -> bytes:
    try:
        async with asyncio.timeout(_timeout(request, "read")):
            return await conn.reader.read(size)
    except TimeoutError as exc:
        raise httpx.ReadTimeout("no answer within the read timeout", request=request) from exc
    except OSError as exc:
        raise httpx.ReadError(repr(exc), request=request) from exc


class _Body(httpx.AsyncByteStream):
    """A response body: Content-Length framed bodies read straight from the stream reader,
    others (chunked, close-delimited: error answers) through h11."""

    def __init__(
        self,
        transport: H11Transport,
        origin: Origin,
        conn: _Connection,
        request: httpx.Request,
        parser: h11.Connection,
        length: int | None,
        keep_alive: bool,
    ) -> None:
        self._transport = transport
        self._origin = origin
        self._conn: _Connection | None = conn
        self._request = request
        self._parser = parser
        self._length = length
        self._done = False
        self._keep_alive = keep_alive

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        assert conn is not None, "a body is read once"
        if self._length is not None:
            remaining = self._length
            while remaining:
                # A read of what is buffered returns without a turn of the loop: one is given
                # per piece, so other connections' small packets never wait behind a body.
                await asyncio.sleep(0)
                piece = await _read(self._request, conn, min(remaining, PIECE))
                if not piece:
                    raise httpx.RemoteProtocolError("body cut short", request=self._request)
                remaining -= len(piece)
                yield piece
            self._done = True
            return
        parser = self._parser
        while True:
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc), request=self._request) from exc
            if event is h11.NEED_DATA:
                parser.receive_data(await _read(self._request, conn, PIECE))
            elif isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._done = parser.their_state is h11.DONE and parser.our_state is h11.DONE
                return
            else:  # ConnectionClosed before the end
                raise httpx.RemoteProtocolError("body cut short", request=self._request)

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._reusable():
            self._transport._kept.release(self._origin, conn)
        else:  # not read to its end: the rest is never drained, the connection not reused
            conn.close()

    def _reusable(self) -> bool:
        if self._length is None:  # h11 read it: its states say whether the connection lasts
            return self._parser.our_state is h11.DONE and self._parser.their_state is h11.DONE
        return self._keep_alive


class H11Transport(httpx.AsyncBaseTransport):
    """Sends httpx requests over pooled asyncio connections (see the module's doc).

    Args:
        verify: TLS verification as httpx takes it (True: httpx's CA bundle, False: none,
            or an SSL context).
    """

    def __init__(self, *, verify: ssl.SSLContext | bool = True) -> None:
        self._verify = verify
        self._ssl: ssl.SSLContext | None = None
        self._kept: KeptConnections[Origin, _Connection] = KeptConnections(
            size=POOL_SIZE, keep_alive=KEEP_ALIVE
        )

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = (
                self._verify
                if isinstance(self._verify, ssl.SSLContext)
                else httpx.create_ssl_context(verify=self._verify)
            )
        return self._ssl

    async def _connect(self, request: httpx.Request, origin: Origin) -> _Connection:
        scheme, host, port = origin
        try:
            async with asyncio.timeout(_timeout(request, "connect")):
                reader, writer = await asyncio.open_connection(
                    host,
                    port,
                    limit=PIECE,
                    ssl=self._context() if scheme == "https" else None,
                )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"no connection to {host}:{port}", request=request) from exc
        except OSError as exc:  # refused, unreachable, a TLS failure (SSLError is an OSError)
            raise httpx.ConnectError(repr(exc), request=request) from exc
        return _Connection(reader, writer)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        origin: Origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        replayable = isinstance(request.stream, httpx.ByteStream)  # a body in memory, or none
        # A streamed body (an upload) cannot be sent twice: it gets a fresh connection, never
        # one the server may be closing as it is reused.
        conn = self._kept.take(origin) if replayable else None
        if conn is not None:
            try:
                return await self._exchange(request, origin, conn)
            except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError):
                pass  # the server closed the kept connection meanwhile: once more, fresh
        return await self._exchange(request, origin, await self._connect(request, origin))

    async def _exchange(
        self, request: httpx.Request, origin: Origin, conn: _Connection
    ) -> httpx.Response:
        try:
            parser = h11.Connection(h11.CLIENT)
            await self._send(request, conn, parser)
            return await self._answer(request, origin, conn, parser)
        except BaseException:
            conn.close()
            raise

    async def _send(
        self, request: httpx.Request, conn: _Connection, parser: h11.Connection
    ) -> None:
        headers = list(request.headers.raw)
        if not any(name.lower() == b"host" for name, _ in headers):
            headers.insert(0, (b"Host", request.url.netloc))
        target = request.url.raw_path
        writer = conn.writer
        write_timeout = _timeout(request, "write")
        try:
            head = h11.Request(method=request.method, target=target, headers=headers)
            writer.write(parser.send(head) or b"")
            async for piece in request.stream:  # type: ignore[union-attr]
                if not piece:
                    continue
                data = parser.send_with_data_passthrough(h11.Data(data=piece))
                if data:
                    writer.writelines(data)
                if writer.transport.get_write_buffer_size() > HIGH_WATER:
                    async with asyncio.timeout(write_timeout):
                        await writer.drain()
                else:  # a turn of the loop per piece, as above
                    await asyncio.sleep(0)
            writer.write(parser.send(h11.EndOfMessage()) or b"")
            async with asyncio.timeout(write_timeout):
                await writer.drain()
        except h11.LocalProtocolError as exc:  # a body longer or shorter than declared
            raise httpx.LocalProtocolError(str(exc), request=request) from exc
        except TimeoutError as exc:
            raise httpx.WriteTimeout("the request was not sent in time", request=request) from exc
        except OSError as exc:
            raise httpx.WriteError(repr(exc), request=request) from exc

    async def _answer(
        self, request: httpx.Request, origin: Origin, conn: _Connection, parser: h11.Connection
    ) -> httpx.Response:
        while True:
            try:
                async with asyncio.timeout(_timeout(request, "read")):
                    head = await conn.reader.readuntil(b"\r\n\r\n")
            except TimeoutError as exc:
                raise httpx.ReadTimeout(
                    "no answer within the read timeout", request=request
                ) from exc
            except asyncio.IncompleteReadError as exc:
                raise httpx.RemoteProtocolError("closed before an answer", request=request) from exc
            except asyncio.LimitOverrunError as exc:
                raise httpx.RemoteProtocolError(
                    "an answer head over 1 MiB", request=request
                ) from exc
            except OSError as exc:
                raise httpx.ReadError(repr(exc), request=request) from exc
            if len(head) > MAX_HEAD:
                raise httpx.RemoteProtocolError("an answer head over 64 KiB", request=request)
            try:
                parser.receive_data(head)
                event = parser.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc), request=request) from exc
            if isinstance(event, h11.Response):
                break
            if not isinstance(event, h11.InformationalResponse):  # 1xx: the real one follows
                raise httpx.RemoteProtocolError("a malformed answer head", request=request)
        length = _content_length(event, request)
        # A body framed by its length bypasses h11 (whose parser is not used again): kept
        # alive unless the server says otherwise.
        stream = _Body(self, origin, conn, request, parser, length, keeps_alive(event))
        extensions: dict[str, Any] = {
            "http_version": b"HTTP/1.1",
            "reason_phrase": bytes(event.reason),
        }
        return httpx.Response(
            event.status_code,
            headers=[(bytes(k), bytes(v)) for k, v in event.headers],
            stream=stream,
            extensions=extensions,
        )

    async def aclose(self) -> None:
        self._kept.close()


def _content_length(response: h11.Response, request: httpx.Request) -> int | None:
    """The body's length when it is framed by Content-Length alone; None: chunked or until
    the server closes, read through h11."""
    if request.method == "HEAD" or response.status_code in (204, 304):
        return 0
    return content_length(response)
