"""Raw MQTT devices on one asyncio loop, each from a loopback address of its own
(127.0.x.y), each subscribing to one topic and taking one PUBLISH whose payload is compared
with the expected bytes as it streams in (no copy of it kept): a firmware broadcast's fleet
(tests/test_proxy_broadcast.py, bench/proxy_broadcast.py).

A device may read slowly (`rate` bytes a second, with a small receive buffer, so that the
sender feels it) or leave once it has read `leave_at` bytes of the payload.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from _wire import packet, text

READ = 1 << 20
SLOW_PIECE = 16 * 1024


def address(index: int) -> str:
    """The `index`-th device's own loopback address: 127.0.1.1, 127.0.1.2, ..."""
    return f"127.0.{1 + index // 250}.{1 + index % 250}"


@dataclass(frozen=True)
class Behaviour:
    """How one device reads: at `rate` bytes a second (None: as fast as it can), leaving
    once it has `leave_at` bytes of the payload (None: it reads it all)."""

    rate: float | None = None
    leave_at: int | None = None


@dataclass
class Took:
    """What one device got: payload bytes read, whether they were the expected ones, and
    when (perf_counter) it had them all (None: it left, or failed: `error`)."""

    received: int = 0
    exact: bool = True
    done: float | None = None
    error: str | None = None


class _Wire:
    """Reads from a non-blocking socket: whole small parts, or the payload piece by piece."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.pending = bytearray()
        self.view = memoryview(bytearray(READ))

    async def _fill(self, limit: int) -> int:
        n = await self.loop.sock_recv_into(self.sock, self.view[:limit])
        if n == 0:
            raise ConnectionError("closed by the peer")
        return n

    async def exactly(self, n: int) -> bytes:
        while len(self.pending) < n:
            got = await self._fill(READ)
            self.pending += self.view[:got]
        out = bytes(self.pending[:n])
        del self.pending[:n]
        return out

    async def varint(self) -> tuple[int, int]:
        value, shift, size = 0, 0, 0
        while True:
            byte = (await self.exactly(1))[0]
            value |= (byte & 0x7F) << shift
            shift += 7
            size += 1
            if not byte & 0x80:
                return value, size

    async def packet(self) -> tuple[int, bytes]:
        first = (await self.exactly(1))[0]
        length, _ = await self.varint()
        return first, await self.exactly(length)

    async def piece(self, limit: int) -> bytes | memoryview:
        if self.pending:
            out = bytes(self.pending[:limit])
            del self.pending[:limit]
            return out
        return self.view[: await self._fill(limit)]


class Device:
    """One subscribed device (:meth:`subscribe`), then :meth:`take`."""

    def __init__(self, sock: socket.socket, wire: _Wire, v5: bool) -> None:
        self.sock, self.wire, self.v5 = sock, wire, v5

    @classmethod
    async def subscribe(
        cls,
        host: str,
        port: int,
        source: str,
        topic: str,
        *,
        v5: bool = True,
        rcvbuf: int = 0,
        login: tuple[str, str] | None = None,
    ) -> Device:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.bind((source, 0))
        await loop.sock_connect(sock, (host, port))
        props = b"\x00" if v5 else b""
        flags = 0x02 | (0xC0 if login else 0)
        body = text("MQTT") + bytes([5 if v5 else 4, flags]) + (60).to_bytes(2, "big")
        body += props + text(f"fleet-{uuid.uuid4().hex[:12]}")
        if login is not None:
            body += text(login[0]) + text(login[1])
        await loop.sock_sendall(sock, packet(0x10, body))
        wire = _Wire(sock)
        first, connack = await wire.packet()
        if first != 0x20 or connack[1] != 0:
            raise ConnectionError(f"CONNACK {connack.hex()}")
        await loop.sock_sendall(sock, packet(0x82, b"\x00\x01" + props + text(topic) + b"\x01"))
        first, suback = await wire.packet()
        if first != 0x90 or suback[-1] > 2:
            raise ConnectionError(f"SUBACK {suback.hex()}")
        return cls(sock, wire, v5)

    async def take(self, expected: bytes, behaviour: Behaviour = Behaviour()) -> Took:
        """Read one PUBLISH and compare its payload with `expected` as it comes."""
        took = Took()
        try:
            await self._take(expected, behaviour, took)
        except (ConnectionError, OSError) as exc:
            took.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.sock.close()
        return took

    async def _take(self, expected: bytes, behaviour: Behaviour, took: Took) -> None:
        wire = self.wire
        first = (await wire.exactly(1))[0]
        remaining, _ = await wire.varint()
        if first >> 4 != 3:
            raise ConnectionError(f"not a PUBLISH: {first:#x}")
        topic_size = int.from_bytes(await wire.exactly(2), "big")
        await wire.exactly(topic_size)
        used = 2 + topic_size
        qos = (first >> 1) & 3
        packet_id = await wire.exactly(2) if qos else b""
        used += len(packet_id)
        if self.v5:
            size, varint_size = await wire.varint()
            await wire.exactly(size)
            used += varint_size + size
        length = remaining - used
        took.exact = length == len(expected)
        limit = SLOW_PIECE if behaviour.rate else READ
        while took.received < length:
            if behaviour.leave_at is not None and took.received >= behaviour.leave_at:
                return
            piece = await wire.piece(min(limit, length - took.received))
            at = took.received
            took.exact = took.exact and expected.startswith(piece, at)  # memcmp, no copy
            took.received += len(piece)
            if behaviour.rate:
                await asyncio.sleep(len(piece) / behaviour.rate)
        took.done = time.perf_counter()
        if qos:
            await asyncio.get_running_loop().sock_sendall(self.sock, b"\x40\x02" + packet_id)


class Fleet:
    """`count` devices on a thread of their own: subscribed when :meth:`start` returns,
    each taking one PUBLISH with `expected`'s bytes; :meth:`results` when all are done.

    Args:
        behaviours: index -> how that device reads (the rest: as fast as they can).
    """

    def __init__(
        self,
        port: int,
        topic: str,
        count: int,
        expected: bytes,
        *,
        behaviours: dict[int, Behaviour] | None = None,
        v5: bool = True,
        first_address: int = 0,
        login: tuple[str, str] | None = None,
    ) -> None:
        self.port, self.topic, self.count, self.expected = port, topic, count, expected
        self.behaviours = behaviours or {}
        self.v5 = v5
        self.first_address = first_address
        self.login = login
        self._subscribed = threading.Event()
        self._results: list[Took] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, timeout: float = 60) -> Fleet:
        self._thread.start()
        if not self._subscribed.wait(timeout) or self._error is not None:
            raise RuntimeError(f"the fleet did not subscribe: {self._error!r}")
        return self

    def results(self, timeout: float = 120) -> Sequence[Took]:
        self._thread.join(timeout)
        if self._results is None:
            raise RuntimeError(f"the fleet did not finish: {self._error!r}")
        return self._results

    def _run(self) -> None:
        try:
            self._results = asyncio.run(self._main())
        except BaseException as exc:
            self._error = exc
            self._subscribed.set()

    async def _main(self) -> list[Took]:
        sem = asyncio.Semaphore(100)  # connects at once

        async def one(index: int) -> Device:
            slow = self.behaviours.get(index, Behaviour()).rate is not None
            async with sem:
                return await Device.subscribe(
                    "127.0.0.1",
                    self.port,
                    address(self.first_address + index),
                    self.topic,
                    v5=self.v5,
                    rcvbuf=4096 if slow else 0,
                    login=self.login,
                )

        devices = await asyncio.gather(*(one(i) for i in range(self.count)))
        self._subscribed.set()
        return list(
            await asyncio.gather(
                *(
                    device.take(self.expected, self.behaviours.get(i, Behaviour()))
                    for i, device in enumerate(devices)
                )
            )
        )
