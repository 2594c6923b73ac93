"""The proxy's part in the gateway's retention: dedup before an offload, a group's confirmation
after a delivery (docs/operations.md, "Retention by consumer group"; docs/proxy.md).

* Dedup. A device's PUBLISH streams to the gateway while it arrives, so its SHA-256 is known
  only at its end. One whose payload is at most `dedup_bytes` (1 MiB) is read whole first instead
  (:meth:`Lifecycle.ahead`, within the upload's slot and broker keep-alive), while all
  connections together hold at most `dedup_memory` bytes so: the gateway is then asked by
  SHA-256 and size (`POST /msg/{id}/link`, with the
  device's own login) and a payload its account stores already is linked, not sent again.
  A larger one, or one that finds the budget taken, streams as before: the gateway still
  keeps one copy (it links at the commit), only the bytes cross the proxy's link again.
* Confirmation. With `group` set, a payload the proxy fetched for a device, verified and
  wrote to it whole is confirmed for that group (with the device's login): the gateway
  deletes it once every group its topic waits for has confirmed. A confirmation that fails
  is logged; the payload then stays until it expires. At most `MAX_CONFIRMS` run at once:
  more are dropped (logged), never queued without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx

from client import confirm_payload, link_payload
from client.protocol import MessageId, Placeholder, TraceContext

from ._gateway import GatewayLink
from ._settings import ProxySettings
from .protocol import Stored

log = logging.getLogger("proxy")

#: Confirmations on their way at once (each a short request on a thread of its own).
MAX_CONFIRMS = 64
#: A payload hashed on the event loop up to this size; a larger one on a thread.
HASH_ON_LOOP = 64 * 1024


class Lifecycle:
    """Dedup reads and confirmations for every connection of one proxy.

    Args:
        settings: `dedup_bytes`, `dedup_memory` and `group`.
        gateway: the gateway link (its HTTP client and worker threads).
    """

    def __init__(self, settings: ProxySettings, gateway: GatewayLink) -> None:
        self.limit = settings.dedup_bytes
        self.memory = settings.dedup_memory
        self.group = settings.group
        self.gateway = gateway
        self.held = 0
        self.confirming = 0
        self._tasks: set[asyncio.Future[Any]] = set()

    @contextlib.asynccontextmanager
    async def ahead(
        self, size: int, payload: AsyncIterator[bytes], known: bytes | None
    ) -> AsyncIterator[tuple[bytes | bytearray | None, AsyncIterator[bytes]]]:
        """The payload whole (`known` when in hand, else read now when it is small enough
        and the budget is free), and the pieces to upload; None: it streams as it arrives.

        Read within the upload's slot and its broker keep-alive, each read bounded by the
        stream's idle timeout, as when it streams; the budget is held until the upload ends.
        """
        if known is not None or not self.limit or size > self.limit:
            yield known, payload
            return
        if self.held + size > self.memory:
            yield None, payload
            return
        self.held += size
        try:
            whole = bytearray()  # grown in place: the payload held once, not twice
            async for piece in payload:
                whole += piece
            yield whole, _replay(whole)
        finally:
            self.held -= size

    async def link(
        self,
        endpoint: str,
        *,
        topic: str,
        payload: bytes | bytearray,
        headers: tuple[tuple[str, str], ...],
        ttl: int | None,
        auth: httpx.Auth | None,
        trace: TraceContext | None,
    ) -> Stored | None:
        """The message linked to the payload the device's account stores already (nothing
        to upload); None: upload it.

        Raises:
            UploadError: the gateway refused the login or the access (the upload would be).
        """
        if len(payload) > HASH_ON_LOOP:
            sha256 = await asyncio.to_thread(lambda: hashlib.sha256(payload).hexdigest())
        else:
            sha256 = hashlib.sha256(payload).hexdigest()
        message_id = MessageId.new()
        stored = [(name, value.encode("utf-8")) for name, value in headers]
        url = await self.gateway.call(
            lambda http: link_payload(
                http, endpoint, topic, sha256=sha256, size=len(payload),
                message_id=message_id, headers=stored, auth=auth, ttl=ttl, trace=trace,
            ),
            cut_off=True,  # the device that leaves meanwhile has it abandoned
        )  # fmt: skip
        return None if url is None else Stored(url, len(payload), sha256, message_id)

    def confirm_soon(self, ref: Placeholder, auth: httpx.Auth | None) -> None:
        """Confirm `ref` for the proxy's group in the background (no-op without a group)."""
        group = self.group
        if group is None:
            return
        if self.confirming >= MAX_CONFIRMS:
            log.warning("confirmation of %s for %s dropped: too many at once", ref.url, group)
            return
        self.confirming += 1
        task = asyncio.ensure_future(
            self.gateway.call(lambda http: confirm_payload(http, ref.url, group, auth=auth))
        )
        self._tasks.add(task)
        task.add_done_callback(self._confirmed)

    def _confirmed(self, task: asyncio.Future[Any]) -> None:
        self.confirming -= 1
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("confirmation failed: %r", task.exception())


async def _replay(data: bytes | bytearray, piece: int = 256 * 1024) -> AsyncIterator[bytes]:
    """`data` again, in the pieces an upload takes."""
    view = memoryview(data)
    for at in range(0, len(data), piece):
        yield bytes(view[at : at + piece])
