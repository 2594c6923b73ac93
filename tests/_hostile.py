"""Hostile peers for the tests: a lying HTTP endpoint, raw HTTP requests, a raw MQTT publisher.

The lying endpoint is a tiny HTTP/1.1 server on a loopback socket that answers every GET
with a body far larger than any placeholder declares, with or without Content-Length, and
records how much it managed to send before the client hung up. A raw request is HTTP/1.1
over a bare socket, whose body bytes go out only when the test says. The raw publisher is plain
paho (no project code), so a test can put any bytes and user properties on the wire.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from _servers import free_port

MiB = 1024 * 1024
BLOCK = b"\0" * (64 * 1024)


@dataclass
class Served:
    """What the lying endpoint saw of one request."""

    request_line: str
    sent: int = 0
    hung_up: bool = False
    finished: bool = False


def accept_each(sock: socket.socket, handle: Callable[[socket.socket], None]) -> threading.Thread:
    """Accept on `sock` until it is closed, each connection handled on its own daemon thread."""

    def run() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@dataclass
class LyingEndpoint:
    """Answers every GET with `body_bytes` bytes, announced or chunked."""

    body_bytes: int = 300 * MiB
    content_length: bool = True
    port: int = 0
    served: list[Served] = field(default_factory=list)
    _sock: socket.socket | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _done: threading.Condition = field(default_factory=threading.Condition)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LyingEndpoint:
        self.port = free_port()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(8)
        self._sock = sock
        self._threads.append(accept_each(sock, self._serve))
        return self

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def wait_finished(self, count: int, timeout: float) -> list[Served]:
        """Wait until `count` requests have ended (hung up or sent in full)."""
        with self._done:
            self._done.wait_for(
                lambda: sum(s.hung_up or s.finished for s in self.served) >= count, timeout
            )
            return list(self.served)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                piece = conn.recv(4096)
                if not piece:
                    return
                head += piece
            served = Served(head.split(b"\r\n", 1)[0].decode("latin-1"))
            with self._done:
                self.served.append(served)
            if self.content_length:
                headers = f"Content-Length: {self.body_bytes}\r\n"
            else:
                headers = "Transfer-Encoding: chunked\r\n"
            try:
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                    + headers.encode()
                    + b"\r\n"
                )
                left = self.body_bytes
                while left > 0:
                    block = BLOCK[: min(left, len(BLOCK))]
                    if self.content_length:
                        conn.sendall(block)
                    else:
                        conn.sendall(b"%x\r\n%s\r\n" % (len(block), block))
                    left -= len(block)
                    served.sent += len(block)
                if not self.content_length:
                    conn.sendall(b"0\r\n\r\n")
                served.finished = True
            except OSError:
                served.hung_up = True
            with self._done:
                self._done.notify_all()


class RawRequest:
    """An HTTP/1.1 request over a bare socket: the test decides from which source address,
    when (and whether) body bytes go out, and whether the answer is read."""

    def __init__(
        self,
        port: int,
        head: str,
        *,
        body: bytes = b"",
        source: str = "127.0.0.1",
        rcvbuf: int = 0,
    ) -> None:
        self.body = body
        self.sent = 0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.bind((source, 0))
        self.sock.settimeout(30)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(head.encode())

    @classmethod
    def post(
        cls,
        port: int,
        path: str,
        length: int,
        *,
        content_type: str = "application/octet-stream",
        body: bytes = b"",
        source: str = "127.0.0.1",
    ) -> RawRequest:
        """A POST announcing `length` body bytes, of which none has gone out yet."""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {length}\r\n\r\n"
        )
        return cls(port, head, body=body, source=source)

    def send(self, n: int) -> None:
        """Send the next `n` bytes of `body`."""
        self.sock.sendall(self.body[self.sent : self.sent + n])
        self.sent += n

    def response_head(self, timeout: float = 30) -> bytes:
        """What came back up to the end of the response head (less if the peer closed)."""
        self.sock.settimeout(timeout)
        data = b""
        while b"\r\n\r\n" not in data:
            piece = self.sock.recv(65536)
            if not piece:
                break
            data += piece
        return data

    def rest_until_closed(self, within: float) -> bytes | None:
        """What the peer still sends (the rest of an answer) if it then closes the connection
        within `within` seconds; None if it keeps it open."""
        deadline = time.monotonic() + within
        rest = b""
        try:
            while (left := deadline - time.monotonic()) > 0:
                self.sock.settimeout(left)
                piece = self.sock.recv(65536)
                if not piece:
                    return rest
                rest += piece
        except TimeoutError:
            return None
        except ConnectionResetError:
            return rest
        return None

    def close(self) -> None:
        self.sock.close()


class RawPublisher:
    """A plain paho MQTT 5 client publishing whatever bytes and user properties it is given."""

    def __init__(self, broker_url: str, *, protocol: int = 5) -> None:
        host, port = broker_url.removeprefix("mqtt://").rsplit(":", 1)
        version = mqtt.MQTTv5 if protocol == 5 else mqtt.MQTTv311
        self.protocol = protocol
        self._paho = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=version)
        self._paho.connect(host, int(port))
        self._paho.loop_start()

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        user_properties: list[tuple[str, str]] | None = None,
        expiry: int | None = None,
        qos: int = 1,
        retain: bool = False,
    ) -> None:
        props: Any = None
        if self.protocol == 5 and (user_properties or expiry is not None):
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            if user_properties:
                props.UserProperty = user_properties
            if expiry is not None:
                props.MessageExpiryInterval = expiry
        info = self._paho.publish(topic, payload, qos, retain, props)
        if qos:
            info.wait_for_publish(30)

    def close(self) -> None:
        self._paho.disconnect()
        self._paho.loop_stop()


class PeakRss:
    """A child process's own peak resident memory (KiB), sampled from /proc while it runs.

    `wait4`'s `ru_maxrss` will not do: Linux carries the peak of the address space a child
    was forked from across `exec`, so a child of a large pytest process reports pytest's
    peak. `VmHWM` belongs to the program's own address space (it starts anew at `exec`).
    """

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.kib = 0
        self._path = f"/proc/{pid}/status"
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        try:
            with open(self._path) as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        self.kib = max(self.kib, int(line.split()[1]))
        except (OSError, ValueError, IndexError):  # gone, or a zombie without memory
            pass

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def stop(self) -> int:
        """Stop sampling; the highest peak seen."""
        self._stop.set()
        self._thread.join()
        return self.kib
