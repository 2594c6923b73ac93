"""Hostile `traceparent` / `tracestate` values, from HTTP clients and from publishers.

Through the running gateway and a subscribing `client.Client`, both tracing into an
in-memory exporter: a malformed, 10 KB or invalid-version value is no context (the request
or message starts its own trace), it never reaches a response header, a log line, a span
or a placeholder as it came, and it is never a 5xx.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import uuid
from collections.abc import Callable

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from client import Client, Message
from client.protocol import (
    Manifest,
    MessageId,
    Placeholder,
    PublishProperties,
    TraceContext,
    index_key,
)
from gateway.storage import open_store

from _gateway import GatewayServer
from _hostile import RawPublisher
from _proxy import ProxyServer
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers

VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
HOSTILE = [
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" + "-" + "x" * 10_000,  # 10 KB
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # invalid version
    "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  # uppercase
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # zero trace id
    "<script>alert(1)</script>",
    "%0d%0aSet-Cookie: x=1",
]
MARK = "0af7651916cd43dd8448eb211c80319c"  # the trace id a parser that accepted it would keep
OPENMETRICS_TYPE = b"application/openmetrics-text; version=1.0.0; charset=utf-8; escaping="


def memory_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def trace_ids(spans: tuple[ReadableSpan, ...]) -> set[str]:
    return {f"{s.context.trace_id:032x}" for s in spans if s.context is not None}


def _leaked(value: str, text: str) -> bool:
    return value in text or value[:60] in text


def test_a_hostile_traceparent_from_an_http_client_is_no_context(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    caplog: pytest.LogCaptureFixture,
) -> None:
    provider, exporter = memory_provider()
    gw = gateway_factory(broker, tracer_provider=provider)
    caplog.set_level(logging.DEBUG)
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        for value in HOSTILE:
            exporter.clear()
            message_id = uuid.uuid4()
            headers = {"traceparent": value, "tracestate": value}
            put = http.put(
                f"/msg/{message_id}", params={"topic": "t/h"}, content=b"x", headers=headers
            )
            assert put.status_code == 201, put.text
            # Never echoed: no trace header comes back, nor any header holding the value.
            assert all(not _leaked(value, v) for v in put.headers.values())
            assert "traceparent" not in put.headers
            spans = exporter.get_finished_spans()
            server = [s for s in spans if s.name == "PUT /msg/{message_id}"]
            assert len(server) == 1 and server[0].parent is None  # a trace of its own
            assert MARK not in trace_ids(spans)
            for span in spans:
                assert all(not _leaked(value, str(v)) for v in (span.attributes or {}).values())
            # The manifest keeps the gateway's own trace, well-formed.
            manifest = http.get(f"/msg/{message_id}", headers={"Accept": "application/json"})
            assert manifest.status_code == 200
            publish = http.post(
                "/publish/t/h", content=b"y", headers={**headers, "X-Offload-Qos": "0"}
            )
            assert publish.status_code in (201, 200), publish.text
            assert all(not _leaked(value, v) for v in publish.headers.values())
        # Two traceparent headers are no context either.
        two = http.put(
            f"/msg/{uuid.uuid4()}",
            params={"topic": "t/h"},
            content=b"x",
            headers=[("traceparent", VALID), ("traceparent", VALID)],
        )
        assert two.status_code == 201
        # OpenMetrics exemplars name only traces the gateway itself holds.
        metrics = httpx.get(gw.metrics_url, headers={"Accept": "application/openmetrics-text"})
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("application/openmetrics-text")
        assert "trace_id=" in metrics.text and MARK not in metrics.text
    for value in HOSTILE:
        assert not _leaked(value, caplog.text)
    provider.shutdown()


def test_a_valid_traceparent_is_continued_and_recorded_in_the_manifest(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    seaweed: SeaweedFS,
    bucket_name: str,
) -> None:
    provider, exporter = memory_provider()
    gw = gateway_factory(broker, tracer_provider=provider)
    message_id = uuid.uuid4()
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        put = http.put(
            f"/msg/{message_id}",
            params={"topic": "t/v"},
            content=b"x",
            headers={"traceparent": VALID},
        )
        assert put.status_code == 201
        metrics = httpx.get(gw.metrics_url, headers={"Accept": "application/openmetrics-text"})
    (server,) = [s for s in exporter.get_finished_spans() if s.name.startswith("PUT ")]
    assert f"{server.context.trace_id:032x}" == MARK
    assert server.parent is not None and f"{server.parent.span_id:016x}" == VALID.split("-")[2]
    store = open_store(
        seaweed.storage_url(bucket_name),
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
    )
    raw = store.get_bytes(index_key(MessageId.parse(str(message_id))))
    assert raw is not None
    manifest = Manifest.from_json(raw)
    assert manifest.trace_id == MARK  # what the Spark source's `trace_id` column reads
    assert (
        manifest.traceparent
        == TraceContext(server.context.trace_id, server.context.span_id).traceparent
    )
    # The exemplar of this request's latency observation names its trace.
    assert f'trace_id="{MARK}"' in metrics.text
    provider.shutdown()


def test_hostile_trace_properties_from_a_publisher_never_stop_a_subscriber(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
) -> None:
    provider, exporter = memory_provider()
    gw = gateway_factory(broker, tracer_provider=provider)
    topic = unique_topic("hostile-trace")
    payload = os.urandom(1000)
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        message_id = uuid.uuid4()
        stored = http.put(f"/msg/{message_id}", params={"topic": topic}, content=payload)
        assert stored.status_code == 201
    sha256 = hashlib.sha256(payload).hexdigest()
    ref = Placeholder(f"{gw.url}/msg/{message_id}", len(payload), sha256, message_id)
    publisher = RawPublisher(broker.url)
    with Client(broker.url, endpoint=gw.url, tracer_provider=provider) as sub:
        sub.subscribe(topic, 1)
        sent = 0
        for value in HOSTILE:
            exporter.clear()
            for pairs in (
                [("traceparent", value), ("tracestate", value)],
                [("traceparent", VALID), ("traceparent", VALID)],  # two: no context
            ):
                body, props = ref.encode(PublishProperties(user_properties=tuple(pairs)))
                assert props is not None
                publisher.publish(topic, body, user_properties=list(props.user_properties))
                publisher.publish(topic, b"direct", user_properties=pairs)
                sent += 2
                for _ in range(2):
                    got = sub.next_message(timeout=30)
                    assert isinstance(got, Message), got
                    assert got.trace_context is None
            # The fetch began a trace of its own, and the gateway's GET continued that one.
            spans = exporter.get_finished_spans()
            fetches = [s for s in spans if s.name == f"fetch {topic}"]
            assert fetches and all(s.parent is None for s in fetches)
            assert MARK not in trace_ids(spans)
        publisher.close()
    assert sent == 4 * len(HOSTILE)
    provider.shutdown()


def test_an_untraced_subscriber_fetches_with_the_publishers_context(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
) -> None:
    """Without spans of its own (`client.tracing.DISABLED`), a subscriber still hands the
    placeholder's context to the gateway: the trace goes on through a hop that records
    nothing."""
    import client.tracing

    provider, exporter = memory_provider()
    gw = gateway_factory(broker, tracer_provider=provider)
    topic = unique_topic("carried")
    with (
        Client(broker.url, endpoint=gw.url, tracer_provider=provider) as pub,
        Client(broker.url, endpoint=gw.url, tracer_provider=client.tracing.DISABLED) as sub,
    ):
        sub.subscribe(topic, 1)
        pub.publish(topic, os.urandom(300_000), qos=1)
        got = sub.next_message(timeout=30)
    assert isinstance(got, Message) and got.trace_context is not None
    spans = exporter.get_finished_spans()
    (publish,) = [s for s in spans if s.name == f"publish {topic}"]
    (get,) = [s for s in spans if s.name == "GET /msg/{message_id}/payload"]
    assert get.parent is not None and get.parent.span_id == publish.context.span_id
    assert got.trace_context == TraceContext(
        publish.context.trace_id, publish.context.span_id, got.trace_context.flags
    )
    provider.shutdown()


def test_the_gateways_own_placeholder_carries_its_publish_span(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
) -> None:
    """`POST /publish`: the placeholder the gateway publishes carries the context of its
    `publish` span, a child of the HTTP caller's; an uploader's own `traceparent` user
    property is kept instead."""
    import client.tracing

    provider, exporter = memory_provider()
    gw = gateway_factory(broker, tracer_provider=provider)
    topic = unique_topic("gateway-publish")
    with Client(broker.url, endpoint=gw.url, tracer_provider=client.tracing.DISABLED) as sub:
        sub.subscribe(topic, 1)
        with httpx.Client(base_url=gw.url, timeout=30) as http:
            sent = http.post(
                f"/publish/{topic}", content=b"x" * 1000, headers={"traceparent": VALID}
            )
            assert sent.status_code == 201, sent.text
            own = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
            kept = http.post(
                f"/publish/{topic}",
                content=b"y" * 1000,
                headers={"traceparent": VALID, "X-Offload-Property": f"traceparent:{own}"},
            )
            assert kept.status_code == 201, kept.text
        first, second = sub.next_message(timeout=30), sub.next_message(timeout=30)
    assert isinstance(first, Message) and isinstance(second, Message)
    (publish, _) = sorted(
        (s for s in exporter.get_finished_spans() if s.name == f"publish {topic}"),
        key=lambda s: s.start_time or 0,
    )
    assert f"{publish.context.trace_id:032x}" == MARK  # the caller's trace, continued
    assert first.trace_context is not None
    assert first.trace_context.span_id == publish.context.span_id
    assert second.trace_context is not None and second.trace_context.traceparent == own
    provider.shutdown()


SCRAPES = (b"text/plain; version=0.0.4; charset=utf-8", OPENMETRICS_TYPE + b"underscores")
HOSTILE_ACCEPT = [
    b"application/openmetrics-text; version=x",  # prometheus_client: TypeError (a 500)
    b"text/plain; version=garbage",
    b"application/openmetrics-text; version=1\n\n.0.0",  # was echoed into Content-Type
    b"application/openmetrics-text; version=99.0.0",
]


def test_a_scrapers_hostile_accept_header_gets_one_of_two_expositions(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto
) -> None:
    """`/metrics` of the gateway and of offload-proxy negotiate OpenMetrics (the exemplars)
    from `Accept`: whatever it says, the answer is 200 in one of two media types, and
    nothing of the header is written back."""
    from proxy import ProxySettings

    gw = gateway_factory(broker)
    proxy = ProxyServer(ProxySettings(broker=broker.url, port=0, metrics_port=0)).start()
    try:
        for accept in HOSTILE_ACCEPT:
            _one_of_two(_scrape(gw.settings.metrics_port, accept))
            _one_of_two(_scrape(proxy.proxy.metrics_port, accept))
    finally:
        proxy.stop()


def _one_of_two(head: bytes) -> None:
    assert head.startswith(b"HTTP/1.1 200 "), head
    types = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-type:")]
    assert len(types) == 1 and types[0].split(b":", 1)[1].strip() in SCRAPES, head


def _scrape(port: int, accept: bytes) -> bytes:
    """The head of the answer to `GET /metrics` with `accept` sent as it is."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: "
            + accept
            + b"\r\nConnection: close\r\n\r\n"
        )
        answer = b""
        while b"\r\n\r\n" not in answer and (piece := sock.recv(65536)):
            answer += piece
    return answer.split(b"\r\n\r\n", 1)[0]


def test_the_gateways_placeholder_keeps_to_the_brokers_limit(
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
    unique_topic: Callable[[str], str],
) -> None:
    """`POST /publish` with user properties near a 4 KiB broker's limit: the caller's
    context goes on the placeholder only where it still fits, and a placeholder over the
    limit is a 400 with nothing kept, where the broker dropped the gateway's connection
    (every placeholder on the way with it) and the caller got a 503."""
    from test_proxy import PahoPeer

    from client.mqtt._props import from_paho_properties
    from client.protocol import publish_packet_size

    limit = 4096
    small = mosquitto_factory(max_packet_size=limit)
    gw = gateway_factory(small)
    topic = unique_topic("near-limit")
    raw = PahoPeer(small.port)
    raw.subscribe(small, topic)

    def publish(pad: int) -> httpx.Response:
        headers = {"traceparent": VALID, "X-Offload-Property": "pad:" + "x" * pad}
        return http.post(f"/publish/{topic}", content=b"payload", headers=headers)

    try:
        with httpx.Client(base_url=gw.url, timeout=30) as http:
            assert publish(1000).status_code == 201
            (first,) = raw.wait(1)
            carried = from_paho_properties(first.properties)
            assert carried.user_property("traceparent") is not None  # room for it
            size = publish_packet_size(topic, len(first.payload), qos=1, properties=carried)
            # 30 bytes over the limit with the context (71 bytes), 41 under without it.
            pad = 1000 + limit - size + 30
            assert publish(pad).status_code == 201
            second = raw.wait(2)[1]
            names = [name for name, _ in second.properties.UserProperty]
            assert "pad" in names and "traceparent" not in names
            refused = publish(pad + 100)
            assert refused.status_code == 400, refused.text
            assert "over the broker's limit of 4096" in refused.json()["detail"]
            assert publish(10).status_code == 201  # at once: the link was never dropped
        assert len(raw.wait(3)) == 3
        assert "oversize packet" not in small.log()
    finally:
        raw.close()
