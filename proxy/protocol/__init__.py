"""The proxy's wire core: MQTT framing and the few packets it reads or writes. No I/O.

Bytes in, events and bytes out, as :mod:`client.protocol` (and h11): the asyncio adapter in
:mod:`proxy` owns the sockets. What it offers:

* :class:`Framer`: packet boundaries of a byte stream, bodies as pieces (never joined);
* :func:`parse_connect`, :func:`parse_connack`, :func:`publish_header`: the packets read;
* :func:`placeholder_packet`, :func:`resolved_head`, :func:`ack`, :func:`disconnect`: the
  packets written; :class:`AliasMap` the client's topic aliases;
* its errors, :class:`ProxyProtocolError` and subclasses, each with an MQTT 5 reason code;
* :class:`ProxyHeaderReader`: the PROXY protocol header (v1, v2) a load balancer sends first,
  read without reading past it (:class:`BadProxyHeader` when it is not one).
"""

from client.protocol import PLACEHOLDER_AWARE

from ._chunks import ChunkPublish, chunk_ack, pubcomp, read_chunk, whole_head, whole_size
from ._errors import (
    MALFORMED_PACKET,
    PACKET_TOO_LARGE,
    PROTOCOL_ERROR,
    BadProxyHeader,
    MalformedPacket,
    PacketTooLarge,
    ProxyProtocolError,
)
from ._framer import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    Body,
    Framer,
    Head,
)
from ._offload import (
    AliasMap,
    Stored,
    UnknownTopicAlias,
    placeholder_packet,
    placeholder_will,
    read_placeholder,
    resolved_head,
    resolved_size,
    stored_headers,
)
from ._packets import (
    PINGREQ_PACKET,
    Connack,
    Connect,
    PublishHeader,
    Will,
    ack,
    connack_packet,
    connack_refusal,
    connect_packet,
    connect_with_will,
    disconnect,
    parse_connack,
    parse_connect,
    publish_header,
    subscribe_packet,
)
from ._properties import (
    MAXIMUM_PACKET_SIZE,
    MESSAGE_EXPIRY,
    TOPIC_ALIAS_MAXIMUM,
    Prop,
    first,
    u32_property,
)
from ._proxy_header import ProxyHeader, ProxyHeaderReader
from ._v311 import (
    downgrade_connack,
    downgrade_packet,
    downgraded_publish_head,
    keeps_session_without_id,
    upgrade_connect,
    upgrade_packet,
    upgrade_publish,
)
from ._wire import MAX_VARINT, encode_varint

__all__ = [
    "AUTH",
    "CONNACK",
    "CONNECT",
    "DISCONNECT",
    "MALFORMED_PACKET",
    "MAXIMUM_PACKET_SIZE",
    "MAX_VARINT",
    "MESSAGE_EXPIRY",
    "PACKET_TOO_LARGE",
    "PINGREQ",
    "PINGREQ_PACKET",
    "PINGRESP",
    "PLACEHOLDER_AWARE",
    "PROTOCOL_ERROR",
    "PUBACK",
    "PUBCOMP",
    "PUBLISH",
    "PUBREC",
    "PUBREL",
    "SUBACK",
    "SUBSCRIBE",
    "TOPIC_ALIAS_MAXIMUM",
    "UNSUBACK",
    "UNSUBSCRIBE",
    "AliasMap",
    "BadProxyHeader",
    "Body",
    "ChunkPublish",
    "Connack",
    "Connect",
    "Framer",
    "Head",
    "MalformedPacket",
    "PacketTooLarge",
    "Prop",
    "ProxyHeader",
    "ProxyHeaderReader",
    "ProxyProtocolError",
    "PublishHeader",
    "Stored",
    "UnknownTopicAlias",
    "Will",
    "ack",
    "chunk_ack",
    "connack_packet",
    "connack_refusal",
    "connect_packet",
    "connect_with_will",
    "disconnect",
    "downgrade_connack",
    "downgrade_packet",
    "downgraded_publish_head",
    "encode_varint",
    "first",
    "keeps_session_without_id",
    "parse_connack",
    "parse_connect",
    "placeholder_packet",
    "placeholder_will",
    "pubcomp",
    "publish_header",
    "read_chunk",
    "read_placeholder",
    "resolved_head",
    "resolved_size",
    "stored_headers",
    "subscribe_packet",
    "u32_property",
    "upgrade_connect",
    "upgrade_packet",
    "upgrade_publish",
    "whole_head",
    "whole_size",
]
