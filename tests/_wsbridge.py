"""A WebSocket-to-TCP bridge in front of mosquitto, for MQTT over WebSocket (`ws://`).

Debian's mosquitto is built without libwebsockets (`protocol websockets` fails: "Unable to
start any listening sockets"), so the tests put a real WebSocket server in front of its TCP
listener, as a load balancer or a cloud broker's edge does: the `websockets` library
(uvicorn's own WebSocket implementation), which speaks the RFC 6455 handshake and framing,
relays each binary message's bytes to the broker and the broker's bytes back. It serves one
path, offers the `mqtt` subprotocol, and can require a header.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import threading
from dataclasses import dataclass, field

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from _servers import free_port


@dataclass
class WebSocketBridge:
    """`ws://127.0.0.1:<port><path>` to `127.0.0.1:<upstream_port>` (TCP)."""

    upstream_port: int
    path: str = "/mqtt"
    #: a header every upgrade request must carry (name, value); else 401.
    required_header: tuple[str, str] | None = None
    port: int = field(default_factory=free_port)
    #: the header values of every upgrade request seen, by lower-case name.
    seen_headers: list[dict[str, str]] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _server: Server | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}{self.path}"

    def start(self) -> WebSocketBridge:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def main() -> None:
            self._server = await serve(
                self._relay,
                "127.0.0.1",
                self.port,
                subprotocols=["mqtt"],  # type: ignore[list-item]
                process_request=self._check,
                max_size=None,
                compression=None,
            )
            ready.set()
            await self._server.serve_forever()

        def run() -> None:
            assert self._loop is not None
            with contextlib.suppress(asyncio.CancelledError):
                self._loop.run_until_complete(main())

        threading.Thread(target=run, daemon=True).start()
        assert ready.wait(10), "bridge did not start"
        return self

    def close(self) -> None:
        if self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)

    def _check(self, connection: ServerConnection, request: Request) -> Response | None:
        self.seen_headers.append({k.lower(): v for k, v in request.headers.raw_items()})
        if request.path != self.path:
            return connection.respond(http.HTTPStatus.NOT_FOUND, "no MQTT here\n")
        if self.required_header is not None:
            name, value = self.required_header
            if request.headers.get(name) != value:
                return connection.respond(http.HTTPStatus.UNAUTHORIZED, "header missing\n")
        return None

    async def _relay(self, ws: ServerConnection) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def up() -> None:
            async for message in ws:
                writer.write(message if isinstance(message, bytes) else message.encode())
                await writer.drain()
            writer.close()

        async def down() -> None:
            while data := await reader.read(65536):
                await ws.send(data)
            await ws.close()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        writer.close()
