"""What `client.Client` puts on the wire for a trace, and which spans it makes (issue 46).

Against a real mosquitto (256 KiB limit), the library tracing into an in-memory exporter:
the context rides on the message itself (an ADR-23 message's first chunk only; a direct
PUBLISH with `trace_direct`), a publisher's own `traceparent` user property is kept as it is, and a
subscriber's receive continues the publisher's trace.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import paho.mqtt.client as mqtt
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from paho.mqtt.enums import CallbackAPIVersion

from client import Client, Message
from client.protocol import PublishProperties, TraceContext

from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

CUSTOM = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def traced() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


class Raw:
    """A plain paho subscriber that keeps every PUBLISH's user properties."""

    def __init__(self, broker: Mosquitto, topic: str) -> None:
        self.props: list[list[tuple[str, str]]] = []
        self.messages: list[mqtt.MQTTMessage] = []
        subscribed = threading.Event()
        self._paho = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self._paho.on_message = self._on_message
        self._paho.on_subscribe = lambda *args: subscribed.set()
        self._paho.connect("127.0.0.1", broker.port)
        self._paho.loop_start()
        self._paho.subscribe(topic, 1)
        assert subscribed.wait(10)

    def _on_message(self, client: object, userdata: object, msg: mqtt.MQTTMessage) -> None:
        self.messages.append(msg)
        self.props.append(list(getattr(msg.properties, "UserProperty", [])))

    def wait(self, count: int, timeout: float = 30) -> list[list[tuple[str, str]]]:
        deadline = time.monotonic() + timeout
        while len(self.props) < count:
            assert time.monotonic() < deadline, f"{len(self.props)} of {count} messages"
            time.sleep(0.05)
        return self.props

    def close(self) -> None:
        self._paho.loop_stop()
        self._paho.disconnect()


def test_a_direct_message_carries_the_callers_context_only_when_asked_and_no_span(
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """`trace_direct` (default false): a message sent as it is carries the caller's
    context only when asked (bench/RESULTS.md, "Issue 46": its cost), and never a span."""
    provider, exporter = traced
    tracer = provider.get_tracer("app")
    topic = unique_topic("direct")
    with (
        Client(broker.url, tracer_provider=provider) as plain,
        Client(broker.url, tracer_provider=provider, trace_direct=True) as pub,
        Client(broker.url) as sub,
    ):
        sub.subscribe(topic, 1)
        pub.publish(topic, b"untraced", qos=1)  # no caller span: nothing added
        with tracer.start_as_current_span("work") as work:
            plain.publish(topic, b"by default", qos=1)
            pub.publish(topic, b"traced", qos=1)
        got = [sub.next_message(timeout=10) for _ in range(3)]
    assert all(isinstance(m, Message) for m in got)
    untraced, by_default, traced_one = got
    assert isinstance(untraced, Message) and untraced.trace_context is None
    assert isinstance(by_default, Message) and by_default.payload == b"by default"
    assert by_default.trace_context is None and by_default.properties.user_properties == ()
    assert isinstance(traced_one, Message)
    ctx = traced_one.trace_context
    assert ctx is not None
    assert (ctx.trace_id, ctx.span_id) == (
        work.get_span_context().trace_id,
        work.get_span_context().span_id,
    )
    assert [s.name for s in exporter.get_finished_spans()] == ["work"]


def test_a_direct_message_the_context_would_push_over_the_limit_goes_without_it(
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """With `trace_direct`, a message that fits the broker only without the caller's
    context goes as it is without it: the context never changes a message's route."""
    from client.protocol import max_payload

    provider, _ = traced
    topic = unique_topic("direct-tight")
    size = max_payload(topic, qos=1, properties=None, limit=256 * 1024) - 30
    with (
        Client(broker.url, tracer_provider=provider, trace_direct=True) as pub,
        Client(broker.url) as sub,
    ):
        sub.subscribe(topic, 1)
        with provider.get_tracer("app").start_as_current_span("work"):
            result = pub.publish(topic, os.urandom(size), qos=1)
        got = sub.next_message(timeout=30)
    assert result.route == "direct"
    assert isinstance(got, Message) and got.size == size and got.trace_context is None


def test_a_chunked_message_carries_its_publish_spans_context_on_the_first_chunk(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced
    broker = mosquitto_factory(max_packet_size=65536)
    topic = unique_topic("chunked")
    raw = Raw(broker, topic)
    payload = os.urandom(200_000)  # four chunks of at most 64 KiB, no gateway
    try:
        with (
            Client(broker.url, tracer_provider=provider) as pub,
            Client(broker.url, tracer_provider=provider) as sub,
        ):
            sub.subscribe(topic, 1)
            result = pub.publish(topic, payload, qos=1)
            got = sub.next_message(timeout=30)
        chunks = raw.wait(result.packets)
    finally:
        raw.close()
    assert result.packets >= 4
    assert isinstance(got, Message) and got.payload == payload
    spans = {s.name: s for s in exporter.get_finished_spans()}
    publish, receive = spans[f"publish {topic}"], spans[f"receive {topic}"]
    carried = [TraceContext.from_pairs(p) for p in chunks]
    # The first chunk only (ADR 23 carries the original's properties on chunk 0).
    assert carried[0] is not None and carried[0].span_id == publish.context.span_id
    assert all(c is None for c in carried[1:])
    assert got.trace_context == carried[0]
    assert publish.attributes["offload.route"] == "chunked"
    # The subscriber's receive continues the publisher's trace, and links its creation.
    assert receive.parent is not None and receive.parent.span_id == publish.context.span_id
    assert [link.context.span_id for link in receive.links] == [publish.context.span_id]


def test_a_publishers_own_traceparent_is_kept_and_linked(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced
    broker = mosquitto_factory(max_packet_size=65536)
    topic = unique_topic("custom")
    props = PublishProperties(user_properties=(("traceparent", CUSTOM),))
    with Client(broker.url, tracer_provider=provider) as pub, Client(broker.url) as sub:
        sub.subscribe(topic, 1)
        pub.publish(topic, os.urandom(100_000), qos=1, properties=props)
        got = sub.next_message(timeout=30)
    assert isinstance(got, Message)
    assert got.properties.user_properties.count(("traceparent", CUSTOM)) == 1
    (publish,) = [s for s in exporter.get_finished_spans() if s.name == f"publish {topic}"]
    assert publish.kind.name == "CLIENT"  # not the creation context: the custom one is
    assert f"{publish.context.trace_id:032x}" == CUSTOM.split("-")[1]
    assert [f"{ln.context.span_id:016x}" for ln in publish.links] == [CUSTOM.split("-")[2]]


def test_a_placeholder_the_context_would_push_over_the_limit_goes_without_it(
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
    unique_topic: Callable[[str], str],
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """The publish span's context goes on the placeholder only where it still fits the
    broker (as offload-proxy and the gateway add theirs), never at the cost of the message."""
    from client.mqtt._props import from_paho_properties
    from client.protocol import publish_packet_size

    provider, exporter = traced
    limit = 4096
    small = mosquitto_factory(max_packet_size=limit)
    gw = gateway_factory(small)
    topic = unique_topic("tight")
    raw = Raw(small, topic)
    payload = os.urandom(8000)  # over the limit: offloaded

    def padded(pad: int) -> PublishProperties:
        return PublishProperties(user_properties=(("pad", "x" * pad),))

    try:
        with Client(small.url, endpoint=gw.url, tracer_provider=provider) as pub:
            pub.publish(topic, payload, qos=1, properties=padded(1000))
            (first,) = raw.wait(1)
            assert TraceContext.from_pairs(first) is not None  # room for it
            placeholder = raw.messages[0]
            carried = from_paho_properties(placeholder.properties)
            size = publish_packet_size(topic, len(placeholder.payload), qos=1, properties=carried)
            # 30 bytes over the limit with the context (71 bytes), 41 under without it.
            result = pub.publish(topic, payload, qos=1, properties=padded(1000 + limit - size + 30))
            second = raw.wait(2)[1]
    finally:
        raw.close()
    assert result.route == "offloaded"
    assert ("pad", "x" * (1000 + limit - size + 30)) in second
    assert TraceContext.from_pairs(second) is None
    assert len([s for s in exporter.get_finished_spans() if s.name == f"publish {topic}"]) == 2
