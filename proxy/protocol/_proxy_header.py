"""The PROXY protocol header (HAProxy's `proxy-protocol.txt`, versions 1 and 2) that a TCP
load balancer sends before the client's first byte, to say whose connection it is. Pure.

:class:`ProxyHeaderReader` is fed the connection's first bytes and says how many more it
needs (:attr:`ProxyHeaderReader.wanted`), never more than the header holds: an adapter that
reads exactly that many leaves every byte after the header (the MQTT CONNECT, a TLS
ClientHello, a WebSocket upgrade) unread on the socket. It is bounded (a v1 line is at most
107 bytes; a v2 header at most 16 + 65,535) and every malformed header is
:class:`BadProxyHeader` as soon as its bytes show it.

What is read:

* **v1**: ``PROXY TCP4|TCP6 <src> <dst> <srcport> <dstport>\\r\\n``, strictly (single spaces,
  addresses of the named family, decimal ports without leading zeros);
  ``PROXY UNKNOWN ...\\r\\n`` says nothing about the client (the rest of its line is ignored).
* **v2**: the 12-byte signature, version 2, command LOCAL (the balancer's own connection, a
  health check: nothing about a client) or PROXY; family AF_INET or AF_INET6 with its
  addresses, or AF_UNSPEC / AF_UNIX (nothing usable about a TCP client). The TLVs after the
  addresses are skipped, unread.

Where a header says nothing about a client, :attr:`ProxyHeader.source` is None and the
connection's own address stands (the specification's rule).

Why not the `proxy-protocol` package (PyPI): its parsers are not bounded on their own (a v1
line has no length limit until a newline), they let `struct.error`, `ValueError` and
`UnicodeDecodeError` escape on short or malformed input, and its last release is from 2024.
The format is two small fixed layouts.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ._errors import BadProxyHeader

V1_PREFIX = b"PROXY "
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
#: The longest v1 line, CRLF included (the specification's bound).
V1_MAX = 107
#: The shortest v1 line, "PROXY UNKNOWN\r\n", and the least any header can be.
V1_MIN = 15
V2_FIXED = 16

_LOCAL, _PROXY = 0x0, 0x1
_UNSPEC, _INET, _INET6, _UNIX = 0x0, 0x1, 0x2, 0x3
_ADDRESS_BYTES = {_UNSPEC: 0, _INET: 12, _INET6: 36, _UNIX: 216}
#: The shortest v1 line for each protocol word (addresses "0.0.0.0" / "::", ports "0").
_V1_SHORTEST = {b"TCP4": 32, b"TCP6": 22}


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """What a PROXY header says.

    Attributes:
        version: 1 or 2.
        source: the client's (address, port); None when the header says nothing about a
            client (v1 UNKNOWN; v2 LOCAL, AF_UNSPEC, AF_UNIX): the connection's own address
            stands.
        destination: the address and port the client connected to, None as `source`.
        size: the header's length in bytes.
    """

    version: int
    source: tuple[str, int] | None
    destination: tuple[str, int] | None
    size: int


class ProxyHeaderReader:
    """A PROXY header from the first bytes of a connection (feed, then read `wanted` more)."""

    def __init__(self) -> None:
        self._data = b""

    @property
    def wanted(self) -> int:
        """Bytes to read next: at least 1, and never past the end of the header."""
        data = self._data
        if data[:1] == V2_SIGNATURE[:1]:  # v2 (or no header: feed() has said so)
            if len(data) < V2_FIXED:
                return V2_FIXED - len(data)
            return V2_FIXED + int.from_bytes(data[14:16], "big") - len(data)
        if data.startswith(V1_PREFIX):
            word = data[len(V1_PREFIX) : len(V1_PREFIX) + 4]
            return max(1, _V1_SHORTEST.get(word, V1_MIN) - len(data))
        return max(1, V1_MIN - len(data))

    def feed(self, data: bytes) -> ProxyHeader | None:
        """Take the next bytes read (at most :attr:`wanted`); the header once it is whole.

        Raises:
            BadProxyHeader: not a PROXY header, or a malformed one (as soon as it shows).
            ValueError: more bytes than :attr:`wanted` (the caller would lose the rest).
        """
        if len(data) > self.wanted:
            raise ValueError(f"fed {len(data)} bytes where {self.wanted} were wanted")
        self._data += data
        buffered = self._data
        if buffered.startswith(V2_SIGNATURE):
            return self._v2(buffered)
        if buffered.startswith(V1_PREFIX):
            return self._v1(buffered)
        if not (V2_SIGNATURE.startswith(buffered) or V1_PREFIX.startswith(buffered)):
            raise BadProxyHeader("no PROXY header: the connection's first bytes are not one")
        return None

    def _v1(self, data: bytes) -> ProxyHeader | None:
        end = data.find(b"\n")
        if end < 0:
            if len(data) >= V1_MAX:
                raise BadProxyHeader(f"a PROXY v1 line longer than {V1_MAX} bytes")
            return None
        if end != len(data) - 1:  # `wanted` reads up to the shortest line of its protocol
            raise BadProxyHeader("a PROXY v1 line shorter than its protocol's shortest")
        if not data.endswith(b"\r\n"):
            raise BadProxyHeader("a PROXY v1 line that does not end in CRLF")
        return parse_v1(data)

    def _v2(self, data: bytes) -> ProxyHeader | None:
        if len(data) < V2_FIXED:
            return None
        version, command = data[12] >> 4, data[12] & 0x0F
        family, transport = data[13] >> 4, data[13] & 0x0F
        if version != 2:
            raise BadProxyHeader(f"PROXY v2 signature with version {version}")
        if command not in (_LOCAL, _PROXY):
            raise BadProxyHeader(f"PROXY v2 command 0x{command:x}")
        if family not in _ADDRESS_BYTES or transport > 2:
            raise BadProxyHeader(f"PROXY v2 family/transport 0x{data[13]:02x}")
        length = int.from_bytes(data[14:16], "big")
        if command == _PROXY and length < _ADDRESS_BYTES[family]:
            raise BadProxyHeader(f"PROXY v2 address block of {length} bytes for family {family}")
        if len(data) < V2_FIXED + length:
            return None
        return parse_v2(data)


def parse_v2(data: bytes) -> ProxyHeader:
    """A whole v2 header (checked by :class:`ProxyHeaderReader`)."""
    command, family = data[12] & 0x0F, data[13] >> 4
    size = V2_FIXED + int.from_bytes(data[14:16], "big")
    if command == _LOCAL or family not in (_INET, _INET6):
        return ProxyHeader(2, None, None, size)  # TLVs (and a UNIX pair) skipped unread
    width = 4 if family == _INET else 16
    at = V2_FIXED
    src = ipaddress.ip_address(data[at : at + width])
    dst = ipaddress.ip_address(data[at + width : at + 2 * width])
    ports = data[at + 2 * width : at + 2 * width + 4]
    return ProxyHeader(
        2,
        (str(src), int.from_bytes(ports[:2], "big")),
        (str(dst), int.from_bytes(ports[2:], "big")),
        size,
    )


def parse_v1(line: bytes) -> ProxyHeader:
    """A whole v1 line, CRLF included.

    Raises:
        BadProxyHeader: anything but the specification's form.
    """
    if len(line) > V1_MAX:
        raise BadProxyHeader(f"a PROXY v1 line longer than {V1_MAX} bytes")
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError as exc:
        raise BadProxyHeader("a PROXY v1 line that is not ASCII") from exc
    if not text.startswith("PROXY ") or not text.endswith("\r\n"):
        raise BadProxyHeader("not a PROXY v1 line")
    fields = text[len("PROXY ") : -2].split(" ")
    if fields[0] == "UNKNOWN":
        return ProxyHeader(1, None, None, len(line))
    if len(fields) != 5 or fields[0] not in ("TCP4", "TCP6"):
        raise BadProxyHeader("a PROXY v1 line that is not TCP4, TCP6 or UNKNOWN")
    kind = ipaddress.IPv4Address if fields[0] == "TCP4" else ipaddress.IPv6Address
    if "%" in fields[1] or "%" in fields[2]:  # a scope id is free text: never an address
        raise BadProxyHeader("a PROXY v1 address with a scope id")
    try:
        src, dst = kind(fields[1]), kind(fields[2])
    except ValueError as exc:
        raise BadProxyHeader(f"a PROXY v1 address that is not {fields[0]}") from exc
    return ProxyHeader(1, (str(src), _port(fields[3])), (str(dst), _port(fields[4])), len(line))


def _port(text: str) -> int:
    if not (text.isdigit() and text.isascii() and len(text) <= 5) or (
        text.startswith("0") and text != "0"
    ):
        raise BadProxyHeader(f"a PROXY v1 port that is not 0-65535: {text[:8]!r}")
    port = int(text)
    if port > 65535:
        raise BadProxyHeader(f"a PROXY v1 port over 65535: {port}")
    return port
