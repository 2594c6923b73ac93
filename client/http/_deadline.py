"""A pace for one fetch: a grace period, then a minimum average rate, else it is cut off.

Per-read timeouts (`http_timeout`) never end a body that trickles: an origin that sends a
byte every 20 s keeps every read under a minute and a fetch thread busy for ever (issue 26
item 4). So a fetch also has a :class:`Pace`: after `floor` seconds (`fetch_deadline`), the
bytes received must keep up with `min_rate` bytes per second (`fetch_min_rate`) counted
from the start, so a payload of `size` bytes is due, whole, `floor + size / min_rate`
seconds after the fetch began; a trickle is caught soon after the floor, whatever size its
placeholder declared. A watchdog thread checks the count only when it could first fall
behind, and when it does, shuts down the connection's socket: that wakes the read blocked
on it at once, and whatever the read then raises (a reset, a body cut short) is reported
as the pace, a final :class:`FetchError`, not a transient failure to retry.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType

import httpx

from ..core._exceptions import FetchError, TransferError, UploadError

#: Response extension: the socket a response's body is read from, when the transport knows it
#: (:mod:`client.http._urllib3` sets it; httpx's own transport offers `network_stream`).
SOCKET = "offload.socket"
#: Request extension: called with the connection's socket before the answer's head is read,
#: so a fetch whose origin trickles its status line and headers can be cut off too
#: (:mod:`client.http._urllib3` calls it; without it only the body is covered).
ON_SOCKET = "offload.on_socket"
#: Least seconds between two checks of one fetch.
MIN_CHECK = 0.25
#: The slowest an upload's body may go on average, after `timeout` seconds: a gateway (or
#: a path) that takes less is cut off. The gateway's own floor for its clients
#: (`OFFLOAD_MIN_BODY_RATE`); per-write timeouts alone never end a peer that reads a byte
#: every few seconds (though the kernel seldom wakes a writer for so little room).
UPLOAD_MIN_RATE = 1024
#: An upload's whole answer is due this many `http_timeout`s after its body.
ANSWER_TIMES = 1.5
#: httpx trace events that hand over a new connection's stream (TCP, then TLS over it).
_CONNECTED = frozenset({"connection.connect_tcp.complete", "connection.start_tls.complete"})

OnBytes = Callable[[int, int | None], None]


@dataclass(frozen=True, slots=True)
class Pace:
    """How slow a fetch may be: `floor` seconds of grace, then `min_rate` bytes/s on average.

    Args:
        floor: seconds any fetch may take before its rate is checked (`fetch_deadline`).
        min_rate: the slowest average rate, in bytes per second since the fetch began,
            that is waited for after the floor (`fetch_min_rate`).
    """

    floor: float
    min_rate: int

    def due(self, size: int) -> float:
        """Seconds after its start by which a payload of `size` bytes must be in, whole."""
        return self.floor + size / self.min_rate

    def behind(self, received: int, elapsed: float) -> bool:
        """Whether `received` bytes after `elapsed` seconds is slower than allowed."""
        return elapsed > self.due(received)


def _socket_of(response: httpx.Response) -> socket.socket | None:
    sock = response.extensions.get(SOCKET)
    if isinstance(sock, socket.socket):
        return sock
    stream = response.extensions.get("network_stream")  # httpx's own transport (httpcore)
    extra = getattr(stream, "get_extra_info", None)
    sock = extra("socket") if extra is not None else None
    return sock if isinstance(sock, socket.socket) else None


class Watchdog:
    """Cuts a fetch off when it falls behind its pace; a context manager around the fetch.

    Inside, :meth:`watch` each response as it arrives (each redirect's too) and count the
    bytes through :meth:`counting`. Leaving the block after the fetch was cut off turns any
    exception into one :class:`FetchError` naming the pace; leaving it normally (the last
    byte arrived first) keeps the result.

    An upload is watched the same way, its bytes sent counted, and once its body is
    sent (:meth:`sent`) its answer is due within `answer` seconds, however it trickles.

    Args:
        url: the URL fetched (for the error).
        pace: the pace; None: no watchdog.
        error: the error raised when it was cut off (an upload's: UploadError).
        answer: seconds an answer may take, whole, after :meth:`sent`.
        names: what the pace's two figures are called in the error.
    """

    def __init__(
        self,
        url: str,
        pace: Pace | None,
        *,
        error: type[TransferError] = FetchError,
        answer: float | None = None,
        names: tuple[str, str] = ("fetch_min_rate", "fetch_deadline"),
    ) -> None:
        self._url = url
        self._pace = pace
        self._error = error
        self._answer = answer
        self._names = names
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._received = 0
        self._start = time.monotonic()
        self._sent_at: float | None = None  # seconds after the start the body was sent
        self._aside_at: float | None = None  # when the time set aside began (:meth:`aside`)
        self._done = threading.Event()
        self.cut_off: str | None = None  # why, once it was
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Watchdog:
        if self._pace is not None:
            self._start = time.monotonic()
            self._thread = threading.Thread(
                target=self._run, args=(self._pace,), name="offload-fetch-pace", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        with self._lock:
            self._sock = None
            why = self.cut_off
        if self._thread is not None:
            self._thread.join()
        if why is not None and isinstance(ev, Exception):
            # A timeout, as callers tell them (not the broken read it caused: `ev`), in its
            # own words (the CLI prints them).
            raise self._error(self._url, why) from TimeoutError(why)

    def counting(self, on_bytes: OnBytes | None) -> OnBytes:
        """`on_bytes` (if any), counting the bytes received for the pace on the way."""

        def count(done: int, total: int | None) -> None:
            self._received = done  # one int written by the reader, read by the watchdog
            if on_bytes is not None:
                on_bytes(done, total)

        return count

    def watch(self, response: httpx.Response) -> None:
        """The socket to shut down is now `response`'s (shut at once if already cut off).

        One the response does not name stays watched: the one the transport handed over
        before the head (:data:`ON_SOCKET`). urllib3's connection lets go of its socket
        when the answer says `Connection: close` (http.client hands it to the response),
        and forgetting the known one for that let such an answer trickle on unwatched.
        """
        sock = _socket_of(response)
        why = self.attach(sock) if sock is not None else self.cut_off
        if why is not None:
            raise self._error(self._url, why) from TimeoutError(why)

    def attach(self, sock: socket.socket | None) -> str | None:
        """The socket to shut down is now `sock`: shut at once, saying why, if already cut off.

        Also the transport's :data:`ON_SOCKET` hook: called before an answer's head is read,
        so a head that trickles in is cut off like a body (never raises there).
        """
        with self._lock:
            self._sock = sock
            why = self.cut_off
        if why is not None:
            self._shutdown(sock)
        return why

    def timing(self, request: httpx.Request) -> httpx.Request:
        """`request`, its answer's head timed too: the transport hands this watchdog the
        connection's socket before it reads the head (:data:`ON_SOCKET`)."""
        request.extensions[ON_SOCKET] = self.attach
        return request

    @contextlib.contextmanager
    def aside(self) -> Iterator[None]:
        """Time spent inside does not count: the reader waits on whoever takes its bytes
        (a consumer that reads slowly), not on the peer whose pace this is."""
        self._aside_at = at = time.monotonic()
        try:
            yield
        finally:
            self._start += time.monotonic() - at  # before the mark goes: never counted twice
            self._aside_at = None

    def _elapsed(self) -> float:
        """Seconds counted so far (the watchdog thread: while time is set aside, up to
        its start)."""
        aside = self._aside_at
        return (time.monotonic() if aside is None else aside) - self._start

    def sent(self) -> None:
        """The body is sent: the answer is due within `answer` seconds from now."""
        self._sent_at = time.monotonic() - self._start

    def _due(self, pace: Pace, received: int) -> float:
        sent_at = self._sent_at
        if sent_at is None or self._answer is None:
            return pace.due(received)
        return min(pace.due(received), sent_at + self._answer)

    def _run(self, pace: Pace) -> None:
        while True:
            received = self._received
            wait = max(self._due(pace, received) - self._elapsed(), MIN_CHECK)
            if self._done.wait(wait):
                return
            received = self._received
            elapsed = self._elapsed()
            if elapsed > self._due(pace, received):
                break
        rate, floor = self._names
        if self._sent_at is not None and self._answer is not None:
            why = f"no whole answer {self._answer:g} s after the body was sent: cut off"
        else:
            why = (
                f"{received} bytes in {elapsed:.1f} s: slower than {rate} "
                f"({pace.min_rate} bytes/s) after {floor} ({pace.floor:g} s): cut off"
            )
        with self._lock:
            self.cut_off = why
            sock = self._sock
        self._shutdown(sock)

    def trace(self, event: str, info: dict[str, object]) -> None:
        """httpx's `trace` request extension: each new connection's socket is attached
        (a request over httpx's own transport, where no response is there to watch yet)."""
        if event in _CONNECTED:
            extra = getattr(info.get("return_value"), "get_extra_info", None)
            sock = extra("socket") if extra is not None else None
            if isinstance(sock, socket.socket):
                self.attach(sock)

    @staticmethod
    def _shutdown(sock: socket.socket | None) -> None:
        if sock is not None:
            with contextlib.suppress(OSError):
                # The plain socket's: ssl.SSLSocket's own drops the TLS state under the
                # thread still reading it.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)


def upload_watchdog(url: str, timeout: float) -> Watchdog:
    """The watchdog of an upload to `url` (:meth:`Watchdog.trace` on its request, its body
    through :func:`counted_body`): the body at :data:`UPLOAD_MIN_RATE` on average after
    twice `timeout`, the whole answer within :data:`ANSWER_TIMES` `timeout` after the body.
    Both only beyond what the per-operation `timeout` ends first (a silent peer: its own
    words, `timed out`), for what it never ends (a peer that trickles)."""
    pace = Pace(2 * timeout, UPLOAD_MIN_RATE)
    names = (f"{UPLOAD_MIN_RATE} bytes/s", "twice http_timeout")
    return Watchdog(url, pace, error=UploadError, answer=ANSWER_TIMES * timeout, names=names)


def counted_body(pieces: Iterator[bytes], watchdog: Watchdog) -> Iterator[bytes]:
    """`pieces`, each counted for `watchdog` once handed on; their end marks the body sent."""
    count = watchdog.counting(None)
    done = 0
    for piece in pieces:
        yield piece
        done += len(piece)
        count(done, None)
    watchdog.sent()
