"""Runs on an upgraded link (an MQTT 3.1.1 client, an MQTT 5 broker): each packet a run
carries is translated exactly as the slow path's own functions translate it
(proxy.protocol._v311: upgrade_publish, downgraded_publish_head, downgrade_packet), and
what the slow path must read still stops the run."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_proxy_runs import FORMAT, alias, packet, publish, relay, split

from proxy.protocol import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    DOWNGRADE,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    UPGRADE,
    Framer,
    Head,
    ProxyProtocolError,
    RunRule,
    downgrade_packet,
    downgraded_publish_head,
    name_marks,
    publish_header,
    type_mask,
    upgrade_publish,
)
from proxy.protocol._properties import user_property

LIMIT = 262144
UP = RunRule(LIMIT, False, translate=UPGRADE)
DOWN = RunRule(
    2**28, True, property_marks=name_marks("_format", "__chunk"), json_mark=FORMAT,
    translate=DOWNGRADE,
)  # fmt: skip
UP_STOP = type_mask(CONNECT, DISCONNECT, SUBSCRIBE, UNSUBSCRIBE)
DOWN_STOP = type_mask(CONNACK, SUBACK, UNSUBACK, DISCONNECT, AUTH)


def publish311(topic: bytes = b"t/1", payload: bytes = b"x", *, qos: int = 1) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + (b"\x00\x07" if qos else b"")
    return packet(0x30 | qos << 1, body + payload)


def _body(data: bytes) -> tuple[int, bytes]:
    at = 1
    while data[at] & 0x80:
        at += 1
    return data[0], data[at + 1 :]


def upgraded(data: bytes) -> bytes:
    """What the slow path sends the broker for one whole 3.1.1 packet it lets pass."""
    first, body = _body(data)
    if first >> 4 != 3:
        return data
    header = publish_header(body, qos=(first >> 1) & 3, v5=False)
    assert header is not None
    head = Head(first, len(body), data[: len(data) - len(body)])
    new_head, _, prefix = upgrade_publish(head, header, body)
    return new_head.raw + prefix


def downgraded(data: bytes) -> bytes:
    """What the slow path sends a 3.1.1 client for one whole MQTT 5 packet."""
    first, body = _body(data)
    if first >> 4 != 3:
        out = downgrade_packet(first, body)
        assert out is not None
        return out
    header = publish_header(body, qos=(first >> 1) & 3, v5=True)
    assert header is not None
    payload = body[header.size :]
    return downgraded_publish_head(first, header, len(payload)) + payload


def take(data: bytes, rule: RunRule, stop: int) -> tuple[bytes | None, Framer]:
    framer = Framer()
    framer.feed(data)
    return framer.passable(stop, rule), framer


#: Topics the slow path's parser reads (UTF-8, no wildcard, no NUL): a malformed one goes to
#: the broker in a run as it came, and the broker refuses it (test_proxy_relay.py).
_topics = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00#+"),
    min_size=1, max_size=10,
).map(str.encode)  # fmt: skip
_acks = st.sampled_from([0x40, 0x50, 0x62, 0x70]).map(lambda f: packet(f, b"\x00\x09"))
_up = st.one_of(
    st.builds(
        publish311,
        _topics,
        st.binary(max_size=300),
        qos=st.integers(0, 2),
    ),
    _acks,
    st.just(packet(0xC0, b"")),  # PINGREQ
)


@given(st.lists(_up, min_size=1, max_size=12))
def test_a_3_1_1_clients_run_is_what_the_slow_path_sends_the_broker(
    items: list[bytes],
) -> None:
    stream = b"".join(items)
    run, framer = take(stream, UP, UP_STOP)
    assert run == b"".join(upgraded(p) for p in items)
    assert (framer.passed, framer.heads, framer.buffered) == (len(items), 0, 0)
    # and the broker reads each as MQTT 5
    for p in split(run):
        if p[0] >> 4 == 3:
            first, body = _body(p)
            assert publish_header(body, qos=(first >> 1) & 3, v5=True) is not None


_props = st.sampled_from([
    b"",
    b"\x01\x01\x02\x00\x00\x00\x10",  # payload format, message expiry
    b"\x0b\x07",  # a subscription identifier
    user_property("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01").raw,
    user_property("k", "v").raw + b"\x03\x00\x04text",  # and a content type
])  # fmt: skip
_reasons = st.sampled_from([b"", b"\x10", b"\x00\x00", b"\x80\x03\x1f\x00\x00"])
_down = st.one_of(
    st.builds(
        lambda topic, payload, qos, props: publish(topic, payload, qos=qos, props=props),
        _topics,
        st.binary(max_size=300).filter(lambda p: FORMAT not in p),
        st.integers(0, 2),
        _props,
    ),
    st.builds(
        lambda first, reason: packet(first, b"\x00\x09" + reason),
        st.sampled_from([0x40, 0x50, 0x62, 0x70]),
        _reasons,
    ),
    st.just(packet(0xD0, b"")),  # PINGRESP
)


@given(st.lists(_down, min_size=1, max_size=12))
def test_a_brokers_run_is_what_the_slow_path_sends_a_3_1_1_client(items: list[bytes]) -> None:
    stream = b"".join(items)
    run, framer = take(stream, DOWN, DOWN_STOP)
    assert run == b"".join(downgraded(p) for p in items)
    assert (framer.passed, framer.heads, framer.buffered) == (len(items), 0, 0)


@pytest.mark.parametrize(
    ("case", "data", "rule", "stop"),
    [
        ("a 3.1.1 PUBLISH over the broker's limit once upgraded",
         publish311(payload=bytes(LIMIT - 10)), UP, UP_STOP),
        ("a 3.1.1 PUBLISH with no topic", publish311(topic=b""), UP, UP_STOP),
        ("a 3.1.1 PUBLISH at QoS 3", packet(0x36, b"\x00\x01t\x00\x01x"), UP, UP_STOP),
        ("a 3.1.1 PUBLISH whose packet id runs past it", packet(0x32, b"\x00\x01t\x00"), UP,
         UP_STOP),
        ("SUBSCRIBE", packet(0x82, b"\x00\x01\x00\x01t\x01"), UP, UP_STOP),
        ("UNSUBSCRIBE", packet(0xA2, b"\x00\x01\x00\x01t"), UP, UP_STOP),
        ("CONNECT", packet(0x10, b"\x00"), UP, UP_STOP),
        ("DISCONNECT", packet(0xE0, b""), UP, UP_STOP),
        ("a placeholder's _format", publish(props=user_property("_format", "external").raw),
         DOWN, DOWN_STOP),
        ("a chunk's __chunk", publish(props=user_property("__chunk", "{}").raw), DOWN,
         DOWN_STOP),
        ("a placeholder's JSON", publish(payload=b'{"_format":"external"}'), DOWN, DOWN_STOP),
        ("a Topic Alias standing for the topic", publish(topic=b"", props=alias(1)), DOWN,
         DOWN_STOP),
        ("a property length that runs past the packet", publish(props=b"")[:-2] + b"\x7fx",
         DOWN, DOWN_STOP),
        ("an acknowledgement without a packet id", packet(0x40, b"\x00"), DOWN, DOWN_STOP),
        ("SUBACK", packet(0x90, b"\x00\x01\x00\x01"), DOWN, DOWN_STOP),
        ("UNSUBACK", packet(0xB0, b"\x00\x01\x00\x00"), DOWN, DOWN_STOP),
        ("CONNACK", packet(0x20, b"\x00\x00\x00"), DOWN, DOWN_STOP),
        ("the broker's DISCONNECT", packet(0xE0, b"\x81"), DOWN, DOWN_STOP),
        ("AUTH", packet(0xF0, b"\x00"), DOWN, DOWN_STOP),
    ],
)  # fmt: skip
def test_what_the_slow_path_must_translate_or_refuse_stops_the_run(
    case: str, data: bytes, rule: RunRule, stop: int
) -> None:
    before = publish311() if rule is UP else publish()
    run, framer = take(before + data, rule, stop)
    assert run == (upgraded if rule is UP else downgraded)(before), case
    assert framer.passable(stop, rule) is None, case
    assert framer.passed == 1


def test_the_slow_path_refuses_what_a_run_stops_at_for_want_of_a_form() -> None:
    """Each stop above for a malformed packet is one the slow path's translation refuses
    (or, for the placeholder, one it resolves): a run that carried it would have sent a
    form the slow path never sends."""
    with pytest.raises(ProxyProtocolError):
        downgraded(publish(topic=b"", props=alias(1)))
    with pytest.raises(ProxyProtocolError):
        downgrade_packet(0x40, b"\x00")


def test_a_translated_stream_split_at_every_byte_relays_the_same() -> None:
    items = [publish311(), packet(0x40, b"\x00\x07"), publish311(payload=bytes(200), qos=0),
             packet(0x82, b"\x00\x01\x00\x01t\x01"), publish311(qos=2)]  # fmt: skip
    stream = b"".join(items)
    # the SUBSCRIBE is framed one by one (the relay translates it itself)
    whole = b"".join(upgraded(p) for p in items[:3]) + items[3] + upgraded(items[4])
    for cut in range(1, len(stream)):
        got = relay([stream[:cut], stream[cut:]], UP, UP_STOP)
        assert got.out == whole, cut
        assert got.seen == [items[3]], cut
