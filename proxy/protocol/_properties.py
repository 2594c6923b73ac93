"""MQTT 5 properties as a list of entries that keep their bytes. Pure.

The proxy reads a few properties (Maximum Packet Size, Topic Alias, user properties) and
changes fewer; every entry keeps the bytes it came as, so a packet rebuilt from its entries
carries the others exactly as the peer wrote them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ._errors import MalformedPacket
from ._wire import encode_varint, read_binary, read_text, read_u16, read_u32, read_varint, text

PAYLOAD_FORMAT = 0x01
MESSAGE_EXPIRY = 0x02
CONTENT_TYPE = 0x03
SUBSCRIPTION_ID = 0x0B
TOPIC_ALIAS = 0x23
TOPIC_ALIAS_MAXIMUM = 0x22
RECEIVE_MAXIMUM = 0x21
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
REASON_STRING = 0x1F
AUTHENTICATION_METHOD = 0x15

_BYTE, _U16, _U32, _VARINT, _TEXT, _BINARY, _PAIR = range(7)
_KINDS = {
    0x01: _BYTE, 0x02: _U32, 0x03: _TEXT, 0x08: _TEXT, 0x09: _BINARY, 0x0B: _VARINT,
    0x11: _U32, 0x12: _TEXT, 0x13: _U16, 0x15: _TEXT, 0x16: _BINARY, 0x17: _BYTE,
    0x18: _U32, 0x19: _BYTE, 0x1A: _TEXT, 0x1C: _TEXT, 0x1F: _TEXT, 0x21: _U16,
    0x22: _U16, 0x23: _U16, 0x24: _BYTE, 0x25: _BYTE, 0x26: _PAIR, 0x27: _U32,
    0x28: _BYTE, 0x29: _BYTE, 0x2A: _BYTE,
}  # fmt: skip

Value = int | str | bytes | tuple[str, str]


@dataclass(frozen=True, slots=True)
class Prop:
    """One property: its identifier, its decoded value and its bytes as they came."""

    id: int
    value: Value
    raw: bytes


def _value(data: bytes, kind: int, at: int) -> tuple[Value, int]:
    if kind == _BYTE:
        if at >= len(data):
            raise MalformedPacket("properties end inside a byte property")
        return data[at], at + 1
    if kind == _U16:
        return read_u16(data, at)
    if kind == _U32:
        return read_u32(data, at)
    if kind == _VARINT:
        return read_varint(data, at)
    if kind == _TEXT:
        return read_text(data, at)
    if kind == _BINARY:
        return read_binary(data, at)
    name, at = read_text(data, at)
    value, at = read_text(data, at)
    return (name, value), at


def parse_properties(data: bytes, at: int) -> tuple[tuple[Prop, ...], int]:
    """The property block starting at `at`: (entries, offset after the block).

    Raises:
        MalformedPacket: an unknown identifier, or a block that ends early or runs over.
    """
    length, at = read_varint(data, at)
    end = at + length
    if end > len(data):
        raise MalformedPacket("properties run past the packet")
    block = data[:end]
    props: list[Prop] = []
    while at < end:
        start = at
        ident, at = read_varint(block, at)
        kind = _KINDS.get(ident)
        if kind is None:
            raise MalformedPacket(f"unknown property identifier 0x{ident:02x}")
        value, at = _value(block, kind, at)
        props.append(Prop(ident, value, block[start:at]))
    return tuple(props), end


def encode_properties(props: Iterable[Prop]) -> bytes:
    body = b"".join(p.raw for p in props)
    return encode_varint(len(body)) + body


def user_property(name: str, value: str) -> Prop:
    return Prop(USER_PROPERTY, (name, value), bytes([USER_PROPERTY]) + text(name) + text(value))


def u32_property(ident: int, value: int) -> Prop:
    return Prop(ident, value, bytes([ident]) + value.to_bytes(4, "big"))


def first(props: Iterable[Prop], ident: int) -> Value | None:
    for p in props:
        if p.id == ident:
            return p.value
    return None


def user_properties(props: Iterable[Prop]) -> tuple[tuple[str, str], ...]:
    return tuple(p.value for p in props if p.id == USER_PROPERTY and isinstance(p.value, tuple))


def without_user_properties(props: Iterable[Prop], *names: str) -> tuple[Prop, ...]:
    return tuple(
        p
        for p in props
        if not (p.id == USER_PROPERTY and isinstance(p.value, tuple) and p.value[0] in names)
    )
