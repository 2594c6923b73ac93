"""A real gateway (or store) behind a relay that trickles its answers to payload fetches:
each byte of them comes a fraction of a second after the last, so every per-read timeout
holds and only a bound on the whole fetch ends it (tests/test_proxy_fetch_pace.py).

HEAD and GET requests go upstream with `Connection: close`: each has a connection of its
own, judged by its own request line (a pooled connection reused for a request of another
kind would otherwise keep the first one's speed). Anything else (an upload's PUT, a POST)
is relayed both ways at once, as it came.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field

from _relay import _close
from _servers import free_port

#: The largest request head read before it is relayed.
MAX_HEAD = 65536


@dataclass
class Trickled:
    """What the relay saw of the answers it trickled."""

    started: int = 0  # answers begun
    hung_up: int = 0  # answers whose client closed its connection before their end
    hung_up_after: list[float] = field(default_factory=list)  # seconds each of those lasted


class TricklingRelay:
    """Listens on a free loopback port and relays each connection to `upstream_port`
    (set once the server behind it is up: a gateway is told the relay's URL first).

    The answers to `methods` requests for a path containing `path` come back at `rate`
    bytes a second (their head at once when `head_at_once`, else trickled too); every
    other answer at once. With `cut_after`, such an answer is not trickled: its head and
    that many bytes of its body go at once, then the connection is closed (cleanly: a
    body cut short, not a reset). With `trickled`, only that many such answers are
    trickled (or cut short); the later ones pass at once.
    """

    def __init__(
        self,
        *,
        methods: frozenset[str],
        path: str = "/payload",
        rate: float = 5.0,
        head_at_once: bool = False,
        cut_after: int | None = None,
        trickled: int | None = None,
    ) -> None:
        self.upstream_port = 0
        self.methods = methods
        self.path = path
        self.rate = rate
        self.head_at_once = head_at_once
        self.cut_after = cut_after
        self.trickled = trickled
        self.port = free_port()
        self.seen = Trickled()
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._closed = False
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed = True
        _close(self._listener)
        with self._lock:
            sockets, self._open = self._open, []
        for sock in sockets:
            _close(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(("127.0.0.1", self.upstream_port), 5)
        except OSError:
            _close(client)
            return
        with self._lock:
            self._open += [client, server]
        with contextlib.suppress(OSError):
            head = _request_head(client)
            method, target = head.split(b" ", 2)[:2]
            if method not in (b"HEAD", b"GET"):
                server.sendall(head)
                threading.Thread(target=_pump, args=(client, server), daemon=True).start()
                _pump(server, client)
                return
            server.sendall(_closing(head))
            if self._slowed(method, target):
                if self.cut_after is None:
                    self._trickle(server, client)
                else:
                    self._cut_short(server, client, self.cut_after)
            else:
                _pump(server, client)
        _close(client)
        _close(server)

    def _slowed(self, method: bytes, target: bytes) -> bool:
        """Whether this answer is trickled (or cut short)."""
        if method.decode() not in self.methods or self.path.encode() not in target:
            return False
        with self._lock:
            return self.trickled is None or self.seen.started < self.trickled

    def _trickle(self, server: socket.socket, client: socket.socket) -> None:
        with self._lock:
            self.seen.started += 1
        began = time.monotonic()
        pending = b""
        in_head = self.head_at_once
        try:
            while True:
                if not pending:
                    pending = server.recv(65536)
                    if not pending:
                        return  # the whole answer went out
                if in_head:
                    end = pending.find(b"\r\n\r\n")
                    if end >= 0:
                        client.sendall(pending[: end + 4])
                        pending, in_head = pending[end + 4 :], False
                    else:
                        client.sendall(pending)
                        pending = b""
                    continue
                client.sendall(pending[:1])
                pending = pending[1:]
                time.sleep(1 / self.rate)
        except OSError:
            with self._lock:
                self.seen.hung_up += 1
                self.seen.hung_up_after.append(time.monotonic() - began)

    def _cut_short(self, server: socket.socket, client: socket.socket, body: int) -> None:
        with self._lock:
            self.seen.started += 1
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.find(b"\r\n\r\n") + 4 + body:
            piece = server.recv(65536)
            if not piece:
                break
            data += piece
        client.sendall(data[: data.find(b"\r\n\r\n") + 4 + body])


def _request_head(sock: socket.socket) -> bytes:
    """The request's head, up to its blank line (what the client sent beyond it too)."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        if not piece or len(data) > MAX_HEAD:
            raise OSError("no request head")
        data += piece
    return data


def _closing(head: bytes) -> bytes:
    """A bodiless request's head, asking the server to close the connection after it."""
    line, _, rest = head.partition(b"\r\n")
    fields = [f for f in rest.split(b"\r\n") if not f.lower().startswith(b"connection:")]
    return line + b"\r\nConnection: close\r\n" + b"\r\n".join(fields)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    _close(src)
    _close(dst)
