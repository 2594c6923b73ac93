"""Runs of packets the relay passes unread (proxy.protocol._runs, Framer.passable): what a
run may hold, checked against the parser the slow path uses, whatever the splits and
however a property block is written."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.protocol import PublishProperties, is_placeholder
from proxy._stream import RUN_READS, PacketStream
from proxy.protocol import (
    CONNECT,
    DISCONNECT,
    PUBACK,
    TOPIC_ALIAS,
    USER_PROPERTY,
    Body,
    Framer,
    Head,
    MalformedPacket,
    ProxyProtocolError,
    RunRule,
    encode_varint,
    identifier_marks,
    name_marks,
    publish_header,
    type_mask,
)
from proxy.protocol._properties import user_property

FORMAT = b'"_format"'
UP = RunRule(262144, True, property_marks=identifier_marks(TOPIC_ALIAS))
DOWN = RunRule(2**28, True, property_marks=name_marks("_format", "__chunk"), json_mark=FORMAT)
#: What the slow path reads of a PUBLISH's properties, per rule (the reference below).
WATCHED = {
    id(UP): lambda p: p.id == TOPIC_ALIAS,
    id(DOWN): lambda p: p.id == USER_PROPERTY and p.value[0] in ("_format", "__chunk"),
}
STOP = type_mask(CONNECT, DISCONNECT)


def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + encode_varint(len(body)) + body


def publish(
    topic: bytes = b"t/1", payload: bytes = b"x", *, qos: int = 1, props: bytes = b""
) -> bytes:
    """A PUBLISH whose property block is `props` as written (length included)."""
    body = len(topic).to_bytes(2, "big") + topic + (b"\x00\x07" if qos else b"")
    return packet(0x30 | qos << 1, body + encode_varint(len(props)) + props + payload)


def alias(value: int, ident: bytes = bytes([TOPIC_ALIAS])) -> bytes:
    return ident + value.to_bytes(2, "big")


def must_see(data: bytes, rule: RunRule, stop: int) -> bool | None:
    """What the slow path's own parser says of one whole packet: must the relay see it?
    None when that parser refuses the PUBLISH (a string, packet id or property that cannot
    be read): a run may hand it on unread, and the broker refuses it as the proxy did."""
    first = data[0]
    kind = first >> 4
    if kind == 0 or (stop >> kind) & 1:
        return True
    if kind != 3:
        return False
    if len(data) > rule.publish_limit:
        return True
    at = 1
    while data[at] & 0x80:
        at += 1
    body = data[at + 1 :]
    try:
        header = publish_header(body, qos=(first >> 1) & 3, v5=rule.v5)
    except ProxyProtocolError:
        return None
    if header is None or not header.topic:
        return True
    watched = WATCHED.get(id(rule), lambda p: False)
    if any(watched(p) for p in header.properties):
        return True
    # The library's own rule for a placeholder without its user property (JSON naming it).
    return bool(rule.json_mark) and is_placeholder(body[header.size :], PublishProperties())


@dataclass
class Relayed:
    runs: list[bytes]
    seen: list[bytes]  # packets framed one by one (head and body)
    out: bytes  # everything, in order


def relay(chunks: list[bytes], rule: RunRule, stop: int = STOP) -> Relayed:
    """Drive a Framer as a relay does: runs while they come, the blocked packet framed."""
    framer = Framer()
    runs: list[bytes] = []
    seen: list[bytes] = []
    out = b""
    pending = list(chunks)
    current = b""  # the packet being framed one by one
    in_head = False
    while True:
        if not in_head:
            run = framer.passable(stop, rule)
            if run:
                runs.append(run)
                out += run
                continue
            if run is None:
                in_head = True
        if in_head:
            event = framer.next_event()
            if isinstance(event, Head):
                current = event.raw
                if event.length == 0:
                    seen.append(current)
                    out += current
                    in_head = False
                continue
            if isinstance(event, Body):
                current += event.data
                if event.last:
                    seen.append(current)
                    out += current
                    in_head = False
                continue
        if not pending:
            break
        framer.feed(pending.pop(0))
    assert framer.buffered == 0
    return Relayed(runs, seen, out)


def split(data: bytes) -> list[bytes]:
    """Every packet of a stream of whole packets."""
    packets, at = [], 0
    while at < len(data):
        i = at + 1
        length, shift = 0, 0
        while True:
            length |= (data[i] & 0x7F) << shift
            i += 1
            if not data[i - 1] & 0x80:
                break
            shift += 7
        packets.append(data[at : i + length])
        at = i + length
    return packets


def test_small_publishes_and_acks_pass_in_one_run_with_no_head() -> None:
    stream = b"".join(publish(payload=bytes(1000)) + packet(0x40, b"\x00\x07") for _ in range(10))
    framer = Framer()
    framer.feed(stream)
    assert framer.passable(STOP, UP) == stream
    assert (framer.heads, framer.passed, framer.buffered) == (0, 20, 0)


def test_a_run_ends_before_the_packet_the_relay_must_see() -> None:
    first = publish() + packet(0x40, b"\x00\x07")
    aliased = publish(props=alias(3))
    framer = Framer()
    framer.feed(first + aliased + publish())
    assert framer.passable(STOP, UP) == first
    assert framer.passable(STOP, UP) is None  # the aliased PUBLISH is the relay's
    head = framer.next_event()
    assert isinstance(head, Head) and head.type == 3 and framer.heads == 1


_FORMAT_PROP = user_property("_format", "external").raw
_V311 = RunRule(2**28, False, json_mark=FORMAT)


@pytest.mark.parametrize(
    ("case", "data", "rule"),
    [
        ("Topic Alias", publish(props=alias(1)), UP),
        ("Topic Alias, identifier in two bytes", publish(props=b"\xa3\x00\x00\x01"), UP),
        ("Topic Alias, identifier in four bytes", publish(props=b"\xa3\x80\x80\x00\x00\x01"), UP),
        ("Topic Alias after another property", publish(props=b"\x01\x01" + alias(2)), UP),
        ("no topic (an alias stands for it)", publish(topic=b"", props=alias(1)), UP),
        ("no topic, no alias", publish(topic=b""), UP),
        ("over the broker's limit", publish(payload=bytes(262144)), UP),
        ("QoS 3", packet(0x36, b"\x00\x01t\x00\x01\x00"), UP),
        ("a topic length that runs past the packet", packet(0x32, b"\x01\x00t\x00\x01\x00x"), UP),
        ("a property length that runs past the packet", publish(props=b"") [:-2] + b"\x7fx", UP),
        ("a property length of five bytes", packet(0x30, b"\x00\x01t\xff\xff\xff\xff\x7f"), UP),
        ("a user property (a placeholder's _format)", publish(props=_FORMAT_PROP), DOWN),
        ("_format, identifier in two bytes", publish(props=b"\xa6\x00" + _FORMAT_PROP[1:]), DOWN),
        ("a chunk's __chunk", publish(props=user_property("__chunk", "{}").raw), DOWN),
        ("a placeholder's JSON, no properties", publish(payload=b'{"_format":"x"}'), DOWN),
        ("a placeholder's JSON, MQTT 3.1.1", packet(0x30, b'\x00\x01t{"_format":"x"}'), _V311),
        ("CONNECT", packet(0x10, b"\x00"), UP),
        ("DISCONNECT", packet(0xE0, b""), UP),
        ("reserved type 0", b"\x00\x00", UP),
        ("a Remaining Length of five bytes", b"\x40\xff\xff\xff\xff\x01", UP),
    ],
)  # fmt: skip
def test_what_the_relay_must_see_stops_the_run(case: str, data: bytes, rule: RunRule) -> None:
    framer = Framer()
    framer.feed(publish() + data)
    assert framer.passable(STOP, rule) == publish(), case  # the packet before it passes
    assert framer.passable(STOP, rule) is None, case
    assert framer.passed == 1


def test_identifiers_written_long_are_what_the_parser_reads_them_as() -> None:
    """The slow path's parser (and a broker's) reads a property identifier written in more
    bytes than it needs as the identifier: so the vectors above hide a real one."""
    for props, ident in ((b"\xa3\x80\x80\x00\x00\x01", TOPIC_ALIAS),
                         (b"\xa6\x00" + _FORMAT_PROP[1:], USER_PROPERTY)):  # fmt: skip
        header = publish_header(publish(props=props)[2:], qos=1, v5=True)
        assert header is not None and [p.id for p in header.properties] == [ident]


def test_a_malformed_packet_that_stops_a_run_is_refused_by_the_framer() -> None:
    framer = Framer()
    framer.feed(b"\x40\xff\xff\xff\xff\x01")
    assert framer.passable(STOP, UP) is None
    with pytest.raises(MalformedPacket):
        framer.next_event()


def test_a_packet_not_yet_whole_waits_when_small_and_is_the_relays_when_large() -> None:
    small = publish(payload=bytes(60_000))
    framer = Framer()
    framer.feed(small[:-1])
    assert framer.passable(STOP, UP) == b""  # more bytes needed
    framer.feed(small[-1:])
    assert framer.passable(STOP, UP) == small
    large = publish(payload=bytes(70_000))
    framer.feed(large[:-1])
    assert framer.passable(STOP, UP) is None  # streamed by the relay, not held whole


def test_the_rule_stops_only_what_it_names() -> None:
    user = publish(props=user_property("k", "v").raw)
    traced = publish(
        props=user_property("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01").raw
    )
    json = publish(payload=b'{"_format":"external"}')
    not_json = publish(payload=b'00 "_format":"external"}')
    framer = Framer()
    framer.feed(user + traced + json + publish(props=alias(1)))
    assert framer.passable(STOP, DOWN) == user + traced  # down: other user properties pass
    assert framer.passable(STOP, DOWN) is None  # a placeholder's JSON stops it
    framer = Framer()
    framer.feed(user + json + publish(props=b"\x01\x01"))
    assert framer.passable(STOP, UP) == user + json + publish(props=b"\x01\x01")
    framer = Framer()
    framer.feed(not_json + publish(payload=b' {"_format":"external"}'))
    assert framer.passable(STOP, DOWN) == not_json  # not JSON: not a placeholder


def test_a_stream_split_at_every_byte_boundary_relays_the_same() -> None:
    packets = [publish(), publish(props=alias(2)), packet(0x40, b"\x00\x07"), publish(
        payload=b'{"_format":1}'), publish(props=user_property("_format", "external").raw),
        packet(0xC0, b""), publish(payload=bytes(300))]  # fmt: skip
    stream = b"".join(packets)
    for rule in (UP, DOWN):
        whole = relay([stream], rule)
        for cut in range(1, len(stream)):
            got = relay([stream[:cut], stream[cut:]], rule)
            assert got.out == stream
            assert got.seen == whole.seen  # the same packets framed one by one


def test_every_byte_alone_relays_the_same() -> None:
    stream = b"".join([publish(), publish(props=alias(2)), publish(), packet(0x40, b"\x00\x07")])
    got = relay([bytes([b]) for b in stream], UP)
    assert got.out == stream
    assert got.seen == [publish(props=alias(2))]


_props = st.one_of(
    st.just(b""),
    st.just(alias(5)),
    st.just(b"\xa3\x00\x00\x05"),  # the alias identifier written long
    st.just(user_property("_format", "external").raw),
    st.just(b"\xa6\x80\x00" + user_property("k", "v").raw[1:]),
    st.just(b"\xa6\x00" + user_property("__chunk", "{}").raw[1:]),
    st.just(user_property("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01").raw),
    st.just(b"\x01\x01\x02\x00\x00\x00\x10"),  # payload format, message expiry
    st.binary(max_size=12),  # anything: malformed ones included
)
_payloads = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b'{"_format":"external"}', b' \r\n\t{"_format": "external"}',
                     b'x{"_format":"external"}', b'{"_format":"other"}']),
)  # fmt: skip


@st.composite
def packets(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["publish", "publish", "publish", "ack", "raw"]))
    if kind == "ack":
        return packet(draw(st.sampled_from([0x40, 0x50, 0x62, 0x70, 0xC0, 0xD0])), b"\x00\x07")
    if kind == "raw":
        return packet(
            draw(st.sampled_from([0x10, 0x30, 0x32, 0x36, 0x82, 0xE0])),
            draw(st.binary(max_size=20)),
        )
    topic = draw(st.sampled_from([b"t/1", b"", b"a/b/c"]))
    return publish(topic, draw(_payloads), qos=draw(st.integers(0, 2)), props=draw(_props))


@given(
    st.lists(packets(), min_size=1, max_size=12),
    st.lists(st.integers(1, 40), min_size=1, max_size=8),
    st.sampled_from(["up", "down", "down311"]),
)
def test_a_run_never_holds_a_packet_the_slow_path_would_read(
    stream_packets: list[bytes], cuts: list[int], which: str
) -> None:
    rule = {"up": UP, "down": DOWN, "down311": _V311}[which]
    stop = STOP | type_mask(PUBACK) if which == "down" else STOP
    stream = b"".join(stream_packets)
    chunks, at, i = [], 0, 0
    while at < len(stream):
        chunks.append(stream[at : at + cuts[i % len(cuts)]])
        at += cuts[i % len(cuts)]
        i += 1
    try:
        got = relay(chunks, rule, stop)
    except ProxyProtocolError:
        return  # the framer refused a packet the run stopped at (a type 0 ...)
    assert got.out == stream  # nothing lost, duplicated or reordered
    for run in got.runs:
        for one in split(run):
            assert must_see(one, rule, stop) is not True, one
    for one in got.seen:  # and what was framed one by one is a whole packet of the stream
        assert one in stream_packets


def test_a_packet_that_trickles_in_is_framed_and_streamed_not_held_whole() -> None:
    """A small PUBLISH arriving a byte per read would be copied whole at every read while a
    run waited for it: after RUN_READS reads it is the relay's to stream, piece by piece."""
    whole = publish(payload=bytes(2000))

    async def relayed() -> tuple[bytes, bytes]:
        reader = asyncio.StreamReader()
        stream = PacketStream(reader, max_length=2**20, idle=5)
        reader.feed_data(publish())  # a whole one first: a run

        async def trickle() -> None:
            for byte in whole:
                await asyncio.sleep(0)
                reader.feed_data(bytes([byte]))

        task = asyncio.create_task(trickle())
        run = await stream.run(UP, lambda: STOP)
        assert await stream.run(UP, lambda: STOP) == b""  # not whole after RUN_READS reads
        head = await stream.head()
        assert head is not None
        body = b"".join([piece async for piece in stream.pieces(head)])
        await task
        return run or b"", head.raw + body

    run, streamed = asyncio.run(relayed())
    assert (run, streamed) == (publish(), whole)
    assert len(whole) > RUN_READS
