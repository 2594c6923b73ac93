"""Read what is left of a request body before an early refusal, so the refusal arrives.

The gateway refuses many requests before it reads their body: a wrong SCRAM proof, a
missing credential, a topic the ACL forbids. When the connection then closes (the client or
a proxy sent ``Connection: close``, as nginx does towards upstreams by default), closing a
socket with unread bytes makes the kernel send a TCP reset. The peer, still writing the
body, fails with "connection reset" and may give up before it reads the answer: behind nginx
with request buffering off (the chart's Ingress settings) a wrong password on a 2 MiB
hop-client upload came back as nginx's 502 ("writev() failed (104: Connection reset by
peer) while sending request to upstream"), which hop-client reports as "Missing sid in
SCRAM server final" instead of "invalid-proof".

So before the first byte of a 4xx answer to a request whose body has not been read whole,
this middleware reads and discards the rest of it: at most ``max_bytes`` and for at most
``timeout`` seconds, so a refused client cannot hold the gateway longer than an upload
could. Sent at once, and so still exposed to the reset on a closing connection: answers to
a declared ``Content-Length`` above ``max_bytes``; 408 and 413 (the body itself is the
problem); 5xx (the gateway is in trouble and sheds work); requests that
``Expect: 100-continue`` (the client has not sent the body).
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DRAIN_BYTES = 16 * 1024 * 1024
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# Refusals of the request (4xx) are drained, except those whose reason is the body itself
# (it stalled, or it is too large): reading on would only delay the answer. 5xx answers say
# the gateway is in trouble (overloaded, store down) and go out at once, spending nothing.
_NO_DRAIN = frozenset({408, 413})


def _drains(status: int) -> bool:
    return 400 <= status < 500 and status not in _NO_DRAIN


def _drainable(scope: Scope, max_bytes: int) -> bool:
    """Whether the request has a body that draining could read whole."""
    if scope["method"] not in _BODY_METHODS:
        return False
    headers = dict(scope.get("headers", ()))
    if b"100-continue" in headers.get(b"expect", b"").lower():
        # The client waits for our word before it sends the body: a refusal tells it not to,
        # and reading would make the server send "100 Continue" and invite the body.
        return False
    length = headers.get(b"content-length", b"").strip()
    if length:
        return length.isdigit() and 0 < int(length[:20]) <= max_bytes
    return b"transfer-encoding" in headers


class DrainBeforeEarlyAnswer:
    """ASGI middleware: finish reading a request body (bounded) before answering it.

    Args:
        app: the application to wrap.
        max_bytes: most body bytes read and discarded per request.
        timeout: most seconds spent doing so.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int = DRAIN_BYTES, timeout: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _drainable(scope, self.max_bytes):
            await self.app(scope, receive, send)
            return
        done = False  # the whole body was received, or the client is gone
        receiving = 0  # receive() calls of the app in flight

        async def tracking_receive() -> Message:
            nonlocal done, receiving
            receiving += 1
            try:
                message = await receive()
            finally:
                receiving -= 1
            if message["type"] != "http.request" or not message.get("more_body", False):
                done = True
            return message

        async def drain() -> None:
            nonlocal done
            left = self.max_bytes
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.timeout
            while not done and left > 0:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return
                try:
                    message = await asyncio.wait_for(tracking_receive(), remaining)
                except TimeoutError:
                    return
                left -= len(message.get("body", b""))

        async def draining_send(message: Message) -> None:
            # Only when nothing else is reading: two readers would wait for each other.
            if (
                message["type"] == "http.response.start"
                and _drains(int(message.get("status", 0)))
                and not done
                and not receiving
            ):
                with contextlib.suppress(Exception):  # a broken peer: answer regardless
                    await drain()
            await send(message)

        await self.app(scope, tracking_receive, draining_send)
