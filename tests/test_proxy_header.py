"""The PROXY protocol header reader (proxy.protocol._proxy_header): byte vectors from
HAProxy's specification, hostile input, and hypothesis round trips that never read a byte
past the header."""

from __future__ import annotations

import ipaddress
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.protocol import BadProxyHeader, ProxyHeader, ProxyHeaderReader

SIG = b"\r\n\r\n\x00\r\nQUIT\n"
MQTT_CONNECT = bytes([0x10, 12, 0, 4, *b"MQTT", 4, 0x02, 0, 60, 0, 0])


def read(data: bytes, split: random.Random | None = None) -> tuple[ProxyHeader, bytes]:
    """Feed `data` as a socket adapter would (at most `wanted` bytes a read, fewer when
    `split` says so); the header and what stayed unread."""
    reader = ProxyHeaderReader()
    at = 0
    while True:
        wanted = reader.wanted
        assert wanted >= 1
        take = wanted if split is None else split.randint(1, wanted)
        chunk = data[at : at + take]
        if not chunk:
            raise EOFError("the header was not whole")
        at += len(chunk)
        header = reader.feed(chunk)
        if header is not None:
            assert header.size == at  # nothing past the header was read
            return header, data[at:]


def v2(command: int, family: int, transport: int, block: bytes) -> bytes:
    return (
        SIG
        + bytes([0x20 | command, family << 4 | transport])
        + len(block).to_bytes(2, "big")
        + block
    )


def inet(src: str, dst: str, sport: int, dport: int) -> bytes:
    s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    return s.packed + d.packed + sport.to_bytes(2, "big") + dport.to_bytes(2, "big")


# The specification's own examples (proxy-protocol.txt, 2.1): the longest lines of each kind.
V1_VECTORS = [
    (b"PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n",
     ("255.255.255.255", 65535), 56),
    (b"PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:"
     b"ffff 65535 65535\r\n", ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 65535), 104),
    (b"PROXY UNKNOWN\r\n", None, 15),
    (b"PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:"
     b"ffff:ffff 65535 65535\r\n", None, 107),
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n", ("192.168.0.1", 56324), 47),
    (b"PROXY TCP6 2001:db8::1 ::1 0 1883\r\n", ("2001:db8::1", 0), 35),
]  # fmt: skip


@pytest.mark.parametrize(("line", "source", "size"), V1_VECTORS)
def test_v1_lines_from_the_specification(
    line: bytes, source: tuple[str, int] | None, size: int
) -> None:
    assert len(line) == size
    header, rest = read(line + MQTT_CONNECT)
    assert (header.version, header.source, header.size) == (1, source, size)
    assert rest == MQTT_CONNECT


def test_v2_addresses_tlvs_local_and_unspec() -> None:
    tlvs = b"\x02\x00\x0bexample.com" + b"\x05\x00\x04abcd" + b"\xea\x00\x03vpc"
    header, rest = read(v2(1, 1, 1, inet("192.0.2.7", "10.0.0.1", 40000, 1883) + tlvs) + b"\x10")
    assert header.source == ("192.0.2.7", 40000) and header.destination == ("10.0.0.1", 1883)
    assert rest == b"\x10" and header.size == 16 + 12 + len(tlvs)
    header, _ = read(v2(1, 2, 1, inet("2001:db8::7", "2001:db8::1", 1, 8883)))
    assert header.source == ("2001:db8::7", 1)
    # LOCAL (a health check of the balancer's own): no client, whatever the block holds.
    header, rest = read(v2(0, 1, 1, inet("192.0.2.7", "10.0.0.1", 1, 2) + tlvs) + b"x")
    assert (header.source, rest) == (None, b"x")
    header, _ = read(v2(0, 0, 0, b""))
    assert header.source is None and header.size == 16
    # AF_UNSPEC and AF_UNIX carry nothing usable about a TCP client: the connection's own.
    assert read(v2(1, 0, 0, b"\x00" * 7))[0].source is None
    assert read(v2(1, 3, 1, b"/tmp/a".ljust(108, b"\x00") * 2))[0].source is None


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (MQTT_CONNECT, "no PROXY header"),  # a trusted balancer that sends none
        (b"GET / HTTP/1.1\r\n", "no PROXY header"),
        (b"\x16\x03\x01\x02\x00", "no PROXY header"),  # a TLS ClientHello
        (b"PROXY TCP4 10.2.3.4 5.6.7.8 1 2\n" + b"x" * 8, "CRLF"),
        (b"PROXY TCP4 1.2.3.4\r\n" + b"x" * 20, "shorter"),
        (b"PROXY TCP4 2001:db8::1 2001:db8::2 1 2\r\n", "not TCP4"),
        (b"PROXY TCP6 1.2.3.4 1.2.3.4 1 2\r\n", "not TCP6"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 1\r\n", "over 65535"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 01 1\r\n", "not 0-65535"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 1\r\n", "not 0-65535"),
        (b"PROXY TCP4 1.2.3.4  5.6.7.8 1 1\r\n", "not TCP4"),
        (b"PROXY TCP4 01.2.3.4 5.6.7.8 1 1\r\n", "not TCP4"),
        (b"PROXY TCP6 fe80::1%eth0,1.2.3.4 ::1 1 1\r\n", "scope id"),
        (b"PROXY TCP6 \xff\xfe::1 ::1 1 1 1 1 1 1 1\r\n", "not ASCII"),
        (b"PROXY UDP4 1.2.3.4 5.6.7.8 1 1\r\n", "not TCP4, TCP6 or UNKNOWN"),
        (b"PROXY UNKNOWN" + b" " * 100, "longer than 107"),
        (b"PROXY TCP4 " + b"1" * 200, "longer than 107"),
        (SIG + b"\x11\x11\x00\x0c" + b"\x00" * 12, "version 1"),
        (SIG + b"\x22\x11\x00\x0c" + b"\x00" * 12, "command 0x2"),
        (SIG + b"\x21\x41\x00\x0c" + b"\x00" * 12, "family/transport 0x41"),
        (SIG + b"\x21\x13\x00\x0c" + b"\x00" * 12, "family/transport 0x13"),
        (SIG + b"\x21\x11\x00\x0b" + b"\x00" * 11, "address block of 11 bytes"),
        (SIG + b"\x21\x21\x00\x0c" + b"\x00" * 12, "address block of 12 bytes"),
        (SIG[:6] + b"X", "no PROXY header"),
    ],
)
def test_malformed_headers_are_refused_as_soon_as_they_show(data: bytes, why: str) -> None:
    with pytest.raises(BadProxyHeader, match=why):
        read(data)


def test_a_non_header_is_refused_at_its_first_byte() -> None:
    """A trusted peer that sends MQTT straight away is refused at once, not after 15 bytes
    (its 2-byte PINGREQ would otherwise wait for a timeout)."""
    for first in (b"\x10", b"\xc0", b"G", b"\x16"):
        with pytest.raises(BadProxyHeader):
            ProxyHeaderReader().feed(first)


def test_the_reader_refuses_bytes_past_what_it_wanted() -> None:
    reader = ProxyHeaderReader()
    with pytest.raises(ValueError, match="wanted"):
        reader.feed(b"PROXY UNKNOWN\r\nX")  # 16 bytes where 15 were wanted


_ipv4 = st.ip_addresses(v=4).map(str)
_ipv6 = st.ip_addresses(v=6).map(str)
_port = st.integers(0, 65535)
_tail = st.binary(max_size=64)


@st.composite
def _headers(draw: st.DrawFn) -> tuple[bytes, tuple[str, int] | None]:
    v6 = draw(st.booleans())
    src, dst = draw(_ipv6 if v6 else _ipv4), draw(_ipv6 if v6 else _ipv4)
    sport, dport = draw(_port), draw(_port)
    if draw(st.booleans()):
        word = "TCP6" if v6 else "TCP4"
        line = f"PROXY {word} {src} {dst} {sport} {dport}\r\n".encode()
        return line, (str(ipaddress.ip_address(src)), sport)
    tlvs = draw(st.binary(max_size=300))  # skipped unread, whatever they hold
    block = inet(src, dst, sport, dport) + tlvs
    return v2(1, 2 if v6 else 1, 1, block), (str(ipaddress.ip_address(src)), sport)


@given(_headers(), _tail, st.randoms(use_true_random=False))
@settings(max_examples=300, deadline=None)
def test_any_header_is_read_whole_and_nothing_after_it(
    made: tuple[bytes, tuple[str, int] | None], tail: bytes, split: random.Random
) -> None:
    data, source = made
    header, rest = read(data + tail, split)
    assert header.source == source and header.size == len(data)
    assert rest == tail


@given(st.binary(max_size=400), st.randoms(use_true_random=False))
@settings(max_examples=500, deadline=None)
def test_hostile_bytes_end_in_a_header_or_bad_proxy_header_within_the_bounds(
    data: bytes, split: random.Random
) -> None:
    for prefix in (b"", b"PROXY ", b"PROXY TCP4 ", b"PROXY TCP6 ", SIG, SIG + b"\x21\x11"):
        try:
            header, _ = read(prefix + data, split)
        except (BadProxyHeader, EOFError):
            continue
        assert header.size <= (107 if header.version == 1 else 16 + 65535)
