"""MQTT's primitive encodings: Variable Byte Integers, two-byte lengths, strings. Pure.

Every decoder takes the bytes and an offset and returns (value, next offset), raising
:class:`MalformedPacket` when the bytes end early or break the rule: hostile input stops
here (STYLE 19).
"""

from __future__ import annotations

from client.protocol import encode_varint as encode_varint  # re-exported: one encoder

from ._errors import MalformedPacket

MAX_VARINT = 268_435_455  # four bytes of seven bits (MQTT 5 §1.5.5)


def decode_varint(data: bytes | bytearray | memoryview, at: int) -> tuple[int, int] | None:
    """(value, next offset), or None when `data` ends before the integer does.

    Raises:
        MalformedPacket: a fifth byte would be needed.
    """
    value = 0
    for i in range(4):
        if at + i >= len(data):
            return None
        byte = data[at + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, at + i + 1
    raise MalformedPacket("a Variable Byte Integer longer than 4 bytes")


def read_varint(data: bytes, at: int) -> tuple[int, int]:
    """As :func:`decode_varint`, for bytes that must hold the whole integer."""
    got = decode_varint(data, at)
    if got is None:
        raise MalformedPacket("packet ends inside a Variable Byte Integer")
    return got


def read_u16(data: bytes, at: int) -> tuple[int, int]:
    if at + 2 > len(data):
        raise MalformedPacket("packet ends inside a two-byte integer")
    return (data[at] << 8) | data[at + 1], at + 2


def read_u32(data: bytes, at: int) -> tuple[int, int]:
    if at + 4 > len(data):
        raise MalformedPacket("packet ends inside a four-byte integer")
    return int.from_bytes(data[at : at + 4], "big"), at + 4


def read_binary(data: bytes, at: int) -> tuple[bytes, int]:
    """Two-byte length, then that many bytes."""
    length, at = read_u16(data, at)
    if at + length > len(data):
        raise MalformedPacket("packet ends inside a string or binary field")
    return data[at : at + length], at + length


def read_text(data: bytes, at: int) -> tuple[str, int]:
    """An MQTT UTF-8 string (no U+0000)."""
    raw, at = read_binary(data, at)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedPacket("a string that is not UTF-8") from exc
    if "\x00" in text:
        raise MalformedPacket("a string holding U+0000")
    return text, at


def binary(value: bytes) -> bytes:
    """Two-byte length, then `value`."""
    if len(value) > 0xFFFF:
        raise ValueError("longer than 65535 bytes")
    return len(value).to_bytes(2, "big") + value


def text(value: str) -> bytes:
    return binary(value.encode("utf-8"))
