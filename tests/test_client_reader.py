"""The fetch client's urllib3 transport: kept-alive connections, dropped unread ones, errors.

A plain socket server (no project code) counts connections and answers by path, so these
show what the pool does on the wire: a connection whose body was read to its end is reused,
one left unread (a refused length, an error answer) is never handed to the next request,
and a stalled body ends as a retryable error within the timeout.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from client import FetchError
from client.http._answers import MAX_ERROR_BODY, TransientFetchError
from client.http._transport import HttpTransport

from _hostile import accept_each

BODY = bytes(range(256)) * 4096  # 1 MiB
SHA = hashlib.sha256(BODY).hexdigest()


class Server:
    """Keep-alive HTTP/1.1 on loopback; counts the connections it accepted."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.targets: list[bytes] = []
        # Looked up per connection: a test may wrap `_serve` after the server started.
        accept_each(self.sock, lambda conn: self._serve(conn))

    def _serve(self, conn: socket.socket) -> None:
        self.connections += 1
        buffered = b""
        with conn:
            try:
                while True:
                    while b"\r\n\r\n" not in buffered:
                        piece = conn.recv(65536)
                        if not piece:
                            return
                        buffered += piece
                    head, _, buffered = buffered.partition(b"\r\n\r\n")
                    path = head.split(b" ")[1]
                    self.targets.append(path)
                    path = b"/" + path.rsplit(b"/", 1)[-1]  # absolute-form from a proxy client
                    if path == b"/ok":
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY))
                        conn.sendall(BODY)
                    elif path == b"/utf8":  # a header value in raw UTF-8, as a gateway sends
                        conn.sendall(
                            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n"
                            b"X-Offload-Topic: t/\xe2\x82\xac\r\n\r\n" % len(BODY)
                        )
                        conn.sendall(BODY)
                    elif path == b"/chunked":  # the same body in uneven chunks
                        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                        for start in range(0, len(BODY), 100_003):
                            piece = BODY[start : start + 100_003]
                            conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                        conn.sendall(b"0\r\n\r\n")
                    elif path in (b"/longer", b"/error"):
                        # The head (and, for the error, the 64 KiB the client reads of an
                        # error body); the rest follows only once the client sends another
                        # request on this connection, so a reused connection would read it
                        # as the next answer. An unused one is seen closed here.
                        status = b"200 OK" if path == b"/longer" else b"500 Oops"
                        length = 2 * len(BODY)
                        head = b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n" % (status, length)
                        early = MAX_ERROR_BODY if path == b"/error" else 0
                        conn.sendall(head + b"\xee" * early)
                        buffered += conn.recv(65536)
                        if not buffered:
                            return
                        conn.sendall(b"\xff" * (length - early))
                    elif path == b"/stall":  # headers, half the body, then nothing
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY))
                        conn.sendall(BODY[: len(BODY) // 2])
                        time.sleep(30)
                        return
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def test_fetches_reuse_one_connection(server: Server) -> None:
    with HttpTransport(timeout=10) as http:
        for _ in range(3):
            payload = http.fetch(f"{server.url}/ok", expected_sha256=SHA, expected_size=len(BODY))
            assert payload.read() == BODY
    assert server.connections == 1


def test_a_chunked_body_is_read_whole_and_its_connection_reused(server: Server) -> None:
    """Read straight into the payload's buffer, the chunked framing still holds."""
    with HttpTransport(timeout=10) as http:
        for path in ("/chunked", "/ok", "/chunked"):
            payload = http.fetch(
                f"{server.url}{path}", expected_sha256=SHA, expected_size=len(BODY)
            )
            assert payload.read() == BODY
    assert server.connections == 1


def test_a_header_in_raw_utf8_is_read(server: Server) -> None:
    """A message on topic `t/€` comes with `X-Offload-Topic: t/€` in UTF-8 bytes: the fetch
    failed with UnicodeEncodeError before (the headers were handed to httpx as str)."""
    with HttpTransport(timeout=10) as http:
        payload = http.fetch(f"{server.url}/utf8", expected_sha256=SHA, expected_size=len(BODY))
        assert payload.read() == BODY


@pytest.mark.parametrize("path", ["/longer", "/error"])
def test_a_connection_left_unread_is_not_reused(server: Server, path: str) -> None:
    """Were the connection reused, the next answer would be read from the rest of the body."""
    with HttpTransport(timeout=10) as http:
        assert http.fetch(f"{server.url}/ok", expected_sha256=SHA, expected_size=len(BODY))
        with pytest.raises(FetchError):
            http.fetch(f"{server.url}{path}", expected_sha256=SHA, expected_size=len(BODY))
        payload = http.fetch(f"{server.url}/ok", expected_sha256=SHA, expected_size=len(BODY))
        assert payload.read() == BODY
    assert server.connections == 2


def test_a_stalled_body_is_a_retryable_error_within_the_timeout(server: Server) -> None:
    started = time.monotonic()
    with HttpTransport(timeout=1) as http, pytest.raises(TransientFetchError) as caught:
        http.fetch(f"{server.url}/stall", expected_sha256=SHA, expected_size=len(BODY))
    assert time.monotonic() - started < 10
    assert "timed out" in str(caught.value).lower(), caught.value


def test_a_refused_connection_is_retryable() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with HttpTransport(timeout=5) as http, pytest.raises(TransientFetchError) as caught:
        http.fetch(f"http://127.0.0.1:{port}/ok", expected_sha256=SHA)
    assert isinstance(caught.value.__cause__, Exception)
    assert "ConnectError" in repr(caught.value), caught.value


def test_a_proxy_in_the_environment_is_honoured(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """httpx reads HTTP_PROXY only with its own transports: fetches keep using it."""
    monkeypatch.setenv("HTTP_PROXY", server.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    url = "http://gateway.invalid:8080/msg/x/ok"  # resolvable only by the proxy
    with HttpTransport(timeout=10) as http:
        assert http.fetch(url, expected_sha256=SHA, expected_size=len(BODY)).read() == BODY
    assert server.targets == [url.encode()]


def test_closing_the_transport_closes_its_connections(server: Server) -> None:
    """Not left to the garbage collector: a server shutting down waits for open ones."""
    closed = threading.Event()
    original = server._serve

    def serve(conn: socket.socket) -> None:
        original(conn)
        closed.set()  # the client's end is gone (recv saw EOF)

    server._serve = serve  # type: ignore[method-assign]
    http = HttpTransport(timeout=10)
    assert http.fetch(f"{server.url}/ok", expected_sha256=SHA, expected_size=len(BODY))
    assert not closed.wait(0.3)  # kept alive for the next fetch
    http.close()
    assert closed.wait(5)
