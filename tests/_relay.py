"""A TCP relay between a client and a server that a test can cut and resume: a network
outage at the byte seam, with both programs left running."""

from __future__ import annotations

import contextlib
import socket
import threading

from _servers import free_port


class Relay:
    """Listens on a free loopback port and relays every connection to `upstream_port`.

    :meth:`cut` drops every relayed connection and refuses new ones (accepted, then closed
    at once, as a broken network path looks to a client) until :meth:`resume`.
    :meth:`freeze` passes no more bytes either way, connections kept open and new ones
    accepted (a server that accepts and never answers: its peer's writes block once the
    socket buffers are full), until :meth:`thaw`.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._cut = False
        self._closed = False
        self._clients: list[socket.socket] = []  # every relayed connection's client side
        self._thawed = threading.Event()
        self._thawed.set()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    @property
    def accepted(self) -> int:
        """Connections relayed so far."""
        with self._lock:
            return len(self._clients)

    @property
    def open(self) -> int:
        """Relayed connections that neither side has closed yet."""
        with self._lock:
            return sum(1 for sock in self._clients if sock.fileno() != -1)

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            sockets, self._open = self._open, []
        for sock in sockets:
            _close(sock)

    def resume(self) -> None:
        with self._lock:
            self._cut = False

    def freeze(self) -> None:
        self._thawed.clear()

    def thaw(self) -> None:
        self._thawed.set()

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refused = self._cut
            if refused:
                _close(client)
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream_port), 5)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._open += [client, server]
                self._clients.append(client)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(a, b, self._thawed), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket, thawed: threading.Event) -> None:
    with contextlib.suppress(OSError):
        while thawed.wait() and (data := src.recv(65536)):
            thawed.wait()
            dst.sendall(data)
    _close(src)
    _close(dst)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
