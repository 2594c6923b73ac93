"""A Will over the broker's limit: its placeholder in the CONNECT, its payload stored only
once the broker has accepted the login.

An MQTT Will payload is at most 64 KiB, so this matters for brokers with a smaller limit.
The Will travels in the CONNECT, before the broker has said whether the credentials are
good, and the gateway checks the same credentials: storing the Will first acted on
credentials nobody had accepted, so every CONNECT with a wrong password was a failed login
at the gateway (55 of them locked out the proxy's address, every proxied user, for a
minute) and a stored object.

So the proxy chooses the message id itself and puts the placeholder in the CONNECT the
broker gets (:func:`prepare`: URL, size and SHA-256 are known, the payload is in memory).
The client's CONNACK waits until, after the broker's CONNACK 0, the payload is stored under
that id (:func:`settle`), within `connect_timeout` and the device's share of the upload
slots. If it cannot be, the broker link ends with DISCONNECT 0x00 (Normal disconnection:
the broker discards the Will, so no placeholder pointing at nothing is ever published; MQTT
3.1.1 discards it on any DISCONNECT) and the client is refused: CONNACK 0x97 (no upload
slot), 0x87 (the gateway refused the account or the topic) or 0x80 (3.1.1: 3). A refused
login costs the gateway nothing, and a broker that refuses the login never sees a payload
stored for it.

The Will's upload carries the Will's own `traceparent` / `tracestate` Will properties when
the device set valid ones (so the gateway's spans of that store join the device's trace),
else no context, and the proxy makes no span for it: the Will is published at some later
disconnect, if ever, so a span from the CONNECT would time no message, and its placeholder
is written into the CONNECT before the broker has accepted anything. The Will's own
properties stay on its placeholder as the device sent them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator

from client.protocol import MessageId

from ._exceptions import QUOTA_EXCEEDED, TransferFailed
from ._shares import PoolFull
from ._state import Conn, PendingWill, Services
from .protocol import (
    Connect,
    Stored,
    connack_refusal,
    connect_with_will,
    placeholder_will,
    will_trace,
)

log = logging.getLogger("proxy")

#: DISCONNECT, Normal disconnection (its 2-byte form is 0x00 in MQTT 5 and the only form in
#: 3.1.1): the broker discards the Will.
DISCONNECT_NORMAL = b"\xe0\x00"


def prepare(connect: Connect, endpoint: str) -> tuple[bytes, PendingWill]:
    """The CONNECT with the Will's placeholder instead of its payload, and the upload that
    placeholder promises."""
    will = connect.will
    assert will is not None
    message_id = MessageId.new()
    digest = hashlib.sha256(will.payload).hexdigest()
    stored = Stored(f"{endpoint}/msg/{message_id}", len(will.payload), digest, message_id)
    props, body = placeholder_will(will, stored, v5=connect.v5)
    return connect_with_will(connect, props, body), PendingWill(will, stored, endpoint)


async def _store(conn: Conn, services: Services, pending: PendingWill) -> None:
    """Store the Will's payload under the id its placeholder names.

    Raises:
        TransferFailed: no slot, a refusal, no answer within `connect_timeout`.
    """
    if services.closing.is_set():
        raise TransferFailed("the proxy is shutting down")
    try:
        slot = services.uploads.take_now(conn.holder)  # a Will takes a slot as a PUBLISH does
    except PoolFull as exc:
        raise TransferFailed(f"too many uploads at once ({exc})", reason=QUOTA_EXCEEDED) from exc
    will = pending.will

    async def payload() -> AsyncIterator[bytes]:
        yield will.payload

    try:
        async with asyncio.timeout(services.settings.connect_timeout):
            stored = await services.gateway.upload(
                pending.endpoint,
                topic=will.topic,
                size=len(will.payload),
                pieces=payload(),
                headers=(),
                ttl=None,
                auth=conn.auth,
                peer=conn.peer,
                message_id=pending.stored.message_id,
                trace=will_trace(will),
            )
    except TimeoutError as exc:
        raise TransferFailed("the Will was not stored within the CONNECT timeout") from exc
    finally:
        slot.give_back()
    if stored != pending.stored:
        raise TransferFailed("the gateway stored other bytes than the Will's")
    services.metrics.offloaded.inc()


async def settle(conn: Conn, services: Services, pending: PendingWill) -> bool:
    """After the broker's CONNACK 0: store the Will; False when it could not be stored and
    both sides were told (the broker's link ended without its Will, the client refused)."""
    try:
        await _store(conn, services, pending)
    except (asyncio.CancelledError, Exception) as exc:
        if not isinstance(exc, TransferFailed):  # the session ends meanwhile (shutdown)
            with contextlib.suppress(OSError):  # its Will would point at nothing: dropped
                conn.broker_writer.write(DISCONNECT_NORMAL)
            raise
        log.warning("Will not stored; CONNECT refused", extra={"why": str(exc)})
        services.metrics.failed.labels(why=str(exc.status or exc.reason)).inc()
        with contextlib.suppress(OSError):
            conn.broker_writer.write(DISCONNECT_NORMAL)
        async with conn.client_lock:
            conn.client_writer.write(connack_refusal(v5=conn.connect.v5, reason=exc.reason))
        return False
    return True
