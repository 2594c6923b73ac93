"""offload-proxy's trace context where its structure leaves a choice (issue 46): a
placeholder the context would push over the broker's limit, a payload the proxy decodes for
a subscriber, and a Will stored after the broker's CONNACK. The proxy and the gateway each
trace into one in-memory exporter (the gateway's view shows what the proxy's requests
carried); the OTLP end-to-end path is tests/test_tracing.py's."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from test_proxy import MiB, PahoPeer
from test_proxy_broadcast import publish
from test_proxy_hostile import _packet, _read, _text, dial
from test_tracing_hostile import MARK, VALID, memory_provider

from client import Client
from client.protocol import MessageId, PublishProperties

from _fleet import Fleet
from _gateway import GatewayServer
from _proxy import ProxyServer
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers

SMALL = 4096  # the broker's limit in the placeholder and Will tests
VALID_SPAN = VALID.split("-")[2]


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, Any]]:
    provider, exporter = memory_provider()
    yield provider, exporter
    provider.shutdown()


def _proxy(
    broker: Mosquitto, gateway: GatewayServer, provider: TracerProvider, **settings: Any
) -> ProxyServer:
    from proxy import ProxySettings

    values = {"broker": broker.url, "port": 0, "endpoint": gateway.url, **settings}
    return ProxyServer(ProxySettings(**values), tracer_provider=provider).start()


def _named(exporter: Any, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _user_property(name: str, value: str) -> bytes:
    return b"\x26" + _text(name) + _text(value)


def _properties(*props: bytes) -> bytes:
    body = b"".join(props)
    assert len(body) < 128  # its length in one varint byte
    return bytes([len(body)]) + body


def _v5_connect(client_id: str, will: bytes = b"") -> bytes:
    """An MQTT 5 CONNECT (clean start, keep-alive 30), with `will` (flags 0x0C) if given:
    its properties, topic and payload as encoded."""
    flags = 0x02 | (0x0C if will else 0)
    body = _text("MQTT") + bytes([5, flags]) + (30).to_bytes(2, "big") + b"\x00"
    return _packet(0x10, body + _text(client_id) + will)


def _publish_body(topic: str, pad: int, payload: bytes) -> bytes:
    """A QoS 1 PUBLISH's body (packet id 1) with one user property of `pad` characters."""
    props = _user_property("pad", "x" * pad)
    length = len(props)
    varint = bytes([length & 0x7F | 0x80, length >> 7]) if length >= 128 else bytes([length])
    return _text(topic) + b"\x00\x01" + varint + props + payload


def _pad_just_under(endpoint: str, topic: str, payload: bytes, limit: int) -> int:
    """A padding that leaves the proxy's placeholder 10 bytes under `limit`, found with the
    proxy's own encoder (its URL, SHA-256 and id are of fixed length)."""
    from proxy.protocol import Stored, placeholder_packet, publish_header

    def size(pad: int) -> int:
        header = publish_header(_publish_body(topic, pad, payload), qos=1, v5=True)
        assert header is not None
        probe = Stored(f"{endpoint}/msg/{MessageId.new()}", len(payload), "0" * 64, MessageId.new())
        return len(placeholder_packet(0x32, header, probe, v5=True))

    pad = 200
    while size(pad + 1) <= limit - 10:
        pad += 1
    assert size(pad) > limit - 60  # a context (traceparent alone: 71 bytes) no longer fits
    return pad


def test_a_placeholder_the_context_would_push_over_the_limit_goes_without_it(
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
    unique_topic: Callable[[str], str],
    traced: tuple[TracerProvider, Any],
) -> None:
    provider, exporter = traced
    small = mosquitto_factory(max_packet_size=SMALL)
    gw = gateway_factory(small)
    server = _proxy(small, gw, provider, broker_max_packet_size=SMALL)
    topic = unique_topic("tight")
    payload = os.urandom(8000)  # over the limit: offloaded
    pad = _pad_just_under(gw.url, topic, payload, SMALL)
    direct = PahoPeer(small.port)
    try:
        direct.subscribe(small, topic)
        device = dial(server.port)
        device.sendall(_v5_connect("tight-device"))
        assert _read(device)[0] == 0x20
        device.sendall(_packet(0x32, _publish_body(topic, pad, payload)))
        first, puback = _read(device)
        assert first == 0x40 and puback[:2] == b"\x00\x01"
        assert puback[2:3] in (b"", b"\x00"), puback  # success, not 0x83 (over the limit)
        (placeholder,) = direct.wait(1)
        names = [name for name, _ in placeholder.properties.UserProperty]
        assert "pad" in names and "traceparent" not in names
        assert json.loads(placeholder.payload)["size"] == len(payload)
        # The proxy's span was made all the same; only the placeholder goes without it.
        (span,) = _named(exporter, f"publish {topic}")
        assert span.parent is None
        device.close()
    finally:
        direct.close()
        server.stop()


def test_a_decoded_payloads_fetch_continues_the_placeholders_trace(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
    traced: tuple[TracerProvider, Any],
) -> None:
    provider, exporter = traced
    gw = gateway_factory(broker, tracer_provider=provider)
    server = _proxy(broker, gw, provider)
    topic = unique_topic("decoded")
    payload = os.urandom(200_000).hex().encode()  # zstd halves it: still offloaded
    sub = PahoPeer(server.port)
    try:
        sub.subscribe(broker, topic)
        with Client(broker.url, endpoint=gw.url, compress=True, tracer_provider=provider) as pub:
            pub.publish(
                topic,
                payload,
                qos=1,
                properties=PublishProperties(user_properties=(("traceparent", VALID),)),
            )
        (received,) = sub.wait(1)
        assert received.payload == payload  # decoded by the proxy (proxy/_unseal.py)
        assert server.metric("offload_proxy_resolved_total") == 1
        wait_until(lambda: _named(exporter, f"fetch {topic}"), "the proxy's fetch span", 10)
    finally:
        sub.close()
        server.stop()
    # The proxy's fetch is a child of the placeholder's creation context (the publisher's
    # own traceparent), and its GET carried the fetch's context to the gateway.
    (fetch,) = _named(exporter, f"fetch {topic}")
    assert f"{fetch.context.trace_id:032x}" == MARK
    assert fetch.parent is not None and f"{fetch.parent.span_id:016x}" == VALID_SPAN
    assert fetch.attributes is not None and fetch.attributes["messaging.destination.name"] == topic
    gets = [
        s
        for s in _named(exporter, "GET /msg/{message_id}/payload")
        if s.parent is not None and s.parent.span_id == fetch.context.span_id
    ]
    assert len(gets) == 1 and f"{gets[0].context.trace_id:032x}" == MARK
    histogram = "offload_proxy_fetch_seconds_count"
    assert server.metric(histogram) == 1  # observed, as a plain payload's fetch is


def test_a_broadcasts_one_fetch_carries_the_trace_of_the_device_that_started_it(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
    traced: tuple[TracerProvider, Any],
) -> None:
    """Three devices get one placeholder: each has its own fetch span, a child of the
    placeholder's creation context, with its own HEAD at the gateway under it; the one GET
    that feeds them all (proxy/_flights.py) is under the fetch span of the device that
    started it, and the others' have none (docs/tracing.md)."""
    provider, exporter = traced
    gw = gateway_factory(broker, tracer_provider=provider)
    server = _proxy(broker, gw, provider)
    topic = unique_topic("broadcast")
    payload = os.urandom(MiB)  # over the broker's 256 KiB: offloaded
    payload_route = "/msg/{message_id}/payload"
    try:
        fleet = Fleet(server.port, topic, 3, payload, first_address=220).start()
        publish(server.port, topic, payload)
        assert all(r.exact and r.done for r in fleet.results())
        assert server.metric("offload_proxy_fetches_joined_total") == 2  # one fetch for all
        wait_until(
            lambda: (
                len(_named(exporter, f"fetch {topic}")) == 3
                and _named(exporter, f"GET {payload_route}")
            ),
            "the fetch spans",
            10,
        )
    finally:
        server.stop()
    (made,) = _named(exporter, f"publish {topic}")
    fetches = _named(exporter, f"fetch {topic}")
    assert {(f.context.trace_id, f.parent.span_id if f.parent else 0) for f in fetches} == {
        (made.context.trace_id, made.context.span_id)
    }

    def under(name: str, parent: ReadableSpan) -> int:
        return sum(
            s.parent is not None and s.parent.span_id == parent.context.span_id
            for s in _named(exporter, name)
        )

    assert [under(f"HEAD {payload_route}", f) for f in fetches] == [1, 1, 1]
    assert sorted(under(f"GET {payload_route}", f) for f in fetches) == [0, 0, 1]
    assert len(_named(exporter, f"GET {payload_route}")) == 1


def test_a_wills_own_traceparent_goes_with_its_upload_after_the_connack(
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
    unique_topic: Callable[[str], str],
    traced: tuple[TracerProvider, Any],
) -> None:
    provider, exporter = traced
    small = mosquitto_factory(max_packet_size=SMALL)
    gw = gateway_factory(small, tracer_provider=provider)
    server = _proxy(small, gw, provider, broker_max_packet_size=SMALL)
    topic = unique_topic("will")
    direct = PahoPeer(small.port)
    try:
        direct.subscribe(small, topic)
        props = _properties(_user_property("traceparent", VALID))
        will = props + _text(topic) + _text(os.urandom(8000))  # over the limit: stored
        device = dial(server.port)
        device.sendall(_v5_connect("will-device", will))
        first, connack = _read(device)
        assert first == 0x20 and connack[1] == 0x00, connack
        # Stored before the client's CONNACK: the gateway's request continued the Will's
        # own context; the proxy made no span of its own for it.
        (put,) = _named(exporter, "PUT /msg/{message_id}")
        assert f"{put.context.trace_id:032x}" == MARK
        assert put.parent is not None and f"{put.parent.span_id:016x}" == VALID_SPAN
        assert not _named(exporter, f"publish {topic}")
        device.shutdown(socket.SHUT_RDWR)  # no DISCONNECT: the broker publishes the Will
        device.close()
        (placeholder,) = direct.wait(1)
        assert ("traceparent", VALID) in placeholder.properties.UserProperty  # kept as sent
    finally:
        direct.close()
        server.stop()
