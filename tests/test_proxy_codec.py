"""proxy.protocol, the proxy's sans-I/O wire core: byte vectors, round trips, hostile bytes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.protocol import MessageId
from proxy.protocol import (
    AliasMap,
    Body,
    Framer,
    Head,
    MalformedPacket,
    PacketTooLarge,
    Stored,
    UnknownTopicAlias,
    connect_with_will,
    encode_varint,
    parse_connack,
    parse_connect,
    placeholder_packet,
    placeholder_will,
    publish_header,
    read_placeholder,
    resolved_head,
    resolved_size,
)
from proxy.protocol._properties import encode_properties, u32_property, user_property
from proxy.protocol._wire import decode_varint, text


def _events(framer: Framer) -> list[Head | Body]:
    out: list[Head | Body] = []
    while (event := framer.next_event()) is not None:
        out.append(event)
    return out


@pytest.mark.parametrize(
    ("value", "wire"),
    [(0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16_383, b"\xff\x7f"),
     (16_384, b"\x80\x80\x01"), (2_097_151, b"\xff\xff\x7f"), (268_435_455, b"\xff\xff\xff\x7f")],
)  # fmt: skip
def test_varint_vectors_from_the_spec(value: int, wire: bytes) -> None:
    assert encode_varint(value) == wire
    assert decode_varint(wire, 0) == (value, len(wire))


def test_a_five_byte_varint_is_malformed_as_soon_as_its_fifth_byte_is_due() -> None:
    framer = Framer()
    framer.feed(b"\x30\xff\xff\xff\xff")
    with pytest.raises(MalformedPacket):
        framer.next_event()


def test_a_length_over_the_limit_is_refused_before_any_body() -> None:
    framer = Framer(max_length=1000)
    framer.feed(b"\x30\xff\xff\xff\x7f")  # 256 MiB announced, nothing sent
    with pytest.raises(PacketTooLarge):
        framer.next_event()


def test_reserved_type_zero_is_malformed() -> None:
    framer = Framer()
    framer.feed(b"\x00\x00")
    with pytest.raises(MalformedPacket):
        framer.next_event()


@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(1, 50), min_size=1))
def test_framer_returns_every_packet_whatever_the_splits(
    bodies: list[bytes], cuts: list[int]
) -> None:
    packets = [bytes([0x30]) + encode_varint(len(b)) + b for b in bodies]
    stream = b"".join(packets)
    framer = Framer()
    got: list[Head | Body] = []
    at = 0
    i = 0
    while at < len(stream):
        step = cuts[i % len(cuts)]
        framer.feed(stream[at : at + step])
        at += step
        i += 1
        got += _events(framer)
    rebuilt = b""
    out: list[bytes] = []
    for event in got:
        if isinstance(event, Head):
            rebuilt = event.raw
            if event.length == 0:
                out.append(rebuilt)
        else:
            rebuilt += event.data
            if event.last:
                out.append(rebuilt)
    assert out == packets
    assert not framer.in_packet


def test_a_body_is_handed_on_in_the_pieces_fed_never_joined() -> None:
    framer = Framer()
    framer.feed(b"\x30" + encode_varint(3 * 65536))
    assert isinstance(framer.next_event(), Head)
    for i in range(3):
        framer.feed(bytes(65536))
        event = framer.next_event()
        assert isinstance(event, Body) and len(event.data) == 65536 and event.last == (i == 2)
        assert framer.buffered == 0


def _connect_v5(*, will_payload: bytes | None = None, user: str | None = "alice") -> bytes:
    flags = 0x02
    props = encode_properties([u32_property(0x27, 4096), user_property("_offload", "placeholders")])
    payload = text("cid")
    if will_payload is not None:
        flags |= 0x04 | 0x08  # will, QoS 1
        payload += encode_properties([user_property("k", "v")]) + text("will/t")
        payload += len(will_payload).to_bytes(2, "big") + will_payload
    if user is not None:
        flags |= 0xC0
        payload += text(user) + text("secret")
    return text("MQTT") + bytes([5, flags]) + (60).to_bytes(2, "big") + props + payload


def test_connect_v5_fields_and_password_never_in_repr() -> None:
    connect = parse_connect(_connect_v5(will_payload=b"bye"))
    assert (connect.level, connect.keepalive, connect.client_id) == (5, 60, "cid")
    assert connect.max_packet_size == 4096 and connect.handles_placeholders
    assert connect.will is not None and connect.will.topic == "will/t" and connect.will.qos == 1
    assert (connect.username, connect.password) == ("alice", b"secret")
    assert "secret" not in repr(connect)


def test_connect_311_and_malformed_ones() -> None:
    body = text("MQTT") + bytes([4, 0x02]) + (0).to_bytes(2, "big") + text("c")
    connect = parse_connect(body)
    assert (connect.level, connect.will, connect.username, connect.max_packet_size) == (
        4, None, None, None,
    )  # fmt: skip
    assert not connect.handles_placeholders
    for bad in (
        body[:-1],  # cut in the client id
        text("MQTT") + bytes([6, 0x02]) + b"\x00\x00" + text("c"),  # unknown level
        text("MQTT") + bytes([4, 0x03]) + b"\x00\x00" + text("c"),  # reserved flag
        text("MQTT") + bytes([4, 0x0A]) + b"\x00\x00" + text("c"),  # will QoS, no will
        body + b"x",  # trailing bytes
        text("MQTT") + bytes([5, 0x02]) + b"\x00\x00" + b"\x02\x99\x00" + text("c"),  # prop 0x99
    ):
        with pytest.raises(MalformedPacket):
            parse_connect(bad)


def test_a_will_replaced_keeps_everything_else() -> None:
    connect = parse_connect(_connect_v5(will_payload=b"x" * 5000))
    stored = Stored("http://gw/msg/x", 5000, "0" * 64, MessageId.new())
    props, body = placeholder_will(connect.will, stored, v5=True)  # type: ignore[arg-type]
    packet = connect_with_will(connect, props, body)
    again = parse_connect(packet[1 + len(encode_varint(len(packet) - 3)) :][: len(packet)])
    assert again.will is not None and json.loads(again.will.payload)["size"] == 5000
    assert again.will.properties[0].value == ("_format", "external")
    assert (again.username, again.password, again.client_id) == ("alice", b"secret", "cid")


def _publish_v5(topic: bytes, pid: int, props: list, payload: bytes) -> bytes:  # type: ignore[type-arg]
    return (
        len(topic).to_bytes(2, "big")
        + topic
        + pid.to_bytes(2, "big")
        + encode_properties(props)
        + payload
    )


def test_publish_header_waits_for_its_bytes_then_reads_them() -> None:
    body = _publish_v5(b"a/b", 7, [user_property("u", "1"), user_property("_format", "x")], b"PAY")
    for cut in range(len(body) - 3):
        assert publish_header(body[:cut], qos=1, v5=True) is None
    header = publish_header(body, qos=1, v5=True)
    assert header is not None and header.packet_id == 7 and body[header.size :] == b"PAY"
    stored = Stored("http://gw:1/msg/i", 3, "a" * 64, MessageId.new())
    packet = placeholder_packet(0x33, header, stored, v5=True)
    framer = Framer()
    framer.feed(packet)
    head, piece = _events(framer)
    assert isinstance(head, Head) and head.first == 0x33 and isinstance(piece, Body)
    placed = publish_header(piece.data, qos=1, v5=True)
    assert placed is not None and placed.packet_id == 7
    names = [p.value for p in placed.properties]
    assert names == [("_format", "external"), ("_id", str(stored.message_id)), ("u", "1")]
    ref = read_placeholder(placed, piece.data[placed.size :])
    assert ref is not None and ref.size == 3 and ref.url == stored.url
    out = resolved_head(0x33, placed, ref.size, v5=True)
    assert len(out) + 3 == resolved_size(placed, 3, v5=True)
    framer.feed(out + b"PAY")
    head, piece = _events(framer)
    assert isinstance(piece, Body) and piece.data.endswith(b"PAY")
    back = publish_header(piece.data, qos=1, v5=True)
    assert back is not None and [p.value for p in back.properties] == [("u", "1")]


def test_publish_header_refuses_hostile_bytes() -> None:
    for bad, qos in (
        (b"\x00\x01+", 0),  # wildcard
        (b"\x00\x01\xff", 0),  # not UTF-8
        (b"\x00\x01a\x00\x00", 1),  # packet id 0
        (b"\x00\x01a\x00\x01\x02\x99\x00", 1),  # unknown property
    ):
        with pytest.raises(MalformedPacket):
            publish_header(bad, qos=qos, v5=True)
    with pytest.raises(MalformedPacket):
        publish_header(b"\x00\x01a", qos=3, v5=False)


def test_aliases_resolve_and_unknown_ones_are_refused() -> None:
    aliases = AliasMap(10)
    set_alias = publish_header(b"\x00\x03a/b" + encode_properties([_alias(3)]), qos=0, v5=True)
    use_alias = publish_header(b"\x00\x00" + encode_properties([_alias(3)]), qos=0, v5=True)
    unknown = publish_header(b"\x00\x00" + encode_properties([_alias(4)]), qos=0, v5=True)
    too_big = publish_header(b"\x00\x01a" + encode_properties([_alias(11)]), qos=0, v5=True)
    assert set_alias and use_alias and unknown and too_big
    assert aliases.topic(set_alias) == "a/b" and aliases.topic(use_alias) == "a/b"
    for header in (unknown, too_big):
        with pytest.raises(UnknownTopicAlias):
            aliases.topic(header)


def _alias(n: int):  # type: ignore[no-untyped-def]
    from proxy.protocol._properties import Prop

    return Prop(0x23, n, bytes([0x23]) + n.to_bytes(2, "big"))


def test_connack_limit_read() -> None:
    body = b"\x00\x00" + encode_properties([u32_property(0x27, 262144)])
    assert parse_connack(body, v5=True).max_packet_size == 262144
    assert parse_connack(b"\x00\x00", v5=False).max_packet_size is None
    with pytest.raises(MalformedPacket):
        parse_connack(b"\x00", v5=True)
