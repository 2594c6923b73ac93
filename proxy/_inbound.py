"""Client to broker: packets relayed as they are, a PUBLISH over the broker's limit offloaded.

An offloaded PUBLISH streams from the client's socket to the gateway while it arrives; once
the gateway has stored it (201, the SHA-256 matching what passed), the placeholder goes to
the broker with the same fixed-header flags, packet id and properties, so the client's
PUBACK/PUBREC is the broker's answer to it. Nothing else of this connection is read in the
meantime, so order is kept and what waits is bounded by the socket buffers. A refused or
failed upload is answered with a PUBACK/PUBREC reason code (MQTT 5; QoS 0 is dropped and
counted) or by closing the connection (3.1.1, which has no way to say no); a client that
goes silent or away mid-PUBLISH leaves nothing stored and nothing published.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from client import UploadError
from client.protocol import MessageId, TraceContext

from ._departure import departure, left
from ._exceptions import (
    FINAL_REASONS,
    IMPLEMENTATION_SPECIFIC,
    QUOTA_EXCEEDED,
    PeerGone,
    TransferFailed,
)
from ._gateway import head_fits
from ._lifecycle import Lifecycle
from ._resends import remember, resent
from ._shares import PoolFull, Taken
from ._state import Conn, Services
from ._stream import drained, send
from ._tracing import start_offload
from .protocol import (
    AUTH,
    CONNECT,
    DISCONNECT,
    MESSAGE_EXPIRY,
    PINGREQ_PACKET,
    PUBACK,
    PUBLISH,
    PUBREC,
    SUBSCRIBE,
    TOPIC_ALIAS,
    UNSUBSCRIBE,
    UPGRADE,
    Head,
    MalformedPacket,
    PacketTooLarge,
    ProxyProtocolError,
    PublishHeader,
    RunRule,
    Stored,
    ack,
    first,
    identifier_marks,
    placeholder_packet,
    publish_header,
    stored_headers,
    type_mask,
    upgrade_packet,
    upgrade_publish,
)

log = logging.getLogger("proxy")

#: The most of a PUBLISH's variable header (topic, id, properties) held to read it.
MAX_PUBLISH_HEADER = 256 * 1024


async def relay_up(conn: Conn, services: Services) -> None:
    """Relay until the client disconnects (or closes: :class:`PeerGone`).

    Before its login is answered only AUTH packets pass (MQTT 5 enhanced authentication):
    nothing else the client sent is read meanwhile (a refused login has the proxy hold
    nothing more than its CONNECT) or acted on (no upload with credentials the broker has
    not accepted). A refused login ends here. Once logged in, what the proxy need not read
    goes to the broker in runs, as it came (:func:`run_rule`).
    """
    if not conn.connect.authenticates and not await _logged_in(conn):
        return
    rule = None
    stop = _stop(conn)
    while True:
        if rule is None and conn.connack_seen.is_set() and conn.accepted:
            rule = run_rule(conn)  # the broker's limit is known, its CONNACK passed on
        if rule is not None:
            run = await conn.client.run(rule, stop)
            if run is None:
                raise PeerGone("the client closed without DISCONNECT")
            if run:
                send(conn.broker_writer, run)  # whole packets, no await inside: no lock
                await drained(conn.broker_writer, conn.broker.idle)
                continue
        head = await conn.client.head()
        if head is None:  # the broker publishes the Will: worth the log's one line
            raise PeerGone("the client closed without DISCONNECT")
        if not conn.connack_seen.is_set() and head.type != AUTH:
            if conn.connect.authenticates and head.type != DISCONNECT:
                raise ProxyProtocolError("only AUTH or DISCONNECT before this login's CONNACK")
            if not await _logged_in(conn):
                return
        if head.type == PUBLISH:
            await _publish(conn, services, head)
        elif head.type == CONNECT:
            raise ProxyProtocolError("a second CONNECT")
        elif conn.upgraded and head.type in (SUBSCRIBE, UNSUBSCRIBE):  # 3.1.1 client
            if head.length > MAX_PUBLISH_HEADER:
                raise PacketTooLarge(f"a SUBSCRIBE over {MAX_PUBLISH_HEADER} bytes")
            send(conn.broker_writer, upgrade_packet(head.first, await conn.client.body(head)))
            await drained(conn.broker_writer, conn.broker.idle)
        else:
            body = conn.client.whole_body(head)
            if body is None:
                await forward(conn, head)
            else:  # the whole packet is in hand, one write
                send(conn.broker_writer, head.raw + body)
                await drained(conn.broker_writer, conn.broker.idle)
            if head.type == DISCONNECT:
                return


def run_rule(conn: Conn) -> RunRule:
    """What the broker gets as it came: a PUBLISH within the broker's limit without a
    Topic Alias (:class:`proxy.protocol.AliasMap` keeps the client's and the broker's
    views of those), and every other packet but CONNECT and DISCONNECT. A 3.1.1 client's
    PUBLISH gets its empty property section in the run (`UPGRADE`); its SUBSCRIBE and
    UNSUBSCRIBE are translated one by one (:func:`_stop`)."""
    if conn.upgraded:
        return RunRule(conn.broker_limit, False, translate=UPGRADE)
    aliases = identifier_marks(TOPIC_ALIAS) if conn.connect.v5 else ()
    return RunRule(conn.broker_limit, conn.connect.v5, property_marks=aliases)


def _stop(conn: Conn) -> Callable[[], int]:
    mask = type_mask(CONNECT, DISCONNECT)
    if conn.upgraded:
        mask |= type_mask(SUBSCRIBE, UNSUBSCRIBE)
    return lambda: mask


async def _logged_in(conn: Conn) -> bool:
    """Wait for the broker's answer to the login; whether it accepted it."""
    await conn.connack_seen.wait()
    return conn.accepted


async def forward(conn: Conn, head: Head, prefix: bytes = b"") -> None:
    """Copy the rest of `head`'s packet to the broker as it arrives."""
    writer = conn.broker_writer
    async with conn.broker_lock:  # pieces across awaits: no chunk answer in between
        send(writer, head.raw + prefix)
        async for piece in conn.client.pieces(head):
            send(writer, piece)
            await drained(writer, conn.broker.idle)
        await drained(writer, conn.broker.idle)


async def _read_header(
    conn: Conn, head: Head, pieces: AsyncIterator[bytes]
) -> tuple[PublishHeader, bytes]:
    qos = (head.first >> 1) & 0x03
    prefix = b""
    async for piece in pieces:
        prefix += piece
        header = publish_header(prefix, qos=qos, v5=conn.connect.v5)
        if header is not None:
            return header, prefix
        if len(prefix) > MAX_PUBLISH_HEADER:
            raise PacketTooLarge(f"a PUBLISH header over {MAX_PUBLISH_HEADER} bytes")
    header = publish_header(prefix, qos=qos, v5=conn.connect.v5)
    if header is None:
        raise MalformedPacket("PUBLISH ends inside its variable header")
    return header, prefix


def qos_of(head: Head) -> int:
    return (head.first >> 1) & 0x03


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an (empty) async generator


@dataclass(frozen=True, slots=True)
class Framed:
    """A PUBLISH framed one by one, read as far as its variable header, in the form the
    broker gets (MQTT 5 for a 3.1.1 client; its Topic Alias as the broker knows it)."""

    head: Head
    header: PublishHeader
    prefix: bytes  # its variable header and what came of its payload with it
    pieces: AsyncIterator[bytes]  # the rest of its body, as it arrives
    whole: bool  # it was all in hand: `pieces` yields nothing
    topic: str  # its topic, a Topic Alias resolved


async def _framed(conn: Conn, head: Head) -> Framed:
    whole = conn.client.whole_body(head)
    if whole is not None:  # fast path: the packet is in hand
        header_or_none = publish_header(whole, qos=(head.first >> 1) & 0x03, v5=conn.connect.v5)
        if header_or_none is None:
            raise MalformedPacket("PUBLISH ends inside its variable header")
        header, prefix, pieces = header_or_none, whole, _nothing()
    else:
        pieces = conn.client.pieces(head)
        header, prefix = await _read_header(conn, head, pieces)
    if conn.upgraded:  # a 3.1.1 client: the broker gets the MQTT 5 form
        head, header, prefix = upgrade_publish(head, header, prefix)
    topic = conn.aliases.topic(header)
    head, header, prefix = conn.aliases.for_broker(head, header, prefix)
    return Framed(head, header, prefix, pieces, whole is not None, topic)


async def _pass_on(conn: Conn, publish: Framed) -> None:
    """A PUBLISH within the broker's limit, to the broker as it arrives."""
    writer = conn.broker_writer
    if publish.whole:  # one write, no await inside: needs no lock
        send(writer, publish.head.raw + publish.prefix)
    else:
        async with conn.broker_lock:  # pieces across awaits: no chunk answer in between
            send(writer, publish.head.raw + publish.prefix)
            async for piece in publish.pieces:
                send(writer, piece)
                await drained(writer, conn.broker.idle)
    conn.aliases.sent(publish.header)
    await drained(writer, conn.broker.idle)


async def _publish(conn: Conn, services: Services, head: Head) -> None:
    publish = await _framed(conn, head)
    if len(publish.head.raw) + publish.head.length <= conn.broker_limit:
        await _pass_on(conn, publish)
        return
    head, header, prefix, pieces = publish.head, publish.header, publish.prefix, publish.pieces
    topic = publish.topic
    size = head.length - header.size

    async def payload() -> AsyncIterator[bytes]:
        if len(prefix) > header.size:
            yield prefix[header.size :]
        async for piece in pieces:
            yield piece

    if await resent(conn, services, head, header, size, payload):  # a QoS 2 resend
        return
    conn.transfers += 1
    # The placeholder's header: the device's, with the trace context when it set none.
    span, announced = start_offload(
        services.tracing, services.metrics.offload_seconds,
        topic=topic, size=size, header=header, properties=conn.broker_v5,
    )  # fmt: skip
    if announced is not header and not _fits(conn, services, announced, size):
        announced = header  # the trace context only where the placeholder still fits
    known = prefix[header.size :] if publish.whole else None  # the whole payload
    try:
        stored = await _upload(
            conn, services, topic, announced, size, payload(), span.context, known
        )
    except TransferFailed as exc:
        span.fail(exc)
        async for _ in pieces:  # the rest of the refused PUBLISH, so the stream stays framed
            pass
        await _refuse(conn, services, head, header, exc)
        return
    finally:
        conn.transfers -= 1
        span.end()
    packet = placeholder_packet(head.first, announced, stored, v5=conn.broker_v5)
    if header.packet_id is not None:
        conn.unacked.add(header.packet_id)
        remember(conn, services, head, header, stored)
    conn.broker_writer.write(packet)
    conn.aliases.sent(header)  # only now: a refused PUBLISH set no alias at the broker
    await drained(conn.broker_writer, conn.broker.idle)
    services.metrics.offloaded.inc()
    log.info(
        "offloaded",
        extra={"topic": topic, "size": size, "id": str(stored.message_id), "qos": qos_of(head)},
    )


async def _upload(
    conn: Conn,
    services: Services,
    topic: str,
    header: PublishHeader,
    size: int,
    payload: AsyncIterator[bytes],
    trace: TraceContext | None = None,
    known: bytes | None = None,
) -> Stored:
    endpoint = services.endpoint()
    if endpoint is None:
        raise TransferFailed("no gateway endpoint known yet (no discovery record)")
    if services.closing.is_set():
        raise TransferFailed("the proxy is shutting down")
    if not _fits(conn, services, header, size):
        # Its properties alone are over the limit: the broker would refuse the placeholder.
        raise TransferFailed(
            "even the placeholder is over the broker's limit", reason=IMPLEMENTATION_SPECIFIC
        )
    if not head_fits(stored_headers(header)):
        raise TransferFailed(
            "its properties are over the gateway's request head", reason=IMPLEMENTATION_SPECIFIC
        )
    try:  # the device's account and address each hold at most their share
        slot = services.uploads.take_now(conn.holder)
    except PoolFull as exc:
        raise TransferFailed(f"too many uploads at once ({exc})", reason=QUOTA_EXCEEDED) from exc
    pinger = asyncio.create_task(_keep_broker_alive(conn))
    offload = _offload(
        _Upload(conn, services, endpoint, topic, header, trace, slot), size, payload, known
    )
    try:
        if header.packet_id is None:  # QoS 0: nobody waits for an answer (see _unless_left)
            stored = await offload
        else:
            stored = await _unless_left(conn, services, offload)
        if conn.account is None:  # a JWT the gateway has now accepted: its account counts
            conn.account = services.tokens.confirm(conn.auth)
        return stored
    finally:
        pinger.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pinger
        slot.give_back()


@dataclass(frozen=True, slots=True)
class _Upload:
    """What one offloaded PUBLISH is stored with: its client, the gateway, its topic and
    header, its trace, and the upload slot it holds."""

    conn: Conn
    services: Services
    endpoint: str
    topic: str
    header: PublishHeader
    trace: TraceContext | None
    slot: Taken


async def _offload(
    up: _Upload, size: int, payload: AsyncIterator[bytes], known: bytes | None
) -> Stored:
    """The payload stored: linked to the same payload its account stores already when it
    may be read whole first (dedup, proxy/_lifecycle.py), else uploaded."""
    lifecycle = up.services.lifecycle
    if lifecycle is None:
        return await _send(up, size, payload)
    async with lifecycle.ahead(size, payload, known) as (whole, payload):
        if whole is not None:
            linked = await _linked(up, lifecycle, whole)
            if linked is not None:
                return linked
        return await _send(up, size, payload)


async def _unless_left(
    conn: Conn, services: Services, upload: Coroutine[Any, Any, Stored]
) -> Stored:
    """`upload`, given up when the client leaves before it ends.

    A QoS 1 or 2 PUBLISH is answered with the broker's PUBACK/PUBREC once stored: a client
    that closed before has given that answer up (it resends with its session, or reports the
    message failed), so nothing is stored or published for it later, when a slow gateway
    answers (:mod:`proxy._departure`; the upload's connection is reset). A QoS 0 PUBLISH
    waits for no answer: its client may close right after it (mosquitto_pub does, with a
    DISCONNECT), and what it sent is offloaded as a broker would publish it.

    The watch looks every :data:`proxy._departure.POLL` seconds, and a client's departure
    may show only once its whole PUBLISH is in (a client killed with part of it unsent: its
    kernel sends the FIN after the rest, which the proxy reads when the gateway takes it
    again), so a stored payload is looked at once more: the client that left by then gets
    nothing published either, and its payload stays in the store until its TTL (the
    gateway has no deletion for its uploader).

    Raises:
        PeerGone: the client left first.
    """
    task = asyncio.ensure_future(upload)
    watch = asyncio.ensure_future(departure(conn.client_writer))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, watch):
            pending.cancel()
        await asyncio.wait((task, watch))  # the upload's channel aborted, its link cut
    if task.cancelled():
        log.info("offload abandoned: the client left before its answer")
    else:
        stored = task.result()
        if not left(conn.client_writer):
            return stored
        log.info(
            "offload abandoned: the client left before its answer, its payload stored",
            extra={"id": str(stored.message_id)},  # kept until it expires
        )
    services.metrics.failed.labels(why="client-left").inc()
    raise PeerGone("the client left while its PUBLISH was offloaded")


def _ttl(header: PublishHeader) -> int | None:
    """The payload's time to live: the PUBLISH's Message Expiry Interval, if any."""
    expiry = first(header.properties, MESSAGE_EXPIRY)
    return expiry if isinstance(expiry, int) else None


async def _send(up: _Upload, size: int, payload: AsyncIterator[bytes]) -> Stored:
    return await up.services.gateway.upload(
        up.endpoint,
        topic=up.topic,
        size=size,
        pieces=payload,
        headers=stored_headers(up.header),
        ttl=_ttl(up.header),
        auth=up.conn.auth,
        peer=up.conn.peer,
        on_bytes=up.services.metrics.bytes_up.inc,
        trace=up.trace,
        # The slot is the gateway exchange's: a refused one frees it while the device may
        # still be sending (or sitting on) the rest of its PUBLISH.
        on_exchanged=up.slot.give_back,
    )


async def _linked(up: _Upload, lifecycle: Lifecycle, payload: bytes | bytearray) -> Stored | None:
    """The message linked to the payload the device's account stores already; None: upload."""
    try:
        return await lifecycle.link(
            up.endpoint, topic=up.topic, payload=payload, headers=stored_headers(up.header),
            ttl=_ttl(up.header), auth=up.conn.auth, trace=up.trace,
        )  # fmt: skip
    except UploadError as exc:  # the login or the access refused: as the upload would be
        raise TransferFailed(str(exc), exc.status) from exc


def _fits(conn: Conn, services: Services, header: PublishHeader, size: int) -> bool:
    """Whether the placeholder for a payload of `size` bytes with `header` fits the broker."""
    endpoint = services.endpoint() or ""
    probe = Stored(f"{endpoint}/msg/{MessageId.new()}", size, "0" * 64, MessageId.new())
    return len(placeholder_packet(0x30, header, probe, v5=conn.broker_v5)) <= conn.broker_limit


async def _keep_broker_alive(conn: Conn) -> None:
    """PINGREQ to the broker while the client's bytes go to the gateway: the broker sees
    nothing else from this connection meanwhile and would drop it after 1.5 keep-alives.
    The PINGRESPs are not the client's: the broker-to-client relay swallows them."""
    if conn.keepalive <= 0:
        return
    while True:
        await asyncio.sleep(conn.keepalive / 2)
        conn.pings_in_flight += 1
        conn.broker_writer.write(PINGREQ_PACKET)


async def _refuse(
    conn: Conn, services: Services, head: Head, header: PublishHeader, exc: TransferFailed
) -> None:
    """Tell the client its PUBLISH was not stored: a reason code, or the connection closed.

    A 3.1.1 client has no reason codes: a refusal it could resend with success (0x80,
    0x97) closes its connection, so it resends after reconnecting; one it cannot (0x83,
    0x87) gets a plain PUBACK/PUBREC, the message dropped, as mosquitto answers a 3.1.1
    client's PUBLISH that its ACL refuses (closing would have it resend for ever).
    """
    qos = (head.first >> 1) & 0x03
    services.metrics.failed.labels(why=str(exc.status or exc.reason)).inc()
    log.warning("offload refused", extra={"why": str(exc), "status": exc.status})
    if not conn.connect.v5 and exc.reason not in FINAL_REASONS:
        raise PeerGone(f"offload failed, 3.1.1 client disconnected: {exc}")
    if qos and header.packet_id is not None:
        kind = PUBACK if qos == 1 else PUBREC
        answer = ack(kind, header.packet_id, exc.reason, v5=conn.connect.v5)
        async with conn.client_lock:  # never inside a packet the other direction is writing
            conn.client_writer.write(answer)
