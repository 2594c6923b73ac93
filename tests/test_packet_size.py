"""Exact PUBLISH packet sizes: hand-written vectors, paho's own encoder, and a real mosquitto."""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from client.core._exceptions import InvalidTopic, MessageTooLarge, ProtocolError
from client.mqtt._props import from_paho_properties, to_paho_properties
from client.protocol._props import PublishProperties, publish_properties_problem
from client.protocol._props_wire import encode_properties
from client.protocol._size import (
    MAX_PACKET_SIZE,
    MAX_REMAINING_LENGTH,
    fits,
    max_payload,
    properties_size,
    publish_packet_size,
    varint_size,
)

from _servers import Mosquitto

TIMEOUT = 10.0

# ----------------------------------------------------------------------- helpers


def to_paho(props: PublishProperties | None) -> Properties | None:
    """The test's own PublishProperties -> paho conversion (the client adapter has its own)."""
    if props is None:
        return None
    out = Properties(PacketTypes.PUBLISH)
    if props.payload_format_indicator is not None:
        out.PayloadFormatIndicator = props.payload_format_indicator
    if props.message_expiry_interval is not None:
        out.MessageExpiryInterval = props.message_expiry_interval
    if props.content_type is not None:
        out.ContentType = props.content_type
    if props.response_topic is not None:
        out.ResponseTopic = props.response_topic
    if props.correlation_data is not None:
        out.CorrelationData = props.correlation_data
    if props.user_properties:
        out.UserProperty = list(props.user_properties)
    if props.topic_alias is not None:
        out.TopicAlias = props.topic_alias
    if props.subscription_identifiers:
        out.SubscriptionIdentifier = list(props.subscription_identifiers)
    return out


def read_packet(sock: socket.socket) -> bytes | None:
    """One whole MQTT packet off the stream, or None at EOF."""

    def exactly(n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            part = sock.recv(n - len(buf))
            if not part:
                return None
            buf += part
        return buf

    first = exactly(1)
    if first is None:
        return None
    header, remaining, shift = first, 0, 0
    while True:
        byte = exactly(1)
        if byte is None:
            return None
        header += byte
        remaining |= (byte[0] & 0x7F) << shift
        shift += 7
        if not byte[0] & 0x80:
            break
    body = exactly(remaining) if remaining else b""
    return None if body is None else header + body


class WireTap:
    """A loopback peer that answers CONNECT/PUBLISH just enough to record paho's exact bytes.

    Not a broker and not a mock of paho: paho talks to a real socket, and we read what it
    wrote (fault injection "at the byte seam").
    """

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.publishes: queue.Queue[bytes] = queue.Queue()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        # OSError: paho hung up first, or no one connected before close(): the test is over.
        with contextlib.suppress(OSError):
            conn, _ = self.server.accept()
            with conn:
                self._talk(conn)

    def _talk(self, conn: socket.socket) -> None:
        read_packet(conn)  # CONNECT
        conn.sendall(bytes([0x20, 3, 0, 0, 0]))  # MQTT 5 CONNACK: success, no properties
        while (packet := read_packet(conn)) is not None:
            kind = packet[0] >> 4
            if kind == 6:  # PUBREL -> PUBCOMP, same packet id
                conn.sendall(bytes([0x70, 2]) + packet[2:4])
            if kind != 3:
                continue
            self.publishes.put(packet)
            qos = (packet[0] >> 1) & 3
            if qos:  # PUBACK / PUBREC so paho's in-flight window never fills
                skip = 1 + next(i for i, b in enumerate(packet[1:], 1) if not b & 0x80)
                topic_len = int.from_bytes(packet[skip : skip + 2], "big")
                pid = packet[skip + 2 + topic_len : skip + 4 + topic_len]
                conn.sendall(bytes([0x40 if qos == 1 else 0x50, 2]) + pid)

    def close(self) -> None:
        self.server.close()
        self.thread.join(TIMEOUT)


@pytest.fixture
def paho_wire() -> Iterator[tuple[mqtt.Client, WireTap]]:
    tap = WireTap()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    connected = threading.Event()
    client.on_connect = lambda *args: connected.set()
    client.connect("127.0.0.1", tap.port)
    client.loop_start()
    assert connected.wait(TIMEOUT)
    yield client, tap
    client.disconnect()
    client.loop_stop()
    tap.close()


# ----------------------------------------------------------------------- hand vectors


def test_varint_widths_change_at_the_spec_boundaries() -> None:
    for value, width in [
        (0, 1),
        (127, 1),
        (128, 2),
        (16_383, 2),
        (16_384, 3),
        (2_097_151, 3),
        (2_097_152, 4),
        (268_435_455, 4),
    ]:
        assert varint_size(value) == width, value
    with pytest.raises(ProtocolError):
        varint_size(268_435_456)
    with pytest.raises(ProtocolError):
        varint_size(-1)


# MQTT 3.1.1, QoS 0, topic "a/b", payload "xyz": written byte by byte from the spec.
V311_QOS0 = bytes.fromhex("30 08 0003 612f62 78797a".replace(" ", ""))
# MQTT 5, QoS 1, packet id 1, topic "t", properties: message expiry 60, user property k=v,
# payload "hi". Property bytes: 02 0000003c | 26 0001 6b 0001 76 -> 12 bytes.
V5_QOS1_PROPS = bytes.fromhex(
    "32 14 0001 74 0001 0c 02 0000003c 26 0001 6b 0001 76 6869".replace(" ", "")
)
V5_PROPS = PublishProperties(message_expiry_interval=60, user_properties=(("k", "v"),))


def test_hand_written_vectors() -> None:
    assert len(V311_QOS0) == 10
    assert publish_packet_size("a/b", 3, qos=0, properties=None, protocol=4) == 10
    assert len(V5_QOS1_PROPS) == 22
    assert publish_packet_size("t", 2, qos=1, properties=V5_PROPS) == 22
    # The same message over MQTT 5 without properties still has the 1-byte property length.
    assert publish_packet_size("a/b", 3, qos=0, properties=None) == 11
    assert publish_packet_size("a/b", 3, qos=0, properties=PublishProperties()) == 11


def test_each_property_costs_what_the_spec_says() -> None:
    base = properties_size(PublishProperties())
    assert base == 0
    cases: list[tuple[PublishProperties, int]] = [
        (PublishProperties(payload_format_indicator=1), 2),
        (PublishProperties(message_expiry_interval=2**32 - 1), 5),
        (PublishProperties(content_type="application/json"), 1 + 2 + 16),
        (PublishProperties(response_topic="r/é"), 1 + 2 + 4),  # é is two UTF-8 bytes
        (PublishProperties(correlation_data=b"\x00" * 9), 1 + 2 + 9),
        (PublishProperties(user_properties=(("ab", "cde"), ("ab", "cde"))), 2 * (1 + 4 + 5)),
        (PublishProperties(topic_alias=7), 3),
        (PublishProperties(subscription_identifiers=(1, 128, 16_384)), 2 + 3 + 4),
    ]
    for props, size in cases:
        assert properties_size(props) == size, props


def test_values_that_cannot_be_encoded_are_refused() -> None:
    with pytest.raises(ProtocolError):
        properties_size(PublishProperties(content_type="x" * 65_536))
    with pytest.raises(ProtocolError):
        properties_size(PublishProperties(user_properties=(("\ud800", "v"),)))
    with pytest.raises(ProtocolError):
        properties_size(PublishProperties(message_expiry_interval=2**32))
    with pytest.raises(ProtocolError):
        properties_size(PublishProperties(subscription_identifiers=(0,)))
    with pytest.raises(InvalidTopic):
        publish_packet_size("t" * 65_536, 0, qos=0, properties=None)
    with pytest.raises(ProtocolError):
        publish_packet_size("t", 0, qos=0, properties=V5_PROPS, protocol=4)
    with pytest.raises(ValueError):
        publish_packet_size("t", 0, qos=3, properties=None)
    with pytest.raises(ValueError):
        publish_packet_size("t", -1, qos=0, properties=None)
    with pytest.raises(MessageTooLarge):
        publish_packet_size("t", MAX_REMAINING_LENGTH, qos=0, properties=None)


def test_largest_encodable_packet() -> None:
    payload = MAX_REMAINING_LENGTH - 2 - 1 - 1  # topic "t" and an empty property length
    assert publish_packet_size("t", payload, qos=0, properties=None) == MAX_PACKET_SIZE
    assert max_payload("t", qos=0, properties=None, limit=10**12) == payload
    assert not fits("t", payload + 1, qos=0, properties=None, limit=10**12)


# ----------------------------------------------------------------------- max_payload


def test_max_payload_across_each_varint_boundary() -> None:
    # Header of topic "t" with QoS 0 over MQTT 5 is 4 bytes: remaining = 4 + payload.
    for boundary in (127, 16_383, 2_097_151):
        below = boundary - 4  # largest payload with the narrow length field
        narrow = 1 + varint_size(boundary) + boundary
        assert publish_packet_size("t", below, qos=0, properties=None) == narrow
        assert max_payload("t", qos=0, properties=None, limit=narrow) == below
        # One more payload byte costs two packet bytes: limit narrow+1 cannot be filled.
        assert publish_packet_size("t", below + 1, qos=0, properties=None) == narrow + 2
        assert max_payload("t", qos=0, properties=None, limit=narrow + 1) == below
        assert max_payload("t", qos=0, properties=None, limit=narrow + 2) == below + 1


def test_empty_payload_that_does_not_fit_raises() -> None:
    size = publish_packet_size("topic", 0, qos=1, properties=V5_PROPS)
    assert max_payload("topic", qos=1, properties=V5_PROPS, limit=size) == 0
    with pytest.raises(MessageTooLarge) as info:
        max_payload("topic", qos=1, properties=V5_PROPS, limit=size - 1)
    assert info.value.size == size and info.value.limit == size - 1
    assert not fits("topic", 0, qos=1, properties=V5_PROPS, limit=size - 1)


_text = st.text(st.characters(codec="utf-8"), max_size=40)
_props = st.builds(
    PublishProperties,
    payload_format_indicator=st.none() | st.sampled_from([0, 1]),
    message_expiry_interval=st.none() | st.integers(0, 2**32 - 1),
    content_type=st.none() | _text,
    response_topic=st.none() | _text,
    correlation_data=st.none() | st.binary(max_size=40),
    user_properties=st.lists(st.tuples(_text, _text), max_size=4).map(tuple),
    topic_alias=st.none() | st.integers(1, 65_535),
    subscription_identifiers=st.lists(st.integers(1, MAX_REMAINING_LENGTH), max_size=3).map(tuple),
)


@settings(deadline=None)
@given(props=_props)
def test_properties_size_matches_paho_encoder(props: PublishProperties) -> None:
    packed = to_paho(props)
    assert packed is not None
    inner = properties_size(props)
    assert varint_size(inner) + inner == len(packed.pack())


@settings(deadline=None)
@given(props=_props)
def test_the_clients_own_encoder_packs_what_paho_packs(props: PublishProperties) -> None:
    """The client's PUBLISH properties are packed by client/protocol/_props_wire.py, not
    paho (client/mqtt/_props.py PackedProperties): the same bytes, which paho reads back."""
    sent = dataclasses.replace(props, subscription_identifiers=())  # the broker's to send
    wire = encode_properties(sent)
    reference = to_paho(sent)
    assert reference is not None and wire == reference.pack()
    adapter = to_paho_properties(sent)
    assert (adapter.pack() if adapter is not None else b"\x00") == wire
    if publish_properties_problem(sent) is None:  # what the client ever sends (a broker too)
        read = Properties(PacketTypes.PUBLISH)
        read.unpack(wire)
        assert from_paho_properties(read) == sent


@settings(deadline=None)
@given(
    topic=_text.filter(bool),
    qos=st.sampled_from([0, 1, 2]),
    props=st.none() | _props,
    limit=st.integers(1, 3_000_000)
    | st.sampled_from([127, 128, 129, 130, 131, 16_383, 16_385, 16_386, 16_387, 2_097_155]).map(
        lambda b: b + 3
    ),
)
def test_max_payload_is_the_largest_that_fits(
    topic: str, qos: int, props: PublishProperties | None, limit: int
) -> None:
    try:
        best = max_payload(topic, qos=qos, properties=props, limit=limit)
    except MessageTooLarge:
        assert not fits(topic, 0, qos=qos, properties=props, limit=limit)
        return
    assert fits(topic, best, qos=qos, properties=props, limit=limit)
    assert not fits(topic, best + 1, qos=qos, properties=props, limit=limit)
    # Never more than one byte short: the varint jump is the only thing that wastes space.
    assert publish_packet_size(topic, best, qos=qos, properties=props) >= limit - 1


# ----------------------------------------------------------------------- paho's real bytes


def test_hand_vector_is_what_paho_sends(paho_wire: tuple[mqtt.Client, WireTap]) -> None:
    client, tap = paho_wire
    client.publish("t", b"hi", qos=1, properties=to_paho(V5_PROPS))
    assert tap.publishes.get(timeout=TIMEOUT) == V5_QOS1_PROPS
    # The client adapter's properties, packed by the project's encoder, go out the same.
    client.publish("t", b"hi", qos=1, properties=to_paho_properties(V5_PROPS))
    again = tap.publishes.get(timeout=TIMEOUT)
    assert again[:5] + again[7:] == V5_QOS1_PROPS[:5] + V5_QOS1_PROPS[7:]  # another packet id


PAHO_CASES: list[tuple[str, int, PublishProperties | None]] = [
    ("t", 0, None),
    ("a/b/c", 1, PublishProperties(message_expiry_interval=5)),
    (
        "sensors/é/temp",
        2,
        PublishProperties(
            payload_format_indicator=1,
            message_expiry_interval=3600,
            content_type="application/octet-stream",
            response_topic="reply/here",
            correlation_data=b"\x01\x02\x03",
            user_properties=(("__chunk", "x" * 50), ("$partition", "7"), ("k", "v")),
        ),
    ),
    # Enough user properties that the property length itself needs two bytes.
    ("p", 1, PublishProperties(user_properties=tuple((f"k{i}", "v" * 10) for i in range(12)))),
]


@pytest.mark.parametrize(("topic", "qos", "props"), PAHO_CASES)
def test_sizes_match_paho_on_the_wire_around_varint_boundaries(
    paho_wire: tuple[mqtt.Client, WireTap],
    topic: str,
    qos: int,
    props: PublishProperties | None,
) -> None:
    client, tap = paho_wire
    header = publish_packet_size(topic, 0, qos=qos, properties=props) - 2  # minus 1+1 fixed
    payload_lengths = {0, 1}
    for boundary in (127, 16_383, 2_097_151):
        # Payloads that put the remaining length just below, on and just above a boundary.
        payload_lengths |= {boundary - header + d for d in (-1, 0, 1) if boundary - header + d >= 0}
    for length in sorted(payload_lengths):
        client.publish(topic, b"\xa5" * length, qos=qos, properties=to_paho(props))
        wire = tap.publishes.get(timeout=TIMEOUT)
        assert len(wire) == publish_packet_size(topic, length, qos=qos, properties=props), length


# ----------------------------------------------------------------------- a real broker


class _Peer:
    """A raw paho client with its callbacks turned into queues."""

    def __init__(self, broker: Mosquitto) -> None:
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.connack: queue.Queue[Any] = queue.Queue()
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.disconnects: queue.Queue[Any] = queue.Queue()
        self.subscribed = threading.Event()
        self.client.on_connect = lambda c, u, f, rc, props: self.connack.put(props)
        self.client.on_message = lambda c, u, m: self.messages.put(m)
        self.client.on_disconnect = lambda c, u, f, rc, p: self.disconnects.put(rc)
        self.client.on_subscribe = lambda *args: self.subscribed.set()
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


BROKER_CASES: list[tuple[int, int, PublishProperties | None]] = [
    (1_000, 1, None),
    (20_000, 1, PAHO_CASES[2][2]),  # remaining length needs 3 bytes at this size
    (5_000, 0, PublishProperties(message_expiry_interval=60, user_properties=(("k", "v"),))),
]


@pytest.mark.servers
@pytest.mark.parametrize(("limit", "qos", "props"), BROKER_CASES)
def test_mosquitto_accepts_exactly_the_limit_and_rejects_more(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    limit: int,
    qos: int,
    props: PublishProperties | None,
) -> None:
    broker = mosquitto_factory(max_packet_size=limit)
    topic = unique_topic("size")
    sub, pub = _Peer(broker), _Peer(broker)
    try:
        sub.connack.get(timeout=TIMEOUT)
        sub.client.subscribe(topic, qos=1)
        assert sub.subscribed.wait(TIMEOUT)
        # The limit we size against is the one the broker announces in CONNACK.
        assert pub.connack.get(timeout=TIMEOUT).MaximumPacketSize == limit

        best = max_payload(topic, qos=qos, properties=props, limit=limit)
        assert publish_packet_size(topic, best, qos=qos, properties=props) == limit
        pub.client.publish(topic, b"\x5a" * best, qos=qos, properties=to_paho(props))
        got = sub.messages.get(timeout=TIMEOUT)
        assert len(got.payload) == best

        # mosquitto 2.0 only checks remaining_length + 1 <= limit, forgetting the length
        # field's own bytes, so it lets through a packet up to that many bytes over our exact
        # limit. Pinned here so a stricter broker shows up; our sizing never relies on it.
        width = next(w for w in (1, 2, 3, 4) if varint_size(limit - 1 - w) == w)
        lenient = best + width  # remaining length == limit - 1: the packet is `width` over
        assert publish_packet_size(topic, lenient, qos=qos, properties=props) == limit + width
        pub.client.publish(topic, b"\x5a" * lenient, qos=qos, properties=to_paho(props))
        assert len(sub.messages.get(timeout=TIMEOUT).payload) == lenient

        # One byte of remaining length more and the broker disconnects the publisher.
        pub.client.publish(topic, b"\x5a" * (lenient + 1), qos=qos, properties=to_paho(props))
        reason = pub.disconnects.get(timeout=TIMEOUT)
        assert reason == 149  # 0x95 Packet too large
        with pytest.raises(queue.Empty):
            sub.messages.get(timeout=0.5)
    finally:
        sub.close()
        pub.close()
