"""A QoS 2 PUBLISH over the broker's limit that the client resends: no second copy stored.

A client that lost the PUBREC of a QoS 2 PUBLISH sends it again after reconnecting, with
DUP set and the same packet id. Stored a second time (under a new message id), one of the
two copies would be an orphan: the broker still holds the first placeholder under that
packet id, and either discards the resend or (mosquitto, when the payload differs, as a new
placeholder's does) takes it in the first one's place; nothing points at the other copy.

So the proxy remembers, per client (user name, client id) and packet id, what it stored for
each QoS 2 PUBLISH, until the broker's PUBCOMP ends that flow (the last 4,096 flows at most:
:class:`proxy._state.StoredFlows`). A DUP resend of the same size is hashed as it arrives,
and nothing of it is stored: when its SHA-256 is the remembered one, the broker gets the
remembered placeholder again, the same bytes as the first: the broker discards it as the
duplicate it is (or, if it lost the first, takes it), and it points at these very bytes.
When the bytes differ (a client that breaks MQTT's rule, or a remembered flow that ended
unseen), nothing was stored and nothing can be published: the connection is closed and the
flow forgotten, so the client resends once more and that copy is stored.

The memory is per replica, as the remembered bad ids are: a resend that reaches another
replica (or this one after a restart) is stored again, and that copy is left to the store's
lifecycle (its TTL or the Message Expiry Interval, as any payload no placeholder points at).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from ._exceptions import PeerGone
from ._gateway import Hasher
from ._state import Conn, FlowKey, Services
from ._stream import drained
from .protocol import Head, PublishHeader, Stored, placeholder_packet

_QOS2 = 0x04
_DUP = 0x08


def _key(conn: Conn, packet_id: int | None) -> FlowKey | None:
    """The flow's key; None when there is no session to resend into (no client id)."""
    if packet_id is None or not conn.connect.client_id:
        return None
    return conn.connect.username, conn.connect.client_id, packet_id


def remember(
    conn: Conn, services: Services, head: Head, header: PublishHeader, stored: Stored
) -> None:
    """Note what a QoS 2 PUBLISH stored, once its placeholder goes to the broker."""
    key = _key(conn, header.packet_id)
    if head.first & 0x06 == _QOS2 and key is not None:
        services.stored_flows.add(key, stored)
        conn.stored_flows.add(key[2])


def ended(conn: Conn, services: Services, packet_id: int) -> None:
    """The broker's PUBCOMP for `packet_id` passed: that flow is over, the id free again."""
    key = _key(conn, packet_id)
    conn.stored_flows.discard(packet_id)
    if key is not None:
        services.stored_flows.forget(key)


async def resent(
    conn: Conn,
    services: Services,
    head: Head,
    header: PublishHeader,
    size: int,
    payload: Callable[[], AsyncIterator[bytes]],
) -> bool:
    """Send the remembered placeholder for a resend of a stored QoS 2 PUBLISH; False when
    this PUBLISH is none (store it as any other).

    Raises:
        PeerGone: a resend whose bytes are not the stored ones (it was not stored).
    """
    if head.first & 0x06 != _QOS2 or not head.first & _DUP:
        return False
    key = _key(conn, header.packet_id)
    stored = services.stored_flows.get(key) if key is not None else None
    if key is None or stored is None:
        return False
    if stored.size != size:
        services.stored_flows.forget(key)
        return False
    digest = Hasher()
    conn.transfers += 1
    try:
        async for piece in payload():
            await digest.add(piece)
    finally:
        conn.transfers -= 1
    if await digest.hexdigest() != stored.sha256:
        services.stored_flows.forget(key)
        services.metrics.failed.labels(why="resend-differs").inc()
        raise PeerGone("a QoS 2 resend whose bytes are not the stored ones: closed to get it again")
    assert header.packet_id is not None
    conn.unacked.add(header.packet_id)
    conn.stored_flows.add(header.packet_id)
    conn.broker_writer.write(placeholder_packet(head.first, header, stored, v5=conn.broker_v5))
    conn.aliases.sent(header)
    await drained(conn.broker_writer, conn.broker.idle)
    services.metrics.resends.inc()
    return True
