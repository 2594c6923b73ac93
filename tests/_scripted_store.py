"""A scripted object store for the store client's tests (`gateway.storage._async_http`):
the answers SeaweedFS does not give on demand (503, a connection closed or left silent)."""

from __future__ import annotations

import socket

from _hostile import accept_each

#: An answer that closes the connection instead of answering.
CLOSED = b""
#: An answer that leaves the request unanswered until the client gives up.
STALL = b"stall"


class ScriptedStore:
    """Answers each request (keep-alive) with the next of `answers` (the last one again
    once they run out), after reading its head and any Content-Length body; counts them."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = answers
        self.requests = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        accept_each(self.listener, self._serve)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    piece = conn.recv(65536)
                    if not piece:
                        return
                    data += piece
                head, data = data.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.lower().split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name == b"content-length":
                        length = int(value)
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                answer = self.answers[min(self.requests, len(self.answers) - 1)]
                self.requests += 1
                if answer == STALL:
                    conn.recv(1)
                    return
                if answer == CLOSED:
                    return
                conn.sendall(answer)

    def close(self) -> None:
        self.listener.close()
