"""The few packets the proxy reads (CONNECT, CONNACK, a PUBLISH's variable header) and the
few it writes (a PUBLISH head, acknowledgements with a reason, DISCONNECT). Pure.

Everything else passes through as the bytes it came as (STYLE 20).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from client.protocol import PLACEHOLDER_AWARE

from ._errors import MalformedPacket
from ._properties import (
    AUTHENTICATION_METHOD,
    MAXIMUM_PACKET_SIZE,
    Prop,
    encode_properties,
    first,
    parse_properties,
)
from ._wire import decode_varint, encode_varint, read_binary, read_text, read_u16, text

_PROTOCOLS = {(b"MQTT", 4), (b"MQTT", 5), (b"MQIsdp", 3)}


@dataclass(frozen=True, slots=True)
class Will:
    qos: int
    retain: bool
    properties: tuple[Prop, ...]
    topic: str
    payload: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class Connect:
    """What the proxy reads from a CONNECT; `body` is kept to forward or rebuild it."""

    level: int  # 3 (3.1), 4 (3.1.1) or 5
    keepalive: int
    properties: tuple[Prop, ...]
    client_id: str
    will: Will | None
    username: str | None
    password: bytes | None = field(repr=False)
    body: bytes = field(repr=False)
    will_span: tuple[int, int]  # where the will's fields lie in `body` ((0, 0): none)

    @property
    def v5(self) -> bool:
        return self.level == 5

    @property
    def packet(self) -> bytes:
        """The whole CONNECT packet."""
        return b"\x10" + encode_varint(len(self.body)) + self.body

    @property
    def max_packet_size(self) -> int | None:
        """The client's Maximum Packet Size (MQTT 5), None when it declared none."""
        value = first(self.properties, MAXIMUM_PACKET_SIZE)
        return value if isinstance(value, int) else None

    @property
    def authenticates(self) -> bool:
        """Whether it asks for MQTT 5 enhanced authentication (AUTH packets before CONNACK)."""
        return first(self.properties, AUTHENTICATION_METHOD) is not None

    @property
    def handles_placeholders(self) -> bool:
        """Whether the client announced it resolves placeholders itself."""
        return any(p.value == PLACEHOLDER_AWARE for p in self.properties)


def parse_connect(body: bytes) -> Connect:
    """A CONNECT's body (after the fixed header).

    Raises:
        MalformedPacket: any field that cannot be read, an unknown protocol, reserved flags.
    """
    name, at = read_binary(body, 0)
    if at + 4 > len(body):
        raise MalformedPacket("CONNECT ends in its variable header")
    level, flags = body[at], body[at + 1]
    if (name, level) not in _PROTOCOLS:
        raise MalformedPacket(f"unsupported protocol {name!r} level {level}")
    if flags & 0x01:
        raise MalformedPacket("CONNECT's reserved flag is set")
    keepalive, at = read_u16(body, at + 2)
    props: tuple[Prop, ...] = ()
    if level == 5:
        props, at = parse_properties(body, at)
    client_id, at = read_text(body, at)
    will = None
    will_start = will_end = 0
    if flags & 0x04:
        will_start = at
        will_props: tuple[Prop, ...] = ()
        if level == 5:
            will_props, at = parse_properties(body, at)
        will_topic, at = read_text(body, at)
        payload, at = read_binary(body, at)
        will_end = at
        qos = (flags >> 3) & 0x03
        if qos == 3:
            raise MalformedPacket("Will QoS 3")
        will = Will(qos, bool(flags & 0x20), will_props, will_topic, payload)
    elif flags & 0x38:
        raise MalformedPacket("Will QoS or retain without a Will")
    username = password = None
    if flags & 0x80:
        username, at = read_text(body, at)
    if flags & 0x40:
        password, at = read_binary(body, at)
    if at != len(body):
        raise MalformedPacket("bytes after CONNECT's payload")
    return Connect(
        level, keepalive, props, client_id, will, username, password, body, (will_start, will_end)
    )


def slim(connect: Connect) -> Connect:
    """What a session keeps of its CONNECT for the connection's life: no body, Will or
    password, and only the properties read later (Maximum Packet Size, Authentication
    Method, the placeholder-aware tag); a CONNECT may be `max_connect_bytes` of them."""
    kept = tuple(
        p
        for p in connect.properties
        if p.id in (MAXIMUM_PACKET_SIZE, AUTHENTICATION_METHOD) or p.value == PLACEHOLDER_AWARE
    )
    return replace(connect, properties=kept, body=b"", will=None, password=None)


def connect_with_will(connect: Connect, properties: tuple[Prop, ...], payload: bytes) -> bytes:
    """The whole CONNECT packet with the Will's properties and payload replaced."""
    start, end = connect.will_span
    assert connect.will is not None
    middle = encode_properties(properties) if connect.v5 else b""
    topic = connect.will.topic.encode()
    middle += len(topic).to_bytes(2, "big") + topic + len(payload).to_bytes(2, "big") + payload
    body = connect.body[:start] + middle + connect.body[end:]
    return b"\x10" + encode_varint(len(body)) + body


@dataclass(frozen=True, slots=True)
class Connack:
    session_present: bool
    reason: int
    properties: tuple[Prop, ...]

    @property
    def max_packet_size(self) -> int | None:
        value = first(self.properties, MAXIMUM_PACKET_SIZE)
        return value if isinstance(value, int) else None


def parse_connack(body: bytes, *, v5: bool) -> Connack:
    if len(body) < 2:
        raise MalformedPacket("CONNACK shorter than 2 bytes")
    props: tuple[Prop, ...] = ()
    if v5 and len(body) > 2:
        props, end = parse_properties(body, 2)
        if end != len(body):
            raise MalformedPacket("bytes after CONNACK's properties")
    return Connack(bool(body[0] & 0x01), body[1], props)


def connack_packet(connack: Connack, properties: tuple[Prop, ...]) -> bytes:
    """An MQTT 5 CONNACK with other properties."""
    body = bytes([int(connack.session_present), connack.reason]) + encode_properties(properties)
    return b"\x20" + encode_varint(len(body)) + body


@dataclass(frozen=True, slots=True)
class PublishHeader:
    """A PUBLISH's variable header: topic bytes (empty when a Topic Alias stands for it),
    packet id (QoS 1 and 2) and properties; `size` is its length in bytes."""

    topic: bytes
    packet_id: int | None
    properties: tuple[Prop, ...]
    size: int

    @property
    def topic_text(self) -> str:
        return self.topic.decode("utf-8")


def publish_header(prefix: bytes, *, qos: int, v5: bool) -> PublishHeader | None:
    """The variable header at the start of a PUBLISH body, None until `prefix` holds it.

    Raises:
        MalformedPacket: QoS 3, a topic that is not UTF-8 or holds a wildcard, packet id 0,
            malformed properties.
    """
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    if len(prefix) < 2:
        return None
    end = 2 + ((prefix[0] << 8) | prefix[1])
    if len(prefix) < end:
        return None
    topic = prefix[2:end]
    try:
        decoded = topic.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedPacket("PUBLISH topic is not UTF-8") from exc
    if "+" in decoded or "#" in decoded or "\x00" in decoded:
        raise MalformedPacket("PUBLISH topic holds a wildcard or U+0000")
    packet_id = None
    if qos:
        if len(prefix) < end + 2:
            return None
        packet_id = (prefix[end] << 8) | prefix[end + 1]
        if packet_id == 0:
            raise MalformedPacket("PUBLISH packet id 0")
        end += 2
    props: tuple[Prop, ...] = ()
    if v5:
        got = decode_varint(prefix, end)
        if got is None or len(prefix) < got[1] + got[0]:
            return None
        props, end = parse_properties(prefix, end)
    return PublishHeader(topic, packet_id, props, end)


def publish_header_bytes(header: PublishHeader, properties: tuple[Prop, ...], *, v5: bool) -> bytes:
    """The variable header again, with `properties` in place of the original ones."""
    out = len(header.topic).to_bytes(2, "big") + header.topic
    if header.packet_id is not None:
        out += header.packet_id.to_bytes(2, "big")
    if v5:
        out += encode_properties(properties)
    return out


def fixed_header(first_byte: int, remaining: int) -> bytes:
    return bytes([first_byte]) + encode_varint(remaining)


def ack(kind: int, packet_id: int, reason: int, *, v5: bool) -> bytes:
    """PUBACK/PUBREC/PUBREL/PUBCOMP for `packet_id`; the reason only in MQTT 5."""
    first_byte = kind << 4 | (0x02 if kind == 6 else 0)
    pid = packet_id.to_bytes(2, "big")
    return bytes([first_byte, 3]) + pid + bytes([reason]) if v5 else bytes([first_byte, 2]) + pid


def disconnect(reason: int) -> bytes:
    """An MQTT 5 DISCONNECT with `reason` (3.1.1 has no server DISCONNECT: close instead)."""
    return bytes([0xE0, 1, reason])


def connack_refusal(*, v5: bool, reason: int) -> bytes:
    """A CONNACK that refuses; `reason` is MQTT 5's (3.1.1 gets 3, server unavailable)."""
    return bytes([0x20, 3, 0, reason, 0]) if v5 else bytes([0x20, 2, 0, 3])


PINGREQ_PACKET = b"\xc0\x00"


def connect_packet(
    client_id: str, *, keepalive: int, username: str | None = None, password: str | None = None
) -> bytes:
    """An MQTT 3.1.1 CONNECT with a clean session (the proxy's own discovery link)."""
    flags = 0x02 | (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    body = text("MQTT") + bytes([4, flags]) + keepalive.to_bytes(2, "big") + text(client_id)
    if username is not None:
        body += text(username)
    if password is not None:
        body += text(password)
    return b"\x10" + encode_varint(len(body)) + body


def subscribe_packet(packet_id: int, topic_filter: str, qos: int) -> bytes:
    """An MQTT 3.1.1 SUBSCRIBE to one filter."""
    body = packet_id.to_bytes(2, "big") + text(topic_filter) + bytes([qos])
    return b"\x82" + encode_varint(len(body)) + body
