"""A client's MQTT 5 PUBLISH properties as the bytes that go on the wire.

The Property Length (a Variable Byte Integer) and then each property: its one-byte
identifier and its value as MQTT 5 §2.2.2.2 encodes it, in identifier order as paho packs
them, user properties in their own order and with their duplicates. The sizes are those
:func:`client.protocol._size.properties_size` counts. Values are checked before
(:func:`client.protocol._props.publish_properties_problem`); subscription identifiers are
the broker's to send, never a client's, and are not encoded.
"""

from __future__ import annotations

from ._props import PublishProperties
from ._size import encode_varint

PAYLOAD_FORMAT_INDICATOR = 0x01
MESSAGE_EXPIRY_INTERVAL = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
TOPIC_ALIAS = 0x23
USER_PROPERTY = 0x26


def _binary(data: bytes) -> bytes:
    return len(data).to_bytes(2, "big") + data


def encode_properties(props: PublishProperties) -> bytes:
    """The Property Length and the properties of a PUBLISH a client sends."""
    out = bytearray()
    if props.payload_format_indicator is not None:
        out += bytes((PAYLOAD_FORMAT_INDICATOR, props.payload_format_indicator))
    if props.message_expiry_interval is not None:
        out.append(MESSAGE_EXPIRY_INTERVAL)
        out += props.message_expiry_interval.to_bytes(4, "big")
    if props.content_type is not None:
        out.append(CONTENT_TYPE)
        out += _binary(props.content_type.encode())
    if props.response_topic is not None:
        out.append(RESPONSE_TOPIC)
        out += _binary(props.response_topic.encode())
    if props.correlation_data is not None:
        out.append(CORRELATION_DATA)
        out += _binary(props.correlation_data)
    if props.topic_alias is not None:
        out.append(TOPIC_ALIAS)
        out += props.topic_alias.to_bytes(2, "big")
    for name, value in props.user_properties:
        out.append(USER_PROPERTY)
        out += _binary(name.encode())
        out += _binary(value.encode())
    return encode_varint(len(out)) + bytes(out)
