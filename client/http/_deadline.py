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
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

import httpx

from ..core._exceptions import FetchError

#: Response extension: the socket a response's body is read from, when the transport knows it
#: (:mod:`client.http._urllib3` sets it; httpx's own transport offers `network_stream`).
SOCKET = "offload.socket"
#: Request extension: called with the connection's socket before the answer's head is read,
#: so a fetch whose origin trickles its status line and headers can be cut off too
#: (:mod:`client.http._urllib3` calls it; without it only the body is covered).
ON_SOCKET = "offload.on_socket"
#: Least seconds between two checks of one fetch.
MIN_CHECK = 0.25

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

    Args:
        url: the URL fetched (for the error).
        pace: the pace; None: no watchdog.
    """

    def __init__(self, url: str, pace: Pace | None) -> None:
        self._url = url
        self._pace = pace
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._received = 0
        self._start = time.monotonic()
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
            raise FetchError(self._url, why) from ev

    def counting(self, on_bytes: OnBytes | None) -> OnBytes:
        """`on_bytes` (if any), counting the bytes received for the pace on the way."""

        def count(done: int, total: int | None) -> None:
            self._received = done  # one int written by the reader, read by the watchdog
            if on_bytes is not None:
                on_bytes(done, total)

        return count

    def watch(self, response: httpx.Response) -> None:
        """The socket to shut down is now `response`'s (shut at once if already cut off)."""
        why = self.attach(_socket_of(response))
        if why is not None:
            raise FetchError(self._url, why)

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

    def _run(self, pace: Pace) -> None:
        while True:
            received = self._received
            wait = max(pace.due(received) - (time.monotonic() - self._start), MIN_CHECK)
            if self._done.wait(wait):
                return
            received = self._received
            elapsed = time.monotonic() - self._start
            if pace.behind(received, elapsed):
                break
        why = (
            f"{received} bytes in {elapsed:.1f} s: slower than fetch_min_rate "
            f"({pace.min_rate} bytes/s) after fetch_deadline ({pace.floor:g} s): cut off"
        )
        with self._lock:
            self.cut_off = why
            sock = self._sock
        self._shutdown(sock)

    @staticmethod
    def _shutdown(sock: socket.socket | None) -> None:
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
