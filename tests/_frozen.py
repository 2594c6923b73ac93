"""A peer that accepts and never answers (or answers a byte at a time), and a watch on how
long a call waits for it.

:func:`frozen` stops a real process with SIGSTOP (its kernel still accepts connections and
takes bytes until the socket buffers are full, then nothing: what a wedged gateway looks
like to its callers) and resumes it with SIGCONT. :func:`ends_within` runs a call on a
thread of its own and fails the test if the call is still waiting past its bound, so a
call that would wait for ever fails instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

#: What a call may take beyond its timeout: thread start, a loaded machine's scheduling.
SLACK = 1.5


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[None]:
    """The process `pid` stopped (SIGSTOP) inside the block, resumed (SIGCONT) after it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@dataclass
class Ended:
    """How a call ended: its result or its exception, and the seconds it took."""

    seconds: float = 0.0
    result: Any = None
    error: BaseException | None = None


def ends_within(call: Callable[[], Any], timeout: float, slack: float = SLACK) -> Ended:
    """Run `call`; it must end within `timeout` + `slack` seconds (not necessarily raise).

    Raises:
        AssertionError: still waiting then (the thread is left to its daemon fate), or
            it took longer.
    """
    ended = Ended()

    def run() -> None:
        start = time.monotonic()
        try:
            ended.result = call()
        except BaseException as exc:
            ended.error = exc
        ended.seconds = time.monotonic() - start

    thread = threading.Thread(target=run, name="ends-within", daemon=True)
    thread.start()
    thread.join(timeout + slack + 10)
    assert not thread.is_alive(), (
        f"still waiting {timeout + slack + 10:.0f} s on (timeout {timeout} s)"
    )
    assert ended.seconds <= timeout + slack, (
        f"took {ended.seconds:.1f} s, timeout {timeout} s: {ended.error!r}"
    )
    return ended


#: `st` values of /proc/net/tcp (Linux's include/net/tcp_states.h).
ESTABLISHED, TIME_WAIT, LISTEN = 1, 6, 10


@dataclass(frozen=True)
class TcpSocket:
    """One TCP socket of this host as /proc/net/tcp shows it: its ports, its state, and the
    bytes written to it that its peer has not acknowledged (sent or not)."""

    local: int
    remote: int
    state: int
    unsent: int


def tcp_sockets(port: int) -> list[TcpSocket]:
    """The TCP sockets of this host with either end on `port` (IPv4 and IPv6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                local, remote = (int(f.rsplit(":", 1)[1], 16) for f in fields[1:3])
                if port in (local, remote):
                    unsent = int(fields[4].split(":")[0], 16)
                    found.append(TcpSocket(local, remote, int(fields[3], 16), unsent))
    return found


def written(pid: int) -> int:
    """Bytes process `pid` has written so far, to sockets as to files (/proc/<pid>/io)."""
    with open(f"/proc/{pid}/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("wchar:"))


class Trickler:
    """A peer that answers, but a byte every `every` seconds: `answers` reads each request
    whole (by its Content-Length) and sends `201 Created` so; `reads` takes the request
    itself a byte at a time. Per-read and per-write timeouts never end either."""

    def __init__(self, mode: str, every: float = 0.5) -> None:
        assert mode in ("answers", "reads")
        self.mode = mode
        self.every = every
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            if self.mode == "reads":
                while conn.recv(1):
                    time.sleep(self.every)
                return
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536) or b"\r\n\r\n"
            head, _, body = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length:\s*(\d+)", head)
            left = int(length[1]) - len(body) if length else 0
            while left > 0:
                left -= len(conn.recv(1 << 20)) or left
            for byte in b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}":
                conn.sendall(bytes([byte]))
                time.sleep(self.every)
