"""uvicorn's HTTP protocol with a deadline for every request head (slow loris on headers).

uvicorn has no timeout for receiving a request's head. Its keep-alive timer runs only
between requests and any byte cancels it, so a client that connects and sends nothing, or
sends a request line and then a header every few seconds, holds its connection (a file
descriptor and a protocol object) for as long as it likes: 1,100 such connections to a
gateway were all still open 32 s later, and enough of them exhaust its descriptors, after
which it accepts nobody. ASGI middleware cannot help: it runs once the head is complete.

Nor does it bound a head's size with httptools (its h11 protocol has
`h11_max_incomplete_event_size`): one connection sending header lines at full speed for
6 s took a gateway to 3.4 GB of memory (VmHWM), all of it kept by the parser's callbacks;
trailer lines after a chunked body are kept the same way (315 MB sent, 315 MB more held).

Here a connection must deliver each request head (request line and headers) within
`OFFLOAD_HEADER_TIMEOUT` seconds, counted from the connection for the first request and
from the head's first byte for the next ones; otherwise it is answered 408 (when a head
was begun) and closed. A request whose request line, headers and trailers exceed
`MAX_HEAD_BYTES` is answered 431 (unless its answer has begun) and closed; they are counted
as the parser hands them over and checked after each read, so at most one read beyond the
limit is held. The parser hands a request line, header value or trailer over only once it
ends, and keeps what it has so far (one endless header value took a gateway to 150-350 MB
in 10 s, the parser copying it over and over): so the reads inside a request that bring
neither a head's end nor body bytes are counted too, raw, against the same limit. Idle
time between requests stays uvicorn's keep-alive timeout. A request
body has its own limits (`gateway/middleware/_limits.py`): this covers what comes before and after.

A connection the server closes, for any of these reasons or uvicorn's own, is watched until
its peer has taken the answer (gateway/middleware/_closing.py): over TLS `close()` alone
would read and decrypt all a peer sends for up to 30 s.

The timeouts reach the protocol through the lifespan state (`STATE_KEY` and `STALL_KEY`,
which `gateway._app` fills from the settings): uvicorn hands each connection's protocol
that state, in every worker process, so no global is set.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ._closing import ClosingTransport

log = logging.getLogger("gateway")

#: Lifespan state key holding the head timeout in seconds (0: none).
STATE_KEY = "offload.header_timeout"
DEFAULT_HEADER_TIMEOUT = 10.0
#: Largest request head (request line and headers) taken; gateway/cli.py gives h11 the same
#: (`h11_max_incomplete_event_size`). The client library sends at most 8 KiB of
#: `X-Offload-Header` fields (client/http/_upload_forms.py), nginx's default total is 32 KiB.
MAX_HEAD_BYTES = 64 * 1024
#: Lifespan state key holding the seconds a closing connection's peer may take none of its
#: answer (the send idle timeout, gateway/middleware/_closing.py).
STALL_KEY = "offload.send_idle_timeout"
DEFAULT_STALL = 60.0


#: Bytes read from a client's socket at a time, at most: a request body comes to the app
#: in pieces up to this large (uvloop's own reads stop at 256,000 bytes). Just under
#: gateway/cli.py's mmap threshold, so the buffer comes from the heap.
READ_SIZE = (1 << 20) - 4096
_buffers = threading.local()  # each event loop's thread: one read buffer for all its sockets


def _read_buffer() -> memoryview:
    buffer: memoryview | None = getattr(_buffers, "buffer", None)
    if buffer is None:
        buffer = _buffers.buffer = memoryview(bytearray(READ_SIZE))
    return buffer


def _answer(status: str, detail: str) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    head = (
        f"HTTP/1.1 {status}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class HeadDeadlineProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` (uvicorn's default where httptools is installed, as with
    `uvicorn[standard]`) that closes a connection whose request head does not arrive in time
    or grows too large."""

    _head_timer: asyncio.TimerHandle | None = None
    _head_begun = False
    _head_bytes = 0  # request line, header and trailer bytes of the current request
    _in_message = False  # between a request's first byte and its end
    _moved = False  # the read being parsed ended a head or brought body bytes
    _quiet_bytes = 0  # bytes of the reads since the last that did, inside a message
    _refused = False  # answered 431: the parser's later callbacks are ignored
    _closing: ClosingTransport  # the transport as uvicorn's protocol is handed it

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        stall = self._seconds(STALL_KEY, DEFAULT_STALL)
        self._closing = ClosingTransport(transport, self.loop, stall)
        super().connection_made(self._closing)
        self._arm()

    def data_received(self, data: bytes) -> None:
        self._moved = False
        super().data_received(data)
        # A read that neither ended a head nor brought body bytes, inside a message (its
        # first read too): the parser keeps what it got (an unfinished request line,
        # header value or trailer, or a chunk extension) and hands it over only when it
        # ends, so the head counts (`on_url`, `on_header`) never see it. Counted here, raw.
        self._quiet_bytes = (
            self._quiet_bytes + len(data) if self._in_message and not self._moved else 0
        )
        over = max(self._head_bytes, self._quiet_bytes)
        if over > MAX_HEAD_BYTES and not self.transport.is_closing():
            self._refuse_head()

    def _refuse_head(self) -> None:
        """Answer 431 (when it would answer the request at hand) and close."""
        self._disarm()
        self._refused = True
        detail = f"request line, headers and trailers over {MAX_HEAD_BYTES} bytes"
        log.info("%s: %s: 431", self.client, detail)
        if self._may_answer():
            self.transport.write(_answer("431 Request Header Fields Too Large", detail))
        self.transport.close()

    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()
        self._head_begun = True
        self._head_bytes = 0
        self._in_message = True
        if self._head_timer is None:  # a later request on a kept-alive connection
            self._arm()

    def on_url(self, url: bytes) -> None:
        if self._refused:
            return
        self._head_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._head_bytes += len(name) + len(value) + 4  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        if self._head_bytes > MAX_HEAD_BYTES:
            # A head over the limit that ended in this read: refused before uvicorn makes
            # it a request (checking only after the read, as for a head still coming, let
            # the app run it and the 431 was never sent: it was no longer the request at
            # hand). The rest of this read goes to no callback (`_refused`).
            self._refuse_head()
            return
        self._disarm()
        self._head_begun = False
        self._moved = True
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        # uvicorn appends each body piece to a bytearray and its receive() hands the app
        # `bytes(...)` of it: two copies of every byte uploaded. Into an empty buffer the
        # piece goes as it is instead (`b"" + piece` is the piece, `bytes(piece)` too);
        # pieces that arrive before the app asks are still joined (bench/RESULTS.md, "The
        # body's copies").
        if self._refused:
            return
        self._moved = True
        cycle = self.cycle
        if not cycle.body:
            cycle.body = b""  # type: ignore[assignment]
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._in_message = False
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        if not self._may_answer():
            # Bytes that are no request came behind one whose answer is still to come
            # (more than its Content-Length): uvicorn's 400 now would be taken for that
            # answer, its upload stored and its client told it failed. That request gets
            # its own answer, the connection closes after it, and nothing more is read.
            log.info("%s: %s (after a request still being answered)", self.client, msg)
            self.cycle.keep_alive = False
            self.transport.pause_reading()
            return
        super().send_400_response(msg)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._closing.lost()
        super().connection_lost(exc)

    def _may_answer(self) -> bool:
        """Whether an error answer would answer the request at hand, not land inside the
        answer to an earlier one still under way (a pipelined head behind it)."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return True
        # Its own trailers: inside its message, no new head begun behind it.
        return self._in_message and not self._head_begun and not cycle.response_started

    def _seconds(self, key: str, default: float) -> float:
        value = self.app_state.get(key, default)
        return float(value) if isinstance(value, int | float) else default

    def _arm(self) -> None:
        timeout = self._seconds(STATE_KEY, DEFAULT_HEADER_TIMEOUT)
        if timeout > 0:
            self._head_timer = self.loop.call_later(timeout, self._expired, timeout)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _expired(self, timeout: float) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_begun and self._may_answer():
            detail = f"request head (request line and headers) not received within {timeout:g} s"
            log.info("%s: %s: 408", self.client, detail)
            self.transport.write(_answer("408 Request Timeout", detail))
        self.transport.close()


class GatewayHttpProtocol(asyncio.BufferedProtocol):
    """What `offload-gateway` serves HTTP/1.1 with: a :class:`HeadDeadlineProtocol` whose
    socket is read as a buffered protocol (uvicorn's `http=`; it takes the same arguments).

    Each read goes into one buffer of READ_SIZE that all the connections of an event loop
    share: a read is parsed at once, and the parser copies what it keeps (httptools hands
    over each body piece as a new `bytes`). So a request body reaches the app in pieces of
    up to 1 MiB rather than uvloop's 256,000 bytes, with one copy fewer (uvloop's own
    `bytes` of each read) and a quarter of the passes through the ASGI receive chain
    (bench/RESULTS.md, "Round 14"). A wrapper, not a subclass: uvloop reads into a
    protocol's buffer only when the protocol is no `asyncio.Protocol`, and uvicorn's is.
    """

    __slots__ = ("http",)

    def __init__(self, **kwargs: Any) -> None:
        self.http = HeadDeadlineProtocol(**kwargs)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.http.connection_made(transport)  # type: ignore[arg-type]

    def get_buffer(self, sizehint: int) -> memoryview:
        return _read_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.http.data_received(_read_buffer()[:nbytes])  # type: ignore[arg-type]

    def eof_received(self) -> None:
        self.http.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.http.connection_lost(exc)

    def pause_writing(self) -> None:
        self.http.pause_writing()

    def resume_writing(self) -> None:
        self.http.resume_writing()
