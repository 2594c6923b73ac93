"""A message sent as ADR-23 chunks: the fallback when it neither fits nor may be offloaded,
and the route of an encrypted one without an endpoint."""

from __future__ import annotations

import logging
from concurrent.futures import Future

from ..core._message import PublishResult, Route
from ..core._source import PayloadSource
from ..mqtt._paho import MqttConnection
from ..protocol import MessageId
from ..protocol._chunk import plan_chunks
from ._send import Send, wait_ack

log = logging.getLogger("client")

#: Chunk publishes outstanding at once: bounds what paho buffers for a huge chunked message.
CHUNK_WINDOW = 32


def publish_chunks(conn: MqttConnection, send: Send, source: PayloadSource) -> PublishResult:
    """Send `source` as the chunks of one ADR-23 message, at most CHUNK_WINDOW unacknowledged."""
    if send.retain:
        log.warning("retain flag dropped: a broker would retain only the last chunk")
    plan = plan_chunks(
        topic=send.topic,
        payload_size=source.size,
        sha256_hex=source.sha256,
        message_id=MessageId.new(),
        qos=send.qos,
        properties=send.carrying(send.properties),  # the context: on the first chunk
        limit=send.limit,
    )
    window: list[Future[None]] = []
    for chunk in plan:
        data = source.read_at(chunk.offset, chunk.length)
        window.append(
            conn.publish(send.topic, data, qos=send.qos, retain=False, properties=chunk.properties)
        )
        if len(window) >= CHUNK_WINDOW:
            wait_ack(window.pop(0), send.timeout, send.topic)
    for future in window:
        wait_ack(future, send.timeout, send.topic)
    return PublishResult(
        send.topic, Route.CHUNKED, source.size, source.sha256, plan.message_id, None, plan.total
    )
