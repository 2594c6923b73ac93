"""Broker to client: ADR-23 chunked messages reassembled for a client that does not do it.

A client that has not announced :data:`proxy.protocol.PLACEHOLDER_AWARE` (MQTT 5, or MQTT
3.1.1 on a link the proxy upgraded to MQTT 5: :mod:`proxy.protocol._v311`) gets one
PUBLISH with the whole message instead of its chunks. Each chunk is fed to the library's
:class:`client.protocol.Reassembler` (bounded per connection by `max_reassembly_bytes`, in
total by `max_reassembly_total`, in time by `reassembly_timeout`) and answered by the proxy
itself toward the broker (PUBACK, or PUBREC then PUBCOMP), except the chunk that completes
the message: the whole message goes to the client under that chunk's packet id and QoS
(:mod:`proxy.protocol._chunks` says why no mapping of ids is needed), and the client's own
PUBACK/PUBREC answers it. A message that fails (checksum, bounds, timeout) or that is larger
than the client's Maximum Packet Size is never delivered; its chunks are answered all the same.
"""

from __future__ import annotations

import asyncio
import logging

from client import untagged
from client.protocol import (
    ChunkComplete,
    ChunkFailure,
    MalformedPlaceholder,
    PayloadDecodeError,
    Reassembler,
)

from ._exceptions import PeerGone
from ._state import Conn, Services
from ._stream import drain_within, drained, write_all, write_piece
from ._unseal import decode_chunked, why_not_decoded
from .protocol import (
    Head,
    ProxyProtocolError,
    PublishHeader,
    chunk_ack,
    downgraded_publish_head,
    pubcomp,
    publish_header,
    read_chunk,
    whole_head,
    whole_size,
)

log = logging.getLogger("proxy")

#: The most of a delivered PUBLISH's variable header held to see whether it is a chunk.
MAX_DELIVERED_HEADER = 256 * 1024


def _reassembler(conn: Conn, services: Services) -> Reassembler:
    if conn.reassembler is None:
        settings = services.settings
        # Chunk entries cost RAM whatever their size (the library's chunk_bounds rule):
        # chunks of at least 63 KiB per message, 256 bytes of bookkeeping per entry.
        per_message = settings.max_reassembly_bytes // (63 * 1024) + 1
        tracked = max(settings.max_reassembly_bytes // 256, per_message)
        conn.reassembler = Reassembler(
            default_timeout=settings.reassembly_timeout,
            max_timeout=settings.reassembly_timeout,
            max_partial_messages=16,
            max_buffered_bytes=settings.max_reassembly_bytes,
            max_chunks_per_message=per_message,
            max_tracked_chunks=tracked,
        )
    return conn.reassembler


def release(conn: Conn, services: Services) -> None:
    """Give back what this connection's partial messages held of the total (it ends, or
    the total is exhausted and its partial messages are dropped)."""
    services.reassembly.used -= conn.reassembly_held
    conn.reassembly_held = 0
    conn.reassembler = None


async def large_publish(conn: Conn, services: Services, head: Head) -> None:
    """A delivered PUBLISH too large to be a placeholder: a chunk to keep (read whole when it
    fits `max_reassembly_bytes` and what is left of `max_reassembly_total`, dropped and
    answered when it does not), or anything else relayed as it streams."""
    pieces = conn.broker.pieces(head)
    qos = (head.first >> 1) & 0x03
    prefix = b""
    header = None
    async for piece in pieces:
        prefix += piece
        try:
            header = publish_header(prefix, qos=qos, v5=True)
        except ProxyProtocolError:
            break  # not ours to police: the broker sent it, the client decides
        if header is not None or len(prefix) > MAX_DELIVERED_HEADER:
            break
    settings = services.settings
    room = min(
        settings.max_reassembly_bytes, settings.max_reassembly_total - services.reassembly.used
    )
    if header is not None and read_chunk(header, b"", qos=qos) is not None:
        if head.length <= room:
            body = prefix + b"".join([piece async for piece in pieces])
            await take_chunk(conn, services, head, header, body)
            return
        async for _ in pieces:  # a chunk beyond the bounds: its message cannot be delivered
            pass
        services.metrics.chunk_failures.labels(why="bounds").inc()
        log.warning("a chunk larger than the reassembly bounds; dropped")
        await _answer(conn, qos, header.packet_id)
        return
    lead = head.raw + prefix
    if conn.upgraded:  # a 3.1.1 client: the same PUBLISH without its properties
        if header is None:
            raise PeerGone("the broker sent a PUBLISH whose header cannot be read")
        payload_size = head.length - header.size
        try:
            lead = downgraded_publish_head(head.first, header, payload_size) + prefix[header.size :]
        except ProxyProtocolError as exc:
            raise PeerGone(f"the broker sent a PUBLISH a 3.1.1 client cannot take: {exc}") from exc
    async with conn.client_lock:  # pieces across awaits: nothing else in between
        conn.client_writer.write(lead)
        await write_all(conn.client_writer, pieces, conn.client.idle)


async def take_chunk(
    conn: Conn, services: Services, head: Head, header: PublishHeader, body: bytes
) -> bool:
    """Keep a delivered PUBLISH if it is a chunk; False when it is none (relay it as it is)."""
    qos = (head.first >> 1) & 0x03
    chunk = read_chunk(header, body[header.size :], qos=qos)
    if chunk is None:
        return False
    metrics = services.metrics
    reassembler = _reassembler(conn, services)
    if services.reassembly.used + len(chunk.payload) > services.settings.max_reassembly_total:
        metrics.chunk_failures.labels(why="total").inc(max(reassembler.partial_messages, 1))
        log.warning("reassembly total exhausted; this connection's partial messages dropped")
        release(conn, services)
        reassembler = _reassembler(conn, services)
    now = asyncio.get_running_loop().time()
    outcome = reassembler.feed(chunk, now)
    failures = [*outcome.dropped, *reassembler.expire(now)]
    if isinstance(outcome, ChunkFailure):
        failures.append(outcome)
    for failure in failures:
        metrics.chunk_failures.labels(why=type(failure.error).__name__).inc()
        log.warning("chunked message dropped", extra={"why": str(failure.error)})
    held = reassembler.buffered_bytes
    services.reassembly.used += held - conn.reassembly_held
    conn.reassembly_held = held
    if isinstance(outcome, ChunkComplete) and await _deliver(conn, services, head, header, outcome):
        return True  # the client's PUBACK/PUBREC answers the completing chunk
    await _answer(conn, qos, header.packet_id)
    return True


async def _deliver(
    conn: Conn, services: Services, head: Head, last: PublishHeader, whole: ChunkComplete
) -> bool:
    payload = whole.payload
    assert isinstance(payload, bytes), "the in-memory chunk store returns bytes"
    v5 = conn.connect.v5  # a 3.1.1 client (upgraded link) gets no properties
    props = untagged(whole.properties)  # without the `_enc` / `_cmp` tags
    room = conn.client_limit - whole_size(last, whole.topic, props, 0, v5=v5) - 3
    limit = min(services.settings.max_decoded_bytes, room)
    try:  # sealed (encrypted or compressed) chunks: the message decoded, as for placeholders
        plain = await decode_chunked(services, whole.properties, payload, limit)
    except (PayloadDecodeError, MalformedPlaceholder) as exc:
        why = why_not_decoded(exc, client_bound=room < services.settings.max_decoded_bytes)
        services.metrics.chunk_failures.labels(why=why).inc()
        log.warning("reassembled message not decoded; dropped", extra={"why": str(exc)})
        return False
    size = plain.size if plain is not None else len(payload)
    try:
        if whole_size(last, whole.topic, props, size, v5=v5) > conn.client_limit:
            services.metrics.chunk_failures.labels(why="client-limit").inc()
            log.warning("reassembled message over the client's limit; dropped")
            return False
        async with conn.client_lock:
            writer = conn.client_writer
            writer.write(whole_head(head.first, last, whole.topic, props, size, v5=v5))
            for piece in plain.pieces() if plain is not None else (payload,):
                await write_piece(writer, piece, conn.client.idle)
            await drain_within(writer, conn.client.idle)
    finally:
        if plain is not None:
            plain.close()
    services.metrics.reassembled.inc()
    return True


async def _answer(conn: Conn, qos: int, packet_id: int | None) -> None:
    """PUBACK or PUBREC a chunk toward the broker in the client's stead."""
    if packet_id is None:
        return
    packet = chunk_ack(qos, packet_id)
    if packet is None:
        return
    if qos == 2:
        conn.kept_rel.add(packet_id)  # its PUBREL is ours to answer
    async with conn.broker_lock:
        conn.broker_writer.write(packet)
        await drained(conn.broker_writer, conn.broker.idle)


async def answer_pubrel(conn: Conn, packet_id: int) -> bool:
    """PUBCOMP a PUBREL for a chunk the proxy kept; False when the PUBREL is the client's."""
    if packet_id not in conn.kept_rel:
        return False
    conn.kept_rel.discard(packet_id)
    async with conn.broker_lock:
        conn.broker_writer.write(pubcomp(packet_id))
        await drained(conn.broker_writer, conn.broker.idle)
    return True
