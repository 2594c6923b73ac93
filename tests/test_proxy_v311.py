"""MQTT 3.1.1 clients behind offload-proxy: the proxy speaks MQTT 5 to the broker for them
(proxy.protocol._v311), so ADR-23 chunked messages reach them whole. The translation's byte
vectors, then plain `mosquitto_sub -V 311` and `mosquitto_pub -V 311` through the proxy with
real mosquitto (256 KiB), the gateway and SeaweedFS."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable

import pytest
from test_proxy import start_proxy, subscribed

from proxy.protocol import (
    Head,
    PublishHeader,
    downgrade_connack,
    downgrade_packet,
    downgraded_publish_head,
    keeps_session_without_id,
    parse_connack,
    parse_connect,
    publish_header,
    upgrade_connect,
    upgrade_packet,
    upgrade_publish,
)
from proxy.protocol._wire import text

from _gateway import GatewayServer
from _servers import Mosquitto, wait_until

MiB = 1024 * 1024


def _connect_body(
    flags: int, client_id: str = "c1", *, name: str = "MQTT", level: int = 4
) -> bytes:
    body = text(name) + bytes([level, flags]) + (30).to_bytes(2, "big") + text(client_id)
    if flags & 0x04:
        body += text("will/t") + text("bye")
    if flags & 0x80:
        body += text("user")
    if flags & 0x40:
        body += text("pw")
    return body


@pytest.mark.parametrize(("name", "level"), [("MQTT", 4), ("MQIsdp", 3)])
def test_a_311_connect_becomes_the_same_mqtt5_connect(name: str, level: int) -> None:
    clean = parse_connect(_connect_body(0xC6 | 0x08, name=name, level=level))  # will QoS 1
    up = upgrade_connect(clean)
    assert up.v5 and up.properties == ()
    assert (up.client_id, up.keepalive, up.username, up.password) == ("c1", 30, "user", b"pw")
    assert up.will is not None and (up.will.topic, up.will.payload, up.will.qos) == (
        "will/t",
        b"bye",
        1,
    )
    assert up.packet == b"\x10" + bytes([len(up.body)]) + up.body
    assert up.body == text("MQTT") + b"\x05\xce\x00\x1e\x00" + text("c1") + b"\x00" + (
        text("will/t") + text("bye") + text("user") + text("pw")
    )


def test_a_persistent_311_session_never_expires_on_the_mqtt5_link() -> None:
    up = upgrade_connect(parse_connect(_connect_body(0x00)))
    assert [(p.id, p.value) for p in up.properties] == [(0x11, 0xFFFFFFFF)]
    assert keeps_session_without_id(parse_connect(_connect_body(0x00, "")))
    assert not keeps_session_without_id(parse_connect(_connect_body(0x02, "")))
    assert not keeps_session_without_id(parse_connect(_connect_body(0x00, "x")))


@pytest.mark.parametrize(
    ("reason", "code"),
    [(0x00, 0), (0x84, 1), (0x85, 2), (0x88, 3), (0x89, 3), (0x86, 4), (0x87, 5), (0x8A, 5),
     (0x80, 3), (0x97, 3)],
)  # fmt: skip
def test_connack_reason_codes_become_311_return_codes(reason: int, code: int) -> None:
    v5 = parse_connack(bytes([1, reason]) + b"\x05\x27\x00\x04\x00\x00", v5=True)
    assert downgrade_connack(v5) == bytes([0x20, 2, 1 if code == 0 else 0, code])


def test_a_311_publish_gains_an_empty_property_section_and_keeps_its_id() -> None:
    body = text("a/b") + b"\x12\x34" + b"payload"
    head = Head(0x3B, len(body), bytes([0x3B, len(body)]))  # DUP, QoS 1, retain
    header = publish_header(body, qos=1, v5=False)
    assert header is not None
    up_head, up_header, up_prefix = upgrade_publish(head, header, body[:7])  # header + 0 bytes
    assert up_head == Head(0x3B, len(body) + 1, bytes([0x3B, len(body) + 1]))
    assert up_prefix == text("a/b") + b"\x12\x34\x00"
    again = publish_header(up_prefix + b"payload", qos=1, v5=True)
    assert again == up_header == PublishHeader(b"a/b", 0x1234, (), 8)


def test_an_mqtt5_publish_loses_its_properties_for_a_311_client() -> None:
    props = b"\x0b\x02" + b"\x26" + text("__chunk") + text("x")
    body = text("a/b") + b"\x00\x07" + bytes([len(props)]) + props + b"data"
    header = publish_header(body, qos=2, v5=True)
    assert header is not None
    assert downgraded_publish_head(0x34, header, 4) + b"data" == (
        b"\x34" + bytes([5 + 2 + 4]) + text("a/b") + b"\x00\x07" + b"data"
    )


def test_subscribe_and_unsubscribe_gain_an_empty_property_section() -> None:
    sub = b"\x00\x05" + text("t/#") + b"\x01"
    assert upgrade_packet(0x82, sub) == b"\x82" + bytes([len(sub) + 1]) + b"\x00\x05\x00" + sub[2:]
    unsub = b"\x00\x06" + text("t/#")
    assert upgrade_packet(0xA2, unsub) == b"\xa2\x08\x00\x06\x00" + text("t/#")


@pytest.mark.parametrize(
    ("first", "body", "out"),
    [
        (0x40, b"\x00\x09\x10\x00", b"\x40\x02\x00\x09"),  # PUBACK, no matching subscribers
        (0x50, b"\x00\x09\x87\x03\x1f\x00\x00", b"\x50\x02\x00\x09"),  # PUBREC refused
        (0x62, b"\x00\x09", b"\x62\x02\x00\x09"),  # PUBREL, reason omitted
        (0x70, b"\x00\x09\x92", b"\x70\x02\x00\x09"),  # PUBCOMP, id not found
        (0x90, b"\x00\x09\x00\x00\x01\x02\x87", b"\x90\x06\x00\x09\x00\x01\x02\x80"),  # SUBACK
        (0xB0, b"\x00\x09\x00\x00\x11", b"\xb0\x02\x00\x09"),  # UNSUBACK
        (0xD0, b"", b"\xd0\x00"),  # PINGRESP
        (0xE0, b"\x8b\x00", None),  # DISCONNECT: none in 3.1.1
    ],
)
def test_broker_packets_in_their_311_form(first: int, body: bytes, out: bytes | None) -> None:
    assert downgrade_packet(first, body) == out


def _sub(broker: Mosquitto, port: int, topic: str, qos: int, count: int) -> subprocess.Popen[bytes]:
    client_id = f"sub311-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        ["mosquitto_sub", "-p", str(port), "-t", topic, "-C", str(count), "-V", "311",
         "-q", str(qos), "-i", client_id, "-N", "-W", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    wait_until(subscribed(broker, client_id), "mosquitto_sub -V 311 subscribed", 20)
    return proc


@pytest.mark.servers
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_chunked_messages_reach_mosquitto_sub_311_whole_through_the_proxy(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str], qos: int
) -> None:
    from client import Client, Route

    proxy = start_proxy(broker, gateway)
    try:
        topic = unique_topic("chunks311")
        sub = _sub(broker, proxy.port, topic, qos, count=3)
        chunked = os.urandom(2 * MiB + 5)
        pub = Client(broker.url, automatic_offload=False, discovery_wait=0)
        pub.connect()
        try:
            assert pub.publish(topic, chunked, qos=qos).route is Route.CHUNKED
        finally:
            pub.close()
        big = os.urandom(MiB)  # over the broker's limit: offloaded by the proxy
        for payload in (big, b"small"):  # from a 3.1.1 publisher through the proxy too
            subprocess.run(
                ["mosquitto_pub", "-p", str(proxy.port), "-t", topic, "-V", "311",
                 "-q", str(qos), "-s"],
                input=payload, check=True, timeout=60, capture_output=True,
            )  # fmt: skip
            offloaded = lambda: proxy.metric("offload_proxy_offloaded_total") == 1  # noqa: E731
            wait_until(offloaded, "big published (QoS 0: after mosquitto_pub left)", 60)
        out, err = sub.communicate(timeout=150)
        assert sub.returncode == 0, err.decode()
        assert out == chunked + big + b"small"  # byte-exact, whole, in order
        assert proxy.metric("offload_proxy_reassembled_total") == 1
        assert proxy.metric("offload_proxy_offloaded_total") == 1
        assert "protocol error" not in broker.log().lower()
    finally:
        proxy.stop()


@pytest.mark.servers
def test_a_311_client_with_the_upgrade_off_gets_the_chunks_as_before(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    from client import Client, Route

    proxy = start_proxy(broker, gateway, upgrade_v311=False)
    try:
        topic = unique_topic("chunks311-off")
        sub = _sub(broker, proxy.port, topic, 1, count=1)
        pub = Client(broker.url, automatic_offload=False, discovery_wait=0)
        pub.connect()
        try:
            assert pub.publish(topic, os.urandom(MiB), qos=1).route is Route.CHUNKED
        finally:
            pub.close()
        out, _ = sub.communicate(timeout=150)
        assert len(out) < MiB  # the first chunk alone: nothing marks it as one
        assert proxy.metric("offload_proxy_reassembled_total") == 0
    finally:
        proxy.stop()
