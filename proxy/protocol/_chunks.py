"""ADR-23 chunks delivered to a client that does not reassemble them: what the proxy reads of
a chunk (for :class:`client.protocol.Reassembler`) and the one PUBLISH it writes for the whole
message. Pure.

The whole message goes to the client under the packet id of the chunk that completed it (and
with that chunk's QoS): the broker allocated that id and keeps it in flight until the client's
PUBACK/PUBREC for the whole message, which passes to the broker unchanged as the answer to
that chunk. So the id is free on the client's side (the broker uses it for nothing else), and
every other packet id keeps flowing end to end without a mapping table. The proxy answers the
other chunks itself (:func:`chunk_ack`).
"""

from __future__ import annotations

from dataclasses import dataclass

from client.protocol import CHUNK_PROPERTY, PublishProperties

from ._packets import PublishHeader, fixed_header
from ._properties import (
    CONTENT_TYPE,
    MESSAGE_EXPIRY,
    PAYLOAD_FORMAT,
    SUBSCRIPTION_ID,
    USER_PROPERTY,
    Prop,
    Value,
    encode_properties,
)
from ._wire import binary, text

RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
PUBACK_KIND, PUBREC_KIND = 4, 5


@dataclass(frozen=True, slots=True)
class ChunkPublish:
    """A delivered chunk as :meth:`client.protocol.Reassembler.feed` reads it."""

    topic: str
    payload: bytes
    properties: PublishProperties
    qos: int


def _publish_properties(props: tuple[Prop, ...]) -> PublishProperties:
    """The application properties among `props` (what the library's reassembly keeps)."""
    values: dict[int, Value] = {}
    users: list[tuple[str, str]] = []
    for p in props:
        if p.id == USER_PROPERTY and isinstance(p.value, tuple):
            users.append(p.value)
        else:
            values.setdefault(p.id, p.value)

    def number(ident: int) -> int | None:
        value = values.get(ident)
        return value if isinstance(value, int) else None

    def string(ident: int) -> str | None:
        value = values.get(ident)
        return value if isinstance(value, str) else None

    data = values.get(CORRELATION_DATA)
    return PublishProperties(
        payload_format_indicator=number(PAYLOAD_FORMAT),
        message_expiry_interval=number(MESSAGE_EXPIRY),
        content_type=string(CONTENT_TYPE),
        response_topic=string(RESPONSE_TOPIC),
        correlation_data=data if isinstance(data, bytes) else None,
        user_properties=tuple(users),
    )


def read_chunk(header: PublishHeader, payload: bytes, *, qos: int) -> ChunkPublish | None:
    """The chunk a delivered MQTT 5 PUBLISH carries; None when it is none, or when its topic
    stands behind a Topic Alias (the proxy cannot key it; it goes to the client as it is)."""
    if not any(
        p.id == USER_PROPERTY and isinstance(p.value, tuple) and p.value[0] == CHUNK_PROPERTY
        for p in header.properties
    ):
        return None
    if not header.topic:
        return None
    return ChunkPublish(header.topic_text, payload, _publish_properties(header.properties), qos)


def _encode(props: PublishProperties, delivery: tuple[Prop, ...]) -> bytes:
    out: list[Prop] = []
    if props.payload_format_indicator is not None:
        value = props.payload_format_indicator
        out.append(Prop(PAYLOAD_FORMAT, value, bytes([PAYLOAD_FORMAT, value])))
    if props.message_expiry_interval is not None:
        value = props.message_expiry_interval
        out.append(Prop(MESSAGE_EXPIRY, value, bytes([MESSAGE_EXPIRY]) + value.to_bytes(4, "big")))
    for ident, content in (
        (CONTENT_TYPE, props.content_type),
        (RESPONSE_TOPIC, props.response_topic),
    ):
        if content is not None:
            out.append(Prop(ident, content, bytes([ident]) + text(content)))
    if props.correlation_data is not None:
        data = props.correlation_data
        out.append(Prop(CORRELATION_DATA, data, bytes([CORRELATION_DATA]) + binary(data)))
    for name, value_text in props.user_properties:
        pair = (name, value_text)
        out.append(
            Prop(USER_PROPERTY, pair, bytes([USER_PROPERTY]) + text(name) + text(value_text))
        )
    out.extend(p for p in delivery if p.id == SUBSCRIPTION_ID)
    return encode_properties(out)


def whole_head(
    first_byte: int,
    last: PublishHeader,
    topic: str,
    properties: PublishProperties,
    size: int,
    *,
    v5: bool = True,
) -> bytes:
    """Fixed and variable header of the PUBLISH carrying a reassembled message of `size` bytes.

    `first_byte` and `last` are the completing chunk's (its QoS, DUP, retain flag, packet id
    and Subscription Identifiers); `properties` are chunk 0's without `__chunk`, left out
    for an MQTT 3.1.1 client (`v5` false).
    """
    variable = text(topic)
    if last.packet_id is not None:
        variable += last.packet_id.to_bytes(2, "big")
    if v5:
        variable += _encode(properties, last.properties)
    return fixed_header(first_byte, len(variable) + size) + variable


def whole_size(
    last: PublishHeader, topic: str, properties: PublishProperties, size: int, *, v5: bool = True
) -> int:
    """The size of the whole PUBLISH :func:`whole_head` starts."""
    return len(whole_head(0x30, last, topic, properties, size, v5=v5)) + size


def chunk_ack(qos: int, packet_id: int) -> bytes | None:
    """The proxy's own answer to a chunk it keeps: PUBACK (QoS 1), PUBREC (QoS 2), or None."""
    if qos == 1:
        return bytes([PUBACK_KIND << 4, 2]) + packet_id.to_bytes(2, "big")
    if qos == 2:
        return bytes([PUBREC_KIND << 4, 2]) + packet_id.to_bytes(2, "big")
    return None


def pubcomp(packet_id: int) -> bytes:
    """The PUBCOMP that ends a QoS 2 chunk the proxy kept (answer to the broker's PUBREL)."""
    return b"\x70\x02" + packet_id.to_bytes(2, "big")
