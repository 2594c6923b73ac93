"""Exact encoded size of an MQTT PUBLISH packet, and the largest payload under a size limit.

The broker states its limit at connect (MQTT 5 CONNACK Maximum Packet Size, the PIP-36 idea),
and that limit counts the *whole* packet: fixed header byte, Remaining Length varint, variable
header, properties and payload (MQTT 5 §3.1.2.11.4 / §3.2.2.3.6). So a client that wants to use
the limit to the byte, and never exceed it, has to know the exact encoded size. Everything here
is arithmetic over lengths: no packet is built and no paho type is used.

Brokers differ in how strictly they count. mosquitto 2.0 rejects a packet only when
``remaining_length + 1 > max_packet_size``, i.e. it forgets the Remaining Length bytes, so it
accepts packets up to 4 bytes larger than the limit. We compute the spec's size, which is never
larger than what any broker lets through.
"""

from __future__ import annotations

from ._errors import InvalidTopic, MessageTooLarge, ProtocolError
from ._props import PublishProperties

MQTT_V31 = 3
MQTT_V311 = 4
MQTT_V5 = 5

#: Largest Remaining Length a four-byte Variable Byte Integer can carry (MQTT 5 §1.5.5).
MAX_REMAINING_LENGTH = 268_435_455
#: Largest complete packet: fixed header byte + 4 length bytes + MAX_REMAINING_LENGTH.
MAX_PACKET_SIZE = 1 + 4 + MAX_REMAINING_LENGTH

_MAX_STRING_BYTES = 65_535  # two-byte length prefix of UTF-8 strings and binary data
_MAX_U32 = 2**32 - 1

# Largest value each Variable Byte Integer width can hold: where the width changes.
_VARINT_LIMITS = (127, 16_383, 2_097_151, MAX_REMAINING_LENGTH)


def encode_varint(value: int) -> bytes:
    """A Variable Byte Integer, 1 to 4 bytes (MQTT 5 §1.5.5).

    Raises:
        ProtocolError: `value` is negative or over 268,435,455 (a ValueError too).
    """
    if not 0 <= value <= MAX_REMAINING_LENGTH:
        raise ProtocolError(f"{value} does not fit a Variable Byte Integer")
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def varint_size(value: int) -> int:
    """Bytes a Variable Byte Integer takes on the wire (MQTT 5 §1.5.5).

    Args:
        value: the integer to encode, 0 to 268,435,455.

    Raises:
        ProtocolError: `value` cannot be encoded as a Variable Byte Integer.
    """
    if value < 0:
        raise ProtocolError(f"variable byte integer must not be negative, got {value}")
    for width, largest in enumerate(_VARINT_LIMITS, start=1):
        if value <= largest:
            return width
    raise ProtocolError(
        f"{value} does not fit a variable byte integer (max {MAX_REMAINING_LENGTH})"
    )


def _string_size(value: str, what: str) -> int:
    try:
        n = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ProtocolError(f"{what} is not valid UTF-8") from exc
    if n > _MAX_STRING_BYTES:
        raise ProtocolError(f"{what} is {n} bytes, longer than {_MAX_STRING_BYTES}")
    return 2 + n


def properties_size(properties: PublishProperties | None) -> int:
    """Bytes the PUBLISH properties take, *without* the Property Length varint in front.

    Each property is its one-byte identifier (all PUBLISH identifiers are below 128) followed by
    its value encoded as MQTT 5 §2.2.2.2 says. User properties keep their order and duplicates;
    each pair is encoded separately.

    Args:
        properties: the properties, or None for none.

    Raises:
        ProtocolError: a value that cannot be encoded (string over 65,535 bytes, integer out
            of range).
    """
    if properties is None:
        return 0
    p = properties
    size = 0
    if p.payload_format_indicator is not None:
        if p.payload_format_indicator not in (0, 1):
            raise ProtocolError(
                f"payload format indicator must be 0 or 1, got {p.payload_format_indicator}"
            )
        size += 1 + 1
    if p.message_expiry_interval is not None:
        if not 0 <= p.message_expiry_interval <= _MAX_U32:
            raise ProtocolError(f"message expiry interval {p.message_expiry_interval} is not a u32")
        size += 1 + 4
    if p.content_type is not None:
        size += 1 + _string_size(p.content_type, "content type")
    if p.response_topic is not None:
        size += 1 + _string_size(p.response_topic, "response topic")
    if p.correlation_data is not None:
        if len(p.correlation_data) > _MAX_STRING_BYTES:
            raise ProtocolError(f"correlation data longer than {_MAX_STRING_BYTES} bytes")
        size += 1 + 2 + len(p.correlation_data)
    for name, value in p.user_properties:
        size += (
            1
            + _string_size(name, "user property name")
            + _string_size(value, "user property value")
        )
    if p.topic_alias is not None:
        if not 0 <= p.topic_alias <= _MAX_STRING_BYTES:
            raise ProtocolError(f"topic alias {p.topic_alias} is not a u16")
        size += 1 + 2
    for sid in p.subscription_identifiers:
        if sid < 1:
            raise ProtocolError(f"subscription identifier must be at least 1, got {sid}")
        size += 1 + varint_size(sid)
    return size


def _variable_header_size(
    topic: str, *, qos: int, properties: PublishProperties | None, protocol: int
) -> int:
    """Topic name + packet identifier + (MQTT 5) property length and properties."""
    if qos not in (0, 1, 2):
        raise ValueError(f"qos must be 0, 1 or 2, got {qos!r}")
    try:
        topic_bytes = len(topic.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidTopic(topic, "not valid UTF-8") from exc
    if topic_bytes > _MAX_STRING_BYTES:
        raise InvalidTopic(topic, f"longer than {_MAX_STRING_BYTES} bytes")
    size = 2 + topic_bytes + (2 if qos > 0 else 0)
    if protocol == MQTT_V5:
        props = properties_size(properties)
        size += varint_size(props) + props
    elif protocol in (MQTT_V31, MQTT_V311):
        # MQTT 3.1/3.1.1 has no properties: whatever was asked for cannot be sent, so refusing
        # beats silently computing a size for a packet that would lose them.
        if properties is not None and properties != PublishProperties():
            raise ProtocolError(f"MQTT protocol level {protocol} cannot carry properties")
    else:
        raise ValueError(f"protocol must be 3, 4 (MQTT 3.1.1) or 5, got {protocol!r}")
    return size


def _total(variable_header: int, payload_len: int) -> int:
    remaining = variable_header + payload_len
    if remaining > MAX_REMAINING_LENGTH:
        # Not encodable at all: report the size the packet would need.
        return 1 + 4 + remaining
    return 1 + varint_size(remaining) + remaining


def publish_packet_size(
    topic: str,
    payload_len: int,
    *,
    qos: int,
    properties: PublishProperties | None,
    protocol: int = MQTT_V5,
) -> int:
    """The exact number of bytes a PUBLISH packet takes on the wire.

    Args:
        topic: the topic name as sent (an empty string when a topic alias replaces it).
        payload_len: payload length in bytes.
        qos: 0, 1 or 2; QoS 1 and 2 add the two-byte packet identifier.
        properties: MQTT 5 properties, or None. Must be None or empty for MQTT 3.x.
        protocol: 5 for MQTT 5, 4 for MQTT 3.1.1 (3 for 3.1): no properties section.

    Raises:
        MessageTooLarge: the packet would exceed the largest Remaining Length MQTT can encode.
        ProtocolError: a topic or property value that cannot be encoded.
        ValueError: `qos`, `protocol` or `payload_len` out of range.
    """
    if payload_len < 0:
        raise ValueError(f"payload_len must not be negative, got {payload_len}")
    total = _total(
        _variable_header_size(topic, qos=qos, properties=properties, protocol=protocol),
        payload_len,
    )
    if total > MAX_PACKET_SIZE:
        raise MessageTooLarge(total, MAX_PACKET_SIZE, "beyond the MQTT Remaining Length limit")
    return total


def max_payload(
    topic: str,
    *,
    qos: int,
    properties: PublishProperties | None,
    limit: int,
    protocol: int = MQTT_V5,
) -> int:
    """The largest payload length whose PUBLISH packet is at most `limit` bytes.

    The packet size grows by one byte per payload byte except where the Remaining Length varint
    gets wider (after 127, 16,383, 2,097,151 bytes): there it jumps by two, so some packet sizes
    cannot be hit exactly and the answer may leave the packet one byte short of `limit`.

    Args:
        topic: the topic name as sent.
        qos: 0, 1 or 2.
        properties: MQTT 5 properties, or None.
        limit: the Maximum Packet Size in bytes (whole packet). Values above what MQTT can
            encode are treated as that maximum.
        protocol: 5 for MQTT 5, 4 for MQTT 3.1.1.

    Raises:
        MessageTooLarge: not even an empty payload fits (the topic and properties alone exceed
            `limit`). Raising rather than returning a negative number keeps a caller from
            slicing with it by mistake.
        ProtocolError: a topic or property value that cannot be encoded.
        ValueError: `qos` or `protocol` out of range.
    """
    header = _variable_header_size(topic, qos=qos, properties=properties, protocol=protocol)
    limit = min(limit, MAX_PACKET_SIZE)
    empty = _total(header, 0)
    if empty > limit:
        raise MessageTooLarge(empty, limit, "topic and properties alone exceed the limit")
    # For each varint width w the best payload is bounded by the limit (1 + w + remaining) and
    # by the largest remaining length w bytes can encode; the answer is the best valid one.
    best = 0
    for width, largest in enumerate(_VARINT_LIMITS, start=1):
        payload = min(limit - 1 - width, largest) - header
        if payload >= 0 and _total(header, payload) <= limit:
            best = max(best, payload)
    return best


def fits(
    topic: str,
    payload_len: int,
    *,
    qos: int,
    properties: PublishProperties | None,
    limit: int,
    protocol: int = MQTT_V5,
) -> bool:
    """Whether the PUBLISH packet is at most `limit` bytes (False if MQTT cannot encode it).

    Args:
        topic: the topic name as sent.
        payload_len: payload length in bytes.
        qos: 0, 1 or 2.
        properties: MQTT 5 properties, or None.
        limit: the Maximum Packet Size in bytes (whole packet).
        protocol: 5 for MQTT 5, 4 for MQTT 3.1.1.

    Raises:
        ProtocolError: a topic or property value that cannot be encoded.
        ValueError: `qos`, `protocol` or `payload_len` out of range.
    """
    try:
        return (
            publish_packet_size(
                topic, payload_len, qos=qos, properties=properties, protocol=protocol
            )
            <= limit
        )
    except MessageTooLarge:
        return False
