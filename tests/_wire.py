"""MQTT packets by hand, for raw-socket devices in tests and benchmarks: a UTF-8 string, a
packet of a first byte and a body, and the next whole packet off a blocking socket."""

from __future__ import annotations

import socket

from client.protocol import encode_varint


def text(value: str) -> bytes:
    """An MQTT UTF-8 string: its length in two bytes, then its bytes."""
    data = value.encode()
    return len(data).to_bytes(2, "big") + data


def packet(first: int, body: bytes) -> bytes:
    """A whole packet: `first` (type and flags), Remaining Length, `body`."""
    return bytes([first]) + encode_varint(len(body)) + body


def read_packet(sock: socket.socket, buf: bytearray, chunk: int = 1 << 16) -> tuple[int, bytes]:
    """The next whole packet from `sock` as (first byte, body), read `chunk` bytes at most at
    a time; `buf` keeps what came after it for the next call.

    Raises:
        ConnectionError: the peer closed first.
    """
    while True:
        if len(buf) >= 2:
            length, shift, i = 0, 0, 1
            while i < len(buf):
                length |= (buf[i] & 0x7F) << shift
                i += 1
                if not buf[i - 1] & 0x80:
                    break
                shift += 7
            else:
                i = 0  # the Remaining Length not whole yet
            if i and len(buf) >= i + length:
                first, body = buf[0], bytes(buf[i : i + length])
                del buf[: i + length]
                return first, body
        data = sock.recv(chunk)
        if not data:
            raise ConnectionError("closed")
        buf += data
