"""Transfer limits as ASGI middleware: uploads per client address and per user, stalled
bodies, stalled readers.

uvicorn's `timeout_keep_alive` only covers idle connections between requests; a client that
sends headers and then a byte now and then (slow loris) would hold an upload, a store
connection and a transfer thread for ever. So every wait for the next piece of a request
body is bounded here, and a client address may only run so many uploads at once; the slot
is given back in a `finally`, however the request ends.

The other direction too: a client that stops reading a download makes uvicorn's `send`
wait for ever (flow control). Every send is bounded by the send idle timeout; when it
passes, the request is abandoned, which closes the connection and releases the download's
transfer slot. Large body messages go out in slices, so what stays buffered for a client
that never reads is a slice, not a whole store piece.

A body that keeps trickling (a byte every few seconds) never trips the idle timeout, so the
body must also average `min_body_rate` bytes per second over each window of
`body_idle_timeout` seconds. Only the time spent waiting on the client counts: while the
gateway itself is not reading (the store is slow), the client is not to blame.

Per-client counting applies to requests with a body (POST, PUT, PATCH). The client address
is the ASGI `client`: the peer, or the address a trusted hop forwarded (`_forwarded`), an
IPv6 address counted by its /64 (:func:`client.protocol.address_key`, as at the proxy). Many
devices can share one address and one user can upload from many, so each upload also counts
against its user once the request is authenticated: the authorizer takes the request's
:class:`UserSlot` (left in its state under :data:`USER_SLOT_KEY`), and a user with
`max_per_user` uploads under way gets 429, from whichever address. Anonymous uploads count
per address only (there is no user to count them against).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import traceback

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from client.protocol import address_key

from ..core import GatewayError, request_scope

log = logging.getLogger("gateway")

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: Answers after which the rest of a request body is never read (stalled or too slow, too
#: large): they close the connection (RFC 9110, 15.5.9 and 15.5.14) instead of leaving
#: the server to drain the body or to hold the socket until the keep-alive timeout.
_CLOSE_AFTER = frozenset({408, 413})
#: Bytes per body message handed to the server, at most: a download's piece from the store
#: (up to 1 MiB, `gateway.storage._store_connection.READ_BUFFER`) goes in one.
SEND_SLICE = 1024 * 1024


class RequestTimeout(GatewayError):
    """The request body stalled for longer than the idle timeout (408)."""

    status = 408


#: Where an upload's :class:`UserSlot` waits in the request's state for the authorizer.
USER_SLOT_KEY = "offload_user_slot"


class UserSlot:
    """One upload's place in its user's count, taken once the user is known."""

    def __init__(self, active: dict[str, int], limit: int) -> None:
        self._active = active
        self._limit = limit
        self._user: str | None = None

    def take(self, user: str) -> bool:
        """Count this upload against `user`; False when `user` has the limit under way."""
        if self._user is not None:
            return True
        count = self._active.get(user, 0)
        if self._limit and count >= self._limit:
            return False
        self._active[user] = count + 1
        self._user = user
        return True

    def release(self) -> None:
        user, self._user = self._user, None
        if user is not None:
            left = self._active[user] - 1
            if left:
                self._active[user] = left
            else:
                del self._active[user]


class _ResponseStalled(Exception):
    """The client read nothing for the send idle timeout."""


class UploadLimits:
    """ASGI middleware: per-client upload concurrency, body and send idle timeouts.

    Args:
        app: the application to wrap.
        max_per_client: uploads one client address may have in progress (0: no limit).
        max_per_user: uploads one authenticated user may have in progress (0: no limit).
        body_idle_timeout: seconds to wait for the next piece of a request body.
        send_idle_timeout: seconds to wait for the client to take the next response piece
            (up to SEND_SLICE bytes).
        min_body_rate: bytes per second a body must average over each `body_idle_timeout`
            of waiting for it (0: no minimum).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_per_client: int,
        body_idle_timeout: float,
        send_idle_timeout: float = 60.0,
        min_body_rate: int = 0,
        max_per_user: int = 0,
    ) -> None:
        self.app = app
        self.max_per_client = max_per_client
        self.max_per_user = max_per_user
        self.body_idle_timeout = body_idle_timeout
        self.min_body_rate = min_body_rate
        self.send_idle_timeout = send_idle_timeout
        # One event loop serves this instance: plain dict updates cannot interleave.
        self.active: dict[str, int] = {}
        self.users: dict[str, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            with request_scope() as end:
                if scope["method"] not in _BODY_METHODS:  # a download notes its disconnect
                    receive = end.watch(receive)
                await self._limited(scope, receive, self._bounded_send(send))
        except _ResponseStalled as exc:
            # Returning with the response incomplete makes the server close the connection.
            log.warning("%s %s: %s; connection dropped", scope["method"], scope["path"], exc)
            # The frames it passed through hold the piece being sent (and the task group
            # keeps the error in a cycle): free them now, not when the collector runs.
            traceback.clear_frames(exc.__traceback__)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = address_key(client[0]) if client else "unknown"  # IPv6: its /64
        count = self.active.get(address, 0)
        if self.max_per_client and count >= self.max_per_client:
            await _refuse(send, address, self.max_per_client)
            return
        self.active[address] = count + 1
        slot = UserSlot(self.users, self.max_per_user)
        scope.setdefault("state", {})[USER_SLOT_KEY] = slot
        try:
            await self.app(scope, self._bounded(receive), _closing(send))
        finally:
            slot.release()
            left = self.active[address] - 1
            if left:
                self.active[address] = left
            else:
                del self.active[address]

    def _bounded(self, receive: Receive) -> Receive:
        timeout = self.body_idle_timeout
        pace = _Pace(timeout, self.min_body_rate)
        body_done = False

        async def bounded_receive() -> Message:
            nonlocal body_done
            if body_done:
                # Later receives wait for the disconnect (streaming responses listen for
                # it): that wait is not a stalled upload and must not time out.
                return await receive()
            started = time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), timeout)
            except TimeoutError:
                raise RequestTimeout(
                    f"request body stalled: no bytes for {timeout:g} seconds"
                ) from None
            pace.add(len(message.get("body", b"")), time.monotonic() - started)
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        return bounded_receive

    def _bounded_send(self, send: Send) -> Send:
        timeout = self.send_idle_timeout

        async def one(message: Message) -> None:
            # `asyncio.timeout` arms a timer on this task; `wait_for` would also wrap each
            # send in a task of its own (bench/RESULTS.md, "Gateway downloads").
            try:
                async with asyncio.timeout(timeout):
                    await send(message)
            except TimeoutError:
                raise _ResponseStalled(f"client read nothing for {timeout:g} seconds") from None

        async def bounded_send(message: Message) -> None:
            body = message.get("body", b"")
            if message["type"] != "http.response.body" or len(body) <= SEND_SLICE:
                await one(message)
                return
            more = message.get("more_body", False)
            for start in range(0, len(body), SEND_SLICE):
                last = start + SEND_SLICE >= len(body)
                await one(
                    {
                        "type": "http.response.body",
                        "body": body[start : start + SEND_SLICE],
                        "more_body": more or not last,
                    }
                )

        return bounded_send


def _closing(send: Send) -> Send:
    """`send`, with `Connection: close` on the answers of :data:`_CLOSE_AFTER`."""

    async def closing_send(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] in _CLOSE_AFTER:
            headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return closing_send


class _Pace:
    """The body's average rate over each `window` seconds spent waiting for it."""

    def __init__(self, window: float, min_rate: int) -> None:
        self.window = window
        self.min_rate = min_rate
        self.waited = 0.0
        self.received = 0

    def add(self, size: int, waited: float) -> None:
        if not self.min_rate:
            return
        self.waited += waited
        self.received += size
        if self.waited < self.window:
            return
        rate = self.received / self.waited
        if rate < self.min_rate:
            raise RequestTimeout(
                f"request body too slow: {rate:.0f} bytes/s over {self.waited:.0f} s, "
                f"the minimum is {self.min_rate} bytes/s"
            )
        self.waited, self.received = 0.0, 0


async def _refuse(send: Send, address: str, limit: int) -> None:
    # The address is the device's behind a trusted hop (middleware/_forwarded.py): the log
    # says which device holds its uploads, not which proxy they came through.
    log.info("refused %s: too many uploads from it under way (limit %d)", address, limit)
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
