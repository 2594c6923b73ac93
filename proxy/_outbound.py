"""Broker to client: packets relayed as they are, a placeholder resolved for a client that
does not resolve them itself.

A delivered PUBLISH small enough to be a placeholder is read whole (at most
:data:`MAX_PLACEHOLDER_PUBLISH` bytes) and checked with the library's rule; anything larger
streams through untouched. A placeholder is replaced by its payload when the client has not
announced that it resolves placeholders itself (:data:`proxy.protocol.PLACEHOLDER_AWARE`),
its URL is on the gateway in force (a placeholder pointing anywhere else is never fetched:
no SSRF through the proxy), and the PUBLISH with the payload fits the client's Maximum
Packet Size. Otherwise, and whenever the fetch cannot start, the client gets the placeholder
as the broker sent it (small, and what our library would resolve).

Before anything is written, the gateway is asked with the client's own login what it holds
for the placeholder (a HEAD: :mod:`proxy._stat`): a placeholder whose size or SHA-256 is not
the stored one (its publisher's lie) goes to the client as it is, counted
(`placeholders_passed{why="mismatch"}`) and remembered (:class:`proxy._state.Poisoned`),
and costs the client nothing. The payload then comes from one fetch shared with every other
client behind this proxy that gets the same placeholder meanwhile (:mod:`proxy._flights`),
each fed at its own pace; its last byte is held back until the fetched bytes matched the
SHA-256. Only bytes that change while they are fetched (the store lies, or the fetch breaks
off) close the client's connection before the packet is complete, so the client never
receives a payload that fails its check. An encrypted or compressed payload is decoded
whole first (:mod:`proxy._unseal`).
"""

from __future__ import annotations

import contextlib
import functools
import logging

from client.protocol import (
    CHUNK_PROPERTY,
    FORMAT_KEY,
    MalformedPlaceholder,
    Placeholder,
    address_key,
    http_origin,
)

from ._admit import claim_account
from ._chunks import answer_pubrel, large_publish, take_chunk
from ._exceptions import PayloadMismatch, PeerGone, PeerTimeout, TransferFailed
from ._flights import Source
from ._resends import ended
from ._settings import MQTT_MAX_PACKET
from ._state import Conn, Services
from ._stream import drain_within, drained, send, write_all, write_piece
from ._tracing import Timed, start_fetch
from ._turns import turn_key
from ._unseal import resolve_encoded
from ._will import settle
from .protocol import (
    AUTH,
    CONNACK,
    DISCONNECT,
    DOWNGRADE,
    MAXIMUM_PACKET_SIZE,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    TOPIC_ALIAS_MAXIMUM,
    UNSUBACK,
    Head,
    ProxyProtocolError,
    PublishHeader,
    RunRule,
    connack_packet,
    connack_refusal,
    downgrade_connack,
    downgrade_packet,
    downgraded_publish_head,
    first,
    name_marks,
    parse_connack,
    publish_header,
    read_placeholder,
    resolved_head,
    resolved_size,
    type_mask,
    u32_property,
)

log = logging.getLogger("proxy")

#: A delivered PUBLISH up to this size is read whole to see whether it is a placeholder
#: (64 KiB of JSON at most, the library's bound, plus the header).
MAX_PLACEHOLDER_PUBLISH = 65536 + 4096
MAX_CONNACK = 65536
SERVER_KEEP_ALIVE = 0x13
UNAVAILABLE = 0x88  # CONNACK: Server unavailable (3.1.1: 3)


async def relay_down(conn: Conn, services: Services) -> None:
    """Relay until the broker closes (or refuses the login); what the proxy need not read
    goes to the client in runs, as it came (:func:`run_rule`, :func:`_stop`)."""
    if not await _login(conn, services):
        return
    # From now on both directions take the account's turns (proxy/_turns.py).
    conn.client.turn = conn.broker.turn = services.turns.of(
        turn_key(conn.account, address_key(conn.peer))
    )
    rule, stop = run_rule(conn), functools.partial(_stop, conn)
    while True:
        run = await conn.broker.run(rule, stop)
        if run is None:
            return
        if run:
            send(conn.client_writer, run)  # whole packets, no await inside: no lock
            await drained(conn.client_writer, conn.client.idle)
            continue
        head = await conn.broker.head()
        if head is None:
            return
        if head.type == PINGRESP and conn.pings_in_flight > 0:
            conn.pings_in_flight -= 1  # ours, sent while an upload ran
        elif head.type in (PUBACK, PUBREC) and conn.unacked and head.length <= MAX_CONNACK:
            answer = await conn.broker.body(head)  # the answer to a placeholder we sent?
            conn.unacked.discard(int.from_bytes(answer[:2], "big"))
            if not await _to_client(conn, head, answer):
                return
        elif head.type == PUBREL and conn.kept_rel and head.length <= MAX_CONNACK:
            release = await conn.broker.body(head)  # for a chunk the proxy kept?
            kept = await answer_pubrel(conn, int.from_bytes(release[:2], "big"))
            if not kept and not await _to_client(conn, head, release):
                return
        elif head.type == PUBCOMP and conn.stored_flows and head.length <= MAX_CONNACK:
            complete = await conn.broker.body(head)  # ends a QoS 2 flow the proxy stored?
            ended(conn, services, int.from_bytes(complete[:2], "big"))
            if not await _to_client(conn, head, complete):
                return
        elif head.type == PUBLISH and not conn.connect.handles_placeholders:
            if head.length <= MAX_PLACEHOLDER_PUBLISH:
                await _publish(conn, services, head)
            elif conn.broker_v5:  # chunks (ADR 23) carry user properties: MQTT 5 only
                await large_publish(conn, services, head)
            else:
                await _stream(conn, head)
        elif conn.upgraded:  # acknowledgements and the like, in their 3.1.1 form
            if head.length > MAX_CONNACK:
                raise PeerGone(f"the broker sent a packet of type {head.type} over 64 KiB")
            if not await _to_client(conn, head, await conn.broker.body(head)):
                return
        else:
            body = conn.broker.whole_body(head)
            if body is not None:  # one write, no await inside: needs no lock
                send(conn.client_writer, head.raw + body)
                await drained(conn.client_writer, conn.client.idle)
                continue
            await _stream(conn, head)


#: A placeholder's JSON names its format (the library's rule: a PUBLISH without the user
#: property is still one when its payload is such JSON; MQTT 3.1.1 has no properties).
FORMAT_MARK = b'"' + FORMAT_KEY.encode() + b'"'


def run_rule(conn: Conn) -> RunRule:
    """What the client gets as it came: for a client that resolves placeholders itself,
    every PUBLISH; for any other, a PUBLISH without a user property named `_format` (a
    placeholder) or `__chunk` (a chunk) whose payload does not name `_format` (a
    placeholder's JSON): other user properties (a `traceparent`, the application's own)
    pass. On an upgraded link (a 3.1.1 client) the same PUBLISHes pass in their 3.1.1
    form, and the acknowledgements (`DOWNGRADE`); the packets that differ more stop the run
    (:func:`_stop`)."""
    translate = DOWNGRADE if conn.upgraded else 0
    if conn.connect.handles_placeholders:
        return RunRule(MQTT_MAX_PACKET, conn.broker_v5, translate=translate)
    tags = name_marks(FORMAT_KEY, CHUNK_PROPERTY) if conn.broker_v5 else ()
    return RunRule(
        MQTT_MAX_PACKET,
        conn.broker_v5,
        property_marks=tags,
        json_mark=FORMAT_MARK,
        translate=translate,
    )


def _stop(conn: Conn) -> int:
    """The packet types the proxy must read now: the answers to what it sent the broker
    itself (a PINGREQ, a placeholder's PUBLISH, a kept chunk's PUBREC) while they are due,
    the end of a QoS 2 flow it stored; on an upgraded link also what has another form in
    3.1.1 than an acknowledgement's (CONNACK, SUBACK, UNSUBACK) or none (DISCONNECT,
    AUTH)."""
    mask = _UPGRADED if conn.upgraded else 0
    if conn.pings_in_flight:
        mask |= _PINGRESP
    if conn.unacked:
        mask |= _ANSWERS
    if conn.kept_rel:
        mask |= _PUBREL
    if conn.stored_flows:
        mask |= _PUBCOMP
    return mask


_PINGRESP, _PUBREL, _PUBCOMP = type_mask(PINGRESP), type_mask(PUBREL), type_mask(PUBCOMP)
_ANSWERS = type_mask(PUBACK, PUBREC)
_UPGRADED = type_mask(CONNACK, SUBACK, UNSUBACK, DISCONNECT, AUTH)


async def _to_client(conn: Conn, head: Head, body: bytes) -> bool:
    """Write a whole packet other than PUBLISH and CONNACK to the client, in its 3.1.1 form
    when the link is upgraded; False when it has none (the broker's DISCONNECT: end)."""
    packet = head.raw + body
    if conn.upgraded:
        try:
            downgraded = downgrade_packet(head.first, body)
        except ProxyProtocolError as exc:
            raise PeerGone(f"the broker sent a malformed packet: {exc}") from exc
        if downgraded is None:
            return False
        packet = downgraded
    send(conn.client_writer, packet)  # one write, no await inside: needs no lock
    await drained(conn.client_writer, conn.client.idle)
    return True


async def _stream(conn: Conn, head: Head) -> None:
    """Relay a packet as it arrives."""
    async with conn.client_lock:  # pieces across awaits: nothing else in between
        send(conn.client_writer, head.raw)
        await write_all(conn.client_writer, conn.broker.pieces(head), conn.client.idle)


async def _login(conn: Conn, services: Services) -> bool:
    """The broker's answer to the CONNECT: AUTH packets relayed, then its CONNACK, each
    within `connect_timeout` (else the client is refused with 0x88); whether the login was
    accepted and the session goes on."""
    try:
        while True:
            head = await _answer(conn, services.settings.connect_timeout)
            if head.length > MAX_CONNACK:
                raise PeerGone(f"the broker sent a packet of type {head.type} over 64 KiB")
            if head.type == CONNACK:
                return await _connack(conn, services, head)
            if head.type != AUTH or conn.upgraded:
                raise PeerGone(f"the broker sent a packet of type {head.type} before CONNACK")
            await _to_client(conn, head, await conn.broker.body(head))
    finally:
        conn.connack_seen.set()  # relay_up reads on, or ends (conn.accepted)


async def _answer(conn: Conn, timeout: float) -> Head:
    """The head of the broker's next packet before its CONNACK.

    Raises:
        PeerTimeout: none within `timeout` seconds (the client is refused with 0x88).
        PeerGone: the broker closed.
    """
    try:
        head = await conn.broker.head(timeout)
    except PeerTimeout as exc:
        async with conn.client_lock:
            conn.client_writer.write(connack_refusal(v5=conn.connect.v5, reason=UNAVAILABLE))
        raise PeerTimeout(f"the broker did not answer the CONNECT within {timeout} s") from exc
    if head is None:
        raise PeerGone("the broker closed the connection before its CONNACK")
    return head


async def _connack(conn: Conn, services: Services, head: Head) -> bool:
    """Learn the broker's limits; tell an MQTT 5 client the proxy's own limit instead; a
    pending Will is stored first. Whether the login was accepted."""
    body = await conn.broker.body(head)
    packet = head.raw + body
    try:
        connack = parse_connack(body, v5=conn.broker_v5)
    except ProxyProtocolError as exc:
        raise PeerGone(f"the broker's CONNACK is malformed: {exc}") from exc
    settings = services.settings
    if conn.broker_v5:
        limit = connack.max_packet_size
        unsaid = settings.broker_max_packet_size if conn.upgraded else MQTT_MAX_PACKET
        conn.broker_limit = limit if limit is not None else unsaid
        alias_max = first(connack.properties, TOPIC_ALIAS_MAXIMUM)
        conn.aliases.maximum = alias_max if isinstance(alias_max, int) else 0
        keepalive = first(connack.properties, SERVER_KEEP_ALIVE)
        if isinstance(keepalive, int):
            conn.keepalive = keepalive
        if conn.upgraded:
            packet = downgrade_connack(connack)
        elif connack.reason == 0:
            props = tuple(p for p in connack.properties if p.id != MAXIMUM_PACKET_SIZE)
            if settings.max_packet_size < MQTT_MAX_PACKET:
                props += (u32_property(MAXIMUM_PACKET_SIZE, settings.max_packet_size),)
            packet = connack_packet(connack, props)
    if connack.reason != 0:
        log.info("login refused by the broker", extra={"reason": connack.reason})
    else:
        conn.accepted = True
        if not await claim_account(conn, services):  # its account's share of the connections
            conn.accepted = False
            return False
        will, conn.will = conn.will, None
        if will is not None and not await settle(conn, services, will):
            conn.accepted = False
            return False
    async with conn.client_lock:
        conn.client_writer.write(packet)
        await drained(conn.client_writer, conn.client.idle)
    if conn.login is not None:
        conn.login.give_back()  # the login is answered: its CONNECT is no longer held
    return conn.accepted


async def _publish(conn: Conn, services: Services, head: Head) -> None:
    body = await conn.broker.body(head)
    ref = None
    header = None
    try:
        header = publish_header(body, qos=(head.first >> 1) & 0x03, v5=conn.broker_v5)
        if header is not None:
            ref = read_placeholder(header, body[header.size :])
    except MalformedPlaceholder:
        services.metrics.passed.labels(why="malformed").inc()
    except ProxyProtocolError:
        pass  # not ours to police: the broker sent it, the client decides
    if ref is not None and header is not None:
        async with conn.client_lock:
            if await _resolve(conn, services, head, header, ref):
                return
    elif (
        header is not None
        and conn.broker_v5
        and await take_chunk(conn, services, head, header, body)
    ):
        return
    if conn.upgraded:
        if header is None:
            raise PeerGone("the broker sent a malformed PUBLISH")
        payload = body[header.size :]
        try:
            conn.client_writer.write(downgraded_publish_head(head.first, header, len(payload)))
        except ProxyProtocolError as exc:
            raise PeerGone(f"the broker sent a PUBLISH a 3.1.1 client cannot take: {exc}") from exc
        conn.client_writer.write(payload)
    else:
        conn.client_writer.write(head.raw + body)
    await drained(conn.client_writer, conn.client.idle)


def _why_not(conn: Conn, services: Services, header: PublishHeader, ref: Placeholder) -> str | None:
    """Why this placeholder is handed on as it is, or None to resolve it."""
    endpoint = services.endpoint()
    if endpoint is None:
        return "no-endpoint"
    if ref.origin != http_origin(endpoint):
        return "untrusted-origin"
    if ref in services.poisoned:
        return "failed-before"
    if (
        ref.encoding.plain
        and resolved_size(header, ref.size, v5=conn.connect.v5) > conn.client_limit
    ):
        return "client-limit"  # a decoded payload's size is known once decoded (_unseal)
    return None


async def _resolve(
    conn: Conn, services: Services, head: Head, header: PublishHeader, ref: Placeholder
) -> bool:
    """Write the PUBLISH with the payload; False when the placeholder should go as it is.

    Raises:
        PeerGone: the payload failed after part of it was written (the client is cut off).
    """
    why = _why_not(conn, services, header, ref)
    if why is not None:
        services.metrics.passed.labels(why=why).inc()
        return False
    if not ref.encoding.plain:  # encrypted or compressed: decoded whole first
        return await resolve_encoded(conn, services, head, header, ref)
    span = start_fetch(
        services.tracing, services.metrics.fetch_seconds,
        header=header, ref=ref, topic=header.topic_text,
    )  # fmt: skip
    conn.transfers += 1
    try:
        # Waits while the device's account or address holds its share of the fetches (or
        # all are taken): a slow subscriber delays its own account's payloads, never the
        # others'. A payload other devices are being fed meanwhile is not fetched again.
        fetch = (ref, conn.auth, conn.peer, span.context)
        try:
            source = await services.shared.source(conn.holder, fetch)
        except TransferFailed as exc:
            span.fail(exc)
            handed_on(services, ref, exc)
            return False
        try:
            return await _write_resolved(conn, services, head, header, ref, source, span)
        finally:
            source.close()
    finally:
        conn.transfers -= 1
        span.end()


def handed_on(services: Services, ref: Placeholder, exc: TransferFailed) -> None:
    """Count and log why a placeholder goes to the client as it is, before any byte of its
    payload was written. A placeholder that names another payload than the gateway holds
    (the publisher's lie) is remembered, so a redelivery is not asked about again."""
    if isinstance(exc, PayloadMismatch):
        services.poisoned.add(ref)
        services.metrics.passed.labels(why="mismatch").inc()
        log.warning("placeholder names another payload; delivered", extra={"why": str(exc)})
        return
    services.metrics.passed.labels(why="fetch-failed").inc()
    log.warning("resolve failed; placeholder delivered", extra={"why": str(exc)})


async def _write_resolved(
    conn: Conn,
    services: Services,
    head: Head,
    header: PublishHeader,
    ref: Placeholder,
    source: Source,
    span: Timed,
) -> bool:
    """The PUBLISH with the payload from `source`, its head once the first piece is there
    (a fetch that fails before costs the client nothing); False when it failed before."""
    writer = conn.client_writer
    head_bytes = resolved_head(head.first, header, ref.size, v5=conn.connect.v5)
    written = False
    try:
        async with contextlib.aclosing(source.pieces()) as pieces:
            async for piece in pieces:
                if not written:
                    writer.write(head_bytes)
                    written = True
                await write_piece(writer, piece, conn.client.idle)
        if not written:  # an empty payload
            writer.write(head_bytes)
        await drain_within(writer, conn.client.idle)
    except TransferFailed as exc:
        span.fail(exc)
        if not written:
            handed_on(services, ref, exc)
            return False
        if isinstance(exc, PayloadMismatch):
            services.poisoned.add(ref)  # the store's bytes changed: a redelivery is not fed
        log.warning("resolve failed mid-packet; client cut off", extra={"why": str(exc)})
        raise PeerGone(str(exc)) from exc
    services.metrics.resolved.inc()
    if services.lifecycle is not None:  # delivered whole, verified: its group's (_lifecycle)
        services.lifecycle.confirm_soon(ref, conn.auth)
    return True
