"""MQTT over WebSocket for clients (`OFFLOAD_PROXY_WS_PORT`): browsers, mqtt.js, paho with
`transport="websockets"`.

The RFC 6455 handshake and framing are wsproto's (sans-I/O, as the proxy's own core). The
upgrade request must offer the `mqtt` subprotocol (MQTT 5 §6); any path is served. After it
the connection is an ordinary client connection (:class:`proxy._session.Session`) whose
reader and writer carry the MQTT bytes inside binary WebSocket messages:

* :class:`WebSocketReader` hands out message data as wsproto decodes it, and wsproto hands
  out a frame's payload as it arrives, so a 256 MiB PUBLISH sent as one frame streams in
  the pieces the socket delivered (bounded memory, as over TCP). It reads the socket only
  when asked, so the relay's own backpressure holds. Pings are answered; a text message is
  refused (close 1003), as MQTT over WebSocket is binary.
* :class:`WebSocketWriter` sends each write as one binary message (a frame header in front
  of the bytes, no copy of the payload beyond wsproto's masking-free server frames).

No WebSocket extension (per-message deflate) is accepted: no inflation to bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from ._stream import READ_SIZE

log = logging.getLogger("proxy")

SUBPROTOCOL = "mqtt"
UNSUPPORTED_DATA = 1003
#: Seconds a closing connection waits for the client's close frame.
CLOSE_WAIT = 2.0


class HandshakeFailed(Exception):
    """Not a WebSocket upgrade for MQTT (answered with a 400, or the peer went away)."""


async def handshake(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float
) -> WSConnection:
    """Read the upgrade request and accept it with the `mqtt` subprotocol.

    Raises:
        HandshakeFailed: no `mqtt` subprotocol, not a WebSocket upgrade, a request over
            h11's 16 KiB bound, silence for `timeout` seconds, or the peer gone.
    """
    ws = WSConnection(ConnectionType.SERVER)
    try:
        async with asyncio.timeout(timeout):
            while True:
                data = await reader.read(READ_SIZE)
                ws.receive_data(data or None)
                for event in ws.events():
                    if isinstance(event, Request):
                        if SUBPROTOCOL not in event.subprotocols:
                            writer.write(ws.send(RejectConnection(status_code=400)))
                            raise HandshakeFailed("no 'mqtt' subprotocol offered")
                        writer.write(ws.send(AcceptConnection(subprotocol=SUBPROTOCOL)))
                        await writer.drain()
                        return ws
                    raise HandshakeFailed(f"{type(event).__name__} before the upgrade")
                if not data:
                    raise HandshakeFailed("closed before the upgrade")
    except (TimeoutError, OSError, RemoteProtocolError, LocalProtocolError) as exc:
        raise HandshakeFailed(f"handshake failed: {type(exc).__name__}") from exc


class WebSocketReader(asyncio.StreamReader):
    """The MQTT bytes inside the binary messages of `ws`, read from `reader` on demand."""

    def __init__(
        self, ws: WSConnection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        super().__init__(limit=READ_SIZE)
        self._ws = ws
        self._raw = reader
        self._writer = writer
        self._pending: deque[bytes] = deque()
        self._eof = False

    async def read(self, n: int = -1) -> bytes:
        while not self._pending and not self._eof:
            data = await self._raw.read(READ_SIZE)
            try:
                self._ws.receive_data(data or None)
                self._take_events()
            except (RemoteProtocolError, LocalProtocolError) as exc:
                log.info("WebSocket protocol error", extra={"why": str(exc)})
                self._eof = True
            if not data:
                self._eof = True
        # What the messages a read brought hold, up to `n` bytes, in one piece: the relay
        # passes the whole packets in it as one run (a client sends a message per packet).
        pieces: list[bytes] = []
        room = n if n > 0 else -1
        while self._pending and room:
            piece = self._pending.popleft()
            if 0 < room < len(piece):
                piece, rest = piece[:room], piece[room:]
                self._pending.appendleft(rest)
            pieces.append(piece)
            room = room - len(piece) if room > 0 else -1
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _take_events(self) -> None:
        for event in self._ws.events():
            if isinstance(event, BytesMessage):
                if event.data:
                    self._pending.append(bytes(event.data))
            elif isinstance(event, Ping):
                self._writer.write(self._ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                with contextlib.suppress(LocalProtocolError):
                    self._writer.write(self._ws.send(event.response()))
                self._eof = True
            elif isinstance(event, TextMessage):
                with contextlib.suppress(LocalProtocolError):
                    self._writer.write(self._ws.send(CloseConnection(code=UNSUPPORTED_DATA)))
                self._eof = True


class WebSocketWriter(asyncio.StreamWriter):
    """Each write one binary message of `ws` on `writer`; the rest is `writer`'s.

    Closing sends a close frame and waits (at most :data:`CLOSE_WAIT` seconds) for the
    client's before the TCP connection goes: a client still writing its own close frame to a
    socket already gone would see a reset instead of a clean end (RFC 6455 §7).
    """

    def __init__(
        self, ws: WSConnection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        protocol: Any = None  # the raw writer's protocol does the flow control
        super().__init__(writer.transport, protocol, None, asyncio.get_running_loop())
        self._ws = ws
        self._raw_reader = reader
        self._raw = writer
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            self._raw.write(self._ws.send(BytesMessage(data=bytes(data))))

    async def drain(self) -> None:
        await self._raw.drain()

    def close(self) -> None:
        if self._ws.state is ConnectionState.OPEN:
            with contextlib.suppress(LocalProtocolError):
                self._raw.write(self._ws.send(CloseConnection(code=1000)))
        self._closing = True
        if self._ws.state is not ConnectionState.LOCAL_CLOSING:
            self._raw.close()  # nothing to wait for: the client closed, or never will

    def is_closing(self) -> bool:
        return self._closing or self._raw.is_closing()

    async def wait_closed(self) -> None:
        if not self._raw.is_closing():
            with contextlib.suppress(TimeoutError, OSError, RemoteProtocolError):
                async with asyncio.timeout(CLOSE_WAIT):
                    while self._ws.state is ConnectionState.LOCAL_CLOSING:
                        data = await self._raw_reader.read(READ_SIZE)
                        self._ws.receive_data(data or None)
                        for _ in self._ws.events():
                            pass  # the client's close frame moves the state to CLOSED
                        if not data:
                            break
            self._raw.close()
        await self._raw.wait_closed()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._raw.get_extra_info(name, default)
