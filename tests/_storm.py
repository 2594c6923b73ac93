"""A reconnect storm for tests and benchmarks: many devices from many loopback addresses
connecting at once, each a raw MQTT client on asyncio (bench/proxy_storm.py, and
tests/test_proxy_storm.py).

A device opens a TCP connection from its own source address (127.0.x.y), writes a CONNECT
(clean start, its own client id, keep-alive 0: no PINGREQ is due while it is held), reads
the CONNACK whole and keeps the connection (or sends DISCONNECT and closes). At most
`window` devices are connecting at any moment; the next starts as soon as one has its
answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from dataclasses import dataclass, field

from client.protocol import encode_varint

IP_BIND_ADDRESS_NO_PORT = 24  # Linux: the source port is chosen at connect, not at bind
#: A device gives up on its CONNACK after this long (counted as failed).
DEVICE_TIMEOUT = 60.0
DISCONNECT = b"\xe0\x00"


def sources(count: int) -> list[str]:
    """`count` loopback addresses: 127.0.100.1, 127.0.100.2, ... (never 127.0.0.1)."""
    return [f"127.0.{100 + i // 250}.{1 + i % 250}" for i in range(count)]


def devices_for(count: int, addresses: int, tag: str) -> list[tuple[str, str]]:
    """`count` devices round `addresses` source addresses: (source, client id)."""
    where = sources(addresses)
    return [(where[i % addresses], f"storm-{tag}-{i}") for i in range(count)]


def connect_packet(client_id: str, mqtt: str = "5") -> bytes:
    """CONNECT, clean start, keep-alive 0: MQTT 5 (no properties) or 3.1.1 (`mqtt` "311")."""
    ident = client_id.encode()
    body = b"\x00\x04MQTT\x05\x02\x00\x00\x00" if mqtt == "5" else b"\x00\x04MQTT\x04\x02\x00\x00"
    body += len(ident).to_bytes(2, "big") + ident
    return b"\x10" + encode_varint(len(body)) + body


async def read_connack(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> int:
    """Read one CONNACK whole: its reason code (MQTT 5) or return code (3.1.1).

    Raises:
        ConnectionError: closed before it, or another packet first.
    """
    data = b""
    while True:
        if len(data) >= 2:
            length, shift, at = 0, 0, 1
            while at < len(data):
                byte = data[at]
                length |= (byte & 0x7F) << shift
                shift += 7
                at += 1
                if not byte & 0x80:
                    if data[0] != 0x20 or length < 2:
                        raise ConnectionError(f"not a CONNACK: {data[:8].hex()}")
                    if len(data) >= at + length:
                        return data[at + 1]
                    break
        more = await loop.sock_recv(sock, 256)
        if not more:
            raise ConnectionError("closed before its CONNACK")
        data += more


@dataclass
class Storm:
    """What a storm's devices saw: accepted, refused (reason -> count), failed; when the
    first started and the last CONNACK came; each accepted device's wait."""

    accepted: int = 0
    refused: dict[int, int] = field(default_factory=dict)
    failed: int = 0
    start: float = 0.0
    last: float = 0.0
    waits: list[float] = field(default_factory=list)

    def add(self, other: Storm) -> None:
        self.accepted += other.accepted
        self.failed += other.failed
        self.waits += other.waits
        for reason, count in other.refused.items():
            self.refused[reason] = self.refused.get(reason, 0) + count


class Devices:
    """Devices of one event loop; those kept stay connected until :meth:`release`."""

    def __init__(self) -> None:
        self.held: list[socket.socket] = []

    async def _one(
        self, port: int, source: str, client_id: str, mqtt: str, storm: Storm, keep: bool
    ) -> None:
        loop = asyncio.get_running_loop()
        began = time.perf_counter()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        try:
            sock.bind((source, 0))
            async with asyncio.timeout(DEVICE_TIMEOUT):
                await loop.sock_connect(sock, ("127.0.0.1", port))
                await loop.sock_sendall(sock, connect_packet(client_id, mqtt))
                reason = await read_connack(loop, sock)
        except (OSError, TimeoutError, ConnectionError):
            storm.failed += 1
            sock.close()
            return
        now = time.perf_counter()
        if reason:
            storm.refused[reason] = storm.refused.get(reason, 0) + 1
            sock.close()
            return
        storm.accepted += 1
        storm.last = max(storm.last, now)
        storm.waits.append(now - began)
        if keep:
            self.held.append(sock)
            return
        with contextlib.suppress(OSError):
            await loop.sock_sendall(sock, DISCONNECT)
        sock.close()

    async def storm(
        self,
        port: int,
        devices: list[tuple[str, str]],
        window: int,
        mqtt: str = "5",
        keep: bool = True,
    ) -> Storm:
        """`devices` (source, client id) connect to `port`, `window` at a time."""
        storm = Storm(start=time.perf_counter())
        queue = iter(devices)

        async def lane() -> None:
            for source, client_id in queue:
                await self._one(port, source, client_id, mqtt, storm, keep)

        await asyncio.gather(*(lane() for _ in range(min(window, len(devices)))))
        return storm

    async def release(self, last: int | None = None) -> int:
        """Every held device (or the `last` that connected) says DISCONNECT and closes; how
        many there were."""
        loop = asyncio.get_running_loop()
        keep = 0 if last is None else max(len(self.held) - last, 0)
        leaving, self.held = self.held[keep:], self.held[:keep]
        for sock in leaving:
            with contextlib.suppress(OSError):
                await loop.sock_sendall(sock, DISCONNECT)
            sock.close()
        return len(leaving)
