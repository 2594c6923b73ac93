"""Upload limits as ASGI middleware: concurrent uploads per client, stalled bodies.

uvicorn's `timeout_keep_alive` only covers idle connections between requests; a client that
sends headers and then a byte now and then (slow loris) would hold an upload, a store
connection and a worker thread for ever. So every wait for the next piece of a request body
is bounded here, and a client address may only run so many uploads at once.

Both apply to requests with a body (POST, PUT, PATCH). The client address is the ASGI
`client`, i.e. the peer, or the forwarded address when uvicorn runs with `--proxy-headers`
behind a trusted proxy.
"""

from __future__ import annotations

import asyncio
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._errors import GatewayError

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class RequestTimeout(GatewayError):
    """The request body stalled for longer than the idle timeout (408)."""

    status = 408


class UploadLimits:
    """ASGI middleware enforcing per-client upload concurrency and a body idle timeout.

    Args:
        app: the application to wrap.
        max_per_client: uploads one client address may have in progress (0: no limit).
        body_idle_timeout: seconds to wait for the next piece of a request body.
    """

    def __init__(self, app: ASGIApp, *, max_per_client: int, body_idle_timeout: float) -> None:
        self.app = app
        self.max_per_client = max_per_client
        self.body_idle_timeout = body_idle_timeout
        # One event loop serves this instance: plain dict updates cannot interleave.
        self.active: dict[str, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = client[0] if client else "unknown"
        count = self.active.get(address, 0)
        if self.max_per_client and count >= self.max_per_client:
            await _refuse(send, address, self.max_per_client)
            return
        self.active[address] = count + 1
        try:
            await self.app(scope, self._bounded(receive), send)
        finally:
            left = self.active[address] - 1
            if left:
                self.active[address] = left
            else:
                del self.active[address]

    def _bounded(self, receive: Receive) -> Receive:
        timeout = self.body_idle_timeout
        body_done = False

        async def bounded_receive() -> Message:
            nonlocal body_done
            if body_done:
                # Later receives wait for the disconnect (streaming responses listen for
                # it): that wait is not a stalled upload and must not time out.
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), timeout)
            except TimeoutError:
                raise RequestTimeout(
                    f"request body stalled: no bytes for {timeout:g} seconds"
                ) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        return bounded_receive


async def _refuse(send: Send, address: str, limit: int) -> None:
    body = json.dumps(
        {"detail": f"too many concurrent uploads from {address} (limit {limit})"}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 429,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
                # The body was not read: the connection cannot be reused for another request.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
