"""The proxy's part in the gateway's retention: dedup before an offload, a group's confirmation
after a delivery (docs/operations.md, "Retention by consumer group"; docs/proxy.md).

* Dedup. A device's PUBLISH streams to the gateway while it arrives, so its SHA-256 is known
  only at its end. One whose payload is at most `dedup_bytes` is read whole first instead
  (:meth:`Lifecycle.whole`), while all connections together hold at most `dedup_memory`
  bytes so: the gateway is then asked by SHA-256 and size (`POST /msg/{id}/link`, with the
  device's own login) and a payload its account stores already is linked, not sent again.
  A larger one, or one that finds the budget taken, streams as before: the gateway still
  keeps one copy (it links at the commit), only the bytes cross the proxy's link again.
* Confirmation. With `group` set, a payload the proxy fetched for a device, verified and
  wrote to it whole is confirmed for that group (with the device's login): the gateway
  deletes it once every group its topic waits for has confirmed. A confirmation that fails
  is logged; the payload then stays until it expires. At most `MAX_CONFIRMS` run at once:
  more are dropped (counted), never queued without bound.
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
from .protocol import Head, Stored

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
    async def whole(self, conn: Any, head: Head) -> AsyncIterator[bytes | None]:
        """The PUBLISH `head` begins, whole when it is in hand or may be read so now (its
        payload small enough and the budget free); None: it streams."""
        whole = conn.client.whole_body(head)
        size = head.length
        if whole is not None or not self.limit or size > self.limit:
            yield whole
            return
        if self.held + size > self.memory:
            yield None
            return
        self.held += size
        try:
            yield await conn.client.body(head)
        finally:
            self.held -= size

    async def link(
        self,
        endpoint: str,
        *,
        topic: str,
        payload: bytes,
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
            )
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
