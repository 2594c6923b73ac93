"""An MQTT 3.1.1 (or 3.1) client on an MQTT 5 broker link. Pure.

An MQTT 3.1.1 connection carries no properties, so a broker strips them on the way to such a
client, the `__chunk` tag of an ADR-23 chunk with them: the proxy could not tell a chunk
from any other message. So the proxy speaks MQTT 5 to the broker for a 3.1.1 client and
translates at the one place the two versions differ on the wire:

==============  =====================================  ======================================
packet          client (3.1.1) to broker (5)            broker (5) to client (3.1.1)
==============  =====================================  ======================================
CONNECT         level 5; a persistent session gets      -
                Session Expiry 0xFFFFFFFF (3.1.1's
                "never"); empty Will properties
CONNACK         -                                       return code from the reason code
                                                        (:data:`CONNACK_CODES`), no properties
PUBLISH         an empty property section after the    the property section removed
                packet id
PUBACK..COMP    unchanged (the 2-byte form is valid     packet id only (a reason code has no
                MQTT 5: success)                        3.1.1 form; as a 3.1.1 client straight
                                                        on the broker, it is not told)
SUBSCRIBE,      an empty property section after the    -
UNSUBSCRIBE     packet id
SUBACK          -                                       packet id and return codes (a failure
                                                        reason is 0x80)
UNSUBACK        -                                       packet id only
DISCONNECT      unchanged (0 bytes: reason 0, normal)   none: the connection is closed
==============  =====================================  ======================================

Packet ids are not touched, so QoS 1 and 2 flows stay end to end. The proxy never declares a
Topic Alias Maximum to the broker, so the broker sends no aliases.
"""

from __future__ import annotations

from ._errors import MalformedPacket, PacketTooLarge
from ._framer import Head
from ._packets import (
    Connack,
    Connect,
    PublishHeader,
    fixed_header,
    parse_connect,
    publish_header_bytes,
)
from ._properties import Prop, encode_properties, u32_property
from ._wire import MAX_VARINT, read_varint, text

SESSION_EXPIRY = 0x11
NEVER_EXPIRES = 0xFFFFFFFF
CONNECT_CLEAN = 0x02

#: MQTT 5 CONNACK reason codes and the 3.1.1 return codes that say the same.
CONNACK_CODES = {
    0x00: 0,  # accepted
    0x84: 1,  # unsupported protocol version
    0x85: 2,  # client identifier not valid
    0x88: 3,  # server unavailable
    0x89: 3,  # server busy
    0x86: 4,  # bad user name or password
    0x8C: 4,  # bad authentication method
    0x87: 5,  # not authorized
    0x8A: 5,  # banned
}
#: Any other refusal (0x80 unspecified, 0x95 packet too large, 0x97 quota ...).
CONNACK_OTHER = 3

_PUBACK, _PUBREC, _PUBREL, _PUBCOMP = 4, 5, 6, 7
_SUBACK, _UNSUBACK = 9, 11


def _connect_flags(connect: Connect) -> int:
    name_length = int.from_bytes(connect.body[:2], "big")  # "MQTT", or 3.1's "MQIsdp"
    return connect.body[2 + name_length + 1]


def upgrade_connect(connect: Connect) -> Connect:
    """The MQTT 5 CONNECT the broker gets for a 3.1.1 or 3.1 client's CONNECT."""
    assert not connect.v5
    flags = _connect_flags(connect)
    props: tuple[Prop, ...] = ()
    if not flags & CONNECT_CLEAN:  # 3.1.1 keeps such a session until a clean CONNECT
        props = (u32_property(SESSION_EXPIRY, NEVER_EXPIRES),)
    body = text("MQTT") + bytes([5, flags]) + connect.keepalive.to_bytes(2, "big")
    body += encode_properties(props) + text(connect.client_id)
    if connect.will is not None:
        will = connect.will
        body += b"\x00" + text(will.topic) + len(will.payload).to_bytes(2, "big") + will.payload
    if connect.username is not None:
        body += text(connect.username)
    if connect.password is not None:
        body += len(connect.password).to_bytes(2, "big") + connect.password
    return parse_connect(body)


def downgrade_connack(connack: Connack) -> bytes:
    """The 3.1.1 CONNACK for an MQTT 5 one."""
    code = CONNACK_CODES.get(connack.reason, CONNACK_OTHER)
    present = 1 if connack.session_present and code == 0 else 0
    return bytes([0x20, 2, present, code])


def upgrade_publish(
    head: Head, header: PublishHeader, prefix: bytes
) -> tuple[Head, PublishHeader, bytes]:
    """A 3.1.1 PUBLISH as the MQTT 5 one that goes to the broker: its fixed header, its
    variable header (read as 3.1.1) and the start of its body, each with an empty property
    section after the packet id; the rest of the body follows unchanged.

    Raises:
        PacketTooLarge: one byte more would be over MQTT's largest Remaining Length.
    """
    if head.length >= MAX_VARINT:
        raise PacketTooLarge("a 3.1.1 PUBLISH whose MQTT 5 form is over MQTT's largest packet")
    raw = fixed_header(head.first, head.length + 1)
    upgraded = prefix[: header.size] + b"\x00" + prefix[header.size :]
    return (
        Head(head.first, head.length + 1, raw),
        PublishHeader(header.topic, header.packet_id, (), header.size + 1),
        upgraded,
    )


def downgraded_publish_head(first_byte: int, header: PublishHeader, payload_size: int) -> bytes:
    """Fixed and variable header of the 3.1.1 PUBLISH for an MQTT 5 one (`header` read as
    MQTT 5): the same topic, flags and packet id, the properties left out.

    Raises:
        MalformedPacket: the topic stands behind a Topic Alias (never set up on this link).
    """
    if not header.topic:
        raise MalformedPacket("a PUBLISH with a Topic Alias on a link that allows none")
    variable = publish_header_bytes(header, (), v5=False)
    return fixed_header(first_byte, len(variable) + payload_size) + variable


def upgrade_packet(first_byte: int, body: bytes) -> bytes:
    """SUBSCRIBE or UNSUBSCRIBE: an empty property section after the packet id.

    Raises:
        MalformedPacket: no packet id.
    """
    if len(body) < 2:
        raise MalformedPacket("SUBSCRIBE or UNSUBSCRIBE without a packet id")
    upgraded = body[:2] + b"\x00" + body[2:]
    return fixed_header(first_byte, len(upgraded)) + upgraded


def keeps_session_without_id(connect: Connect) -> bool:
    """A 3.1.1 CONNECT asking for a persistent session under an empty client id, which
    3.1.1 refuses (return code 2) and MQTT 5 would accept under an id the broker makes up."""
    return not connect.client_id and not _connect_flags(connect) & CONNECT_CLEAN


def _skip_properties(body: bytes, at: int) -> int:
    length, at = read_varint(body, at)
    if at + length > len(body):
        raise MalformedPacket("properties run past the packet")
    return at + length


def downgrade_packet(first_byte: int, body: bytes) -> bytes | None:
    """The 3.1.1 form of an MQTT 5 packet from the broker other than CONNACK and PUBLISH;
    None when it has none (DISCONNECT, AUTH: the client's connection is closed instead).

    Raises:
        MalformedPacket: an acknowledgement without a packet id, properties that run over.
    """
    kind = first_byte >> 4
    if kind in (_PUBACK, _PUBREC, _PUBREL, _PUBCOMP, _UNSUBACK):
        if len(body) < 2:
            raise MalformedPacket(f"packet type {kind} without a packet id")
        return bytes([first_byte, 2]) + body[:2]
    if kind == _SUBACK:
        if len(body) < 3:
            raise MalformedPacket("SUBACK without a packet id or properties")
        codes = bytes(c if c < 0x80 else 0x80 for c in body[_skip_properties(body, 2) :])
        rest = body[:2] + codes
        return fixed_header(first_byte, len(rest)) + rest
    if kind in (14, 15):  # DISCONNECT, AUTH
        return None
    return fixed_header(first_byte, len(body)) + body  # PINGRESP and the like: as they are
