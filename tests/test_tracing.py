"""One trace from publisher to subscriber, as a collector receives it (issue 46).

Every process exports to a real OTLP/HTTP receiver (tests/_otlp.py, decoding
`opentelemetry-proto`'s ExportTraceServiceRequest) the standard way: the gateway as its own
`offload-gateway` process and the publishing `offload` CLI through `OTEL_*` variables, the
subscribing `client.Client` through the SDK provider it is given. Hostile `traceparent`
values from HTTP clients and publishers are in test_tracing_hostile.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from client import Client, Message

from _gateway import GatewayProcess
from _otlp import OtlpReceiver, ReceivedSpan
from _servers import Mosquitto, SeaweedFS, free_port, wait_for_port, wait_until

pytestmark = pytest.mark.servers

OFFLOAD = shutil.which("offload") or "offload"
ROOT = Path(__file__).resolve().parents[1]
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"


def exporting_provider(otlp: OtlpReceiver, service: str) -> TracerProvider:
    """An application's own SDK provider, exporting to the receiver."""
    provider = TracerProvider(resource=Resource({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=f"{otlp.endpoint}/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=100))
    return provider


def gateway_env(seaweed: SeaweedFS, bucket: str, broker: Mosquitto) -> dict[str, str]:
    return {
        "OFFLOAD_STORAGE_URL": seaweed.storage_url(bucket),
        "OFFLOAD_S3_ACCESS_KEY": seaweed.access_key,
        "OFFLOAD_S3_SECRET_KEY": seaweed.secret_key,
        "OFFLOAD_MQTT_URL": broker.url,
        "OFFLOAD_ALLOW_ANONYMOUS": "true",
        "OFFLOAD_SWEEP_INTERVAL": "0",
        "OFFLOAD_LOG_LEVEL": "WARNING",
    }


def cli_env(otlp: OtlpReceiver, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OFFLOAD_", "OTEL_"))}
    env["OFFLOAD_CONFIG"] = os.devnull
    return {**env, **otlp.environment("offload-cli"), **extra}


def one(spans: list[ReceivedSpan], service: str, name: str) -> ReceivedSpan:
    found = [s for s in spans if s.service == service and s.name == name]
    assert len(found) == 1, (service, name, [(s.service, s.name) for s in spans])
    return found[0]


def test_one_trace_covers_publish_upload_store_placeholder_and_fetch(
    seaweed: SeaweedFS,
    bucket_name: str,
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = unique_topic("traced")
    payload = os.urandom(300_000)  # over the broker's 256 KiB: offloaded
    source = tmp_path / "payload.bin"
    source.write_bytes(payload)
    with OtlpReceiver() as otlp:
        env = {**gateway_env(seaweed, bucket_name, broker), **otlp.environment("offload-gateway")}
        gw = GatewayProcess(env).start()
        subscriber = exporting_provider(otlp, "subscriber")
        try:
            with Client(broker.url, endpoint=gw.url, tracer_provider=subscriber) as sub:
                sub.subscribe(topic, 1)
                # The caller's trace reaches the CLI the way OpenTelemetry hands one to a
                # process: TRACEPARENT in its environment.
                published = subprocess.run(
                    [OFFLOAD, "publish", "--broker", broker.url, "--endpoint", gw.url,
                     "--topic", topic, "--file", str(source), "--qos", "1"],
                    capture_output=True, text=True, timeout=120,
                    env=cli_env(otlp, TRACEPARENT=CALLER),
                )  # fmt: skip
                assert published.returncode == 0, published.stderr
                received = sub.next_message(timeout=60)
            assert isinstance(received, Message), received
            assert received.payload == payload
            subscriber.force_flush()

            def complete(spans: list[ReceivedSpan]) -> bool:
                names = {(s.service, s.name) for s in spans}
                return {
                    ("offload-cli", f"publish {topic}"),
                    ("offload-gateway", "PUT /msg/{message_id}"),
                    ("offload-gateway", "GET /msg/{message_id}/payload"),
                    ("subscriber", f"fetch {topic}"),
                    ("subscriber", f"receive {topic}"),
                } <= names

            spans = otlp.wait_for(complete)
        finally:
            gw.kill()
            subscriber.shutdown()

    publish = one(spans, "offload-cli", f"publish {topic}")
    upload = one(spans, "offload-cli", f"upload {topic}")
    put = one(spans, "offload-gateway", "PUT /msg/{message_id}")
    write = one(spans, "offload-gateway", "store write")
    commit = one(spans, "offload-gateway", "store commit")
    fetch = one(spans, "subscriber", f"fetch {topic}")
    get = one(spans, "offload-gateway", "GET /msg/{message_id}/payload")
    read = one(spans, "offload-gateway", "store read")
    receive = one(spans, "subscriber", f"receive {topic}")

    # One trace: the caller's, continued by every hop.
    ours = [publish, upload, put, write, commit, fetch, get, read, receive]
    assert {s.trace_id for s in ours} == {CALLER_TRACE}
    # Who is whose child: the CLI's publish under its caller, the upload under the
    # publish, the gateway's request under the upload, the store's work under the request.
    assert publish.parent_span_id == CALLER.split("-")[2]
    assert (publish.kind, upload.kind, put.kind) == ("producer", "client", "server")
    assert upload.parent_span_id == publish.span_id
    assert put.parent_span_id == upload.span_id
    assert write.parent_span_id == put.span_id and commit.parent_span_id == put.span_id
    # The placeholder carried the publish span's context (the creation context): the
    # subscriber's fetch is its child, the gateway's GET and store read the fetch's.
    creation = received.trace_context
    assert creation is not None and creation.span_id_hex == publish.span_id
    assert fetch.parent_span_id == publish.span_id
    assert get.parent_span_id == fetch.span_id and read.parent_span_id == get.span_id
    assert receive.links == ((CALLER_TRACE, publish.span_id),)

    message_id = received.message_id
    assert publish.attributes["messaging.system"] == "mqtt"
    assert publish.attributes["messaging.destination.name"] == topic
    assert publish.attributes["messaging.message.id"] == message_id
    assert publish.attributes["messaging.message.body.size"] == len(payload)
    assert fetch.attributes["messaging.message.id"] == message_id
    assert put.attributes["http.response.status_code"] == 201
    # What a span holds is metadata: no payload byte run, no password.
    sample = payload[:64].hex()
    for span in spans:
        for value in span.attributes.values():
            assert sample not in str(value) and "secret" not in str(value)


def _mosquitto_sub(broker: Mosquitto, port: int, topic: str) -> subprocess.Popen[bytes]:
    """`mosquitto_sub -C 1` through the proxy, printing the user properties, then the
    payload's length; returned once the broker has its subscription."""
    client_id = f"sub-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        ["mosquitto_sub", "-p", str(port), "-t", topic, "-C", "1", "-V", "5", "-q", "1",
         "-i", client_id, "-F", "%P|%l", "-W", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    wait_until(lambda: f"Sending SUBACK to {client_id}" in broker.log(), "subscribed", 20, proc)
    return proc


def test_through_the_proxy_a_devices_traceparent_reaches_the_subscriber_and_the_gateway(
    seaweed: SeaweedFS,
    bucket_name: str,
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    continued, started = unique_topic("device"), unique_topic("untraced")
    source = tmp_path / "payload.bin"
    source.write_bytes(os.urandom(300_000))  # over the broker's 256 KiB: offloaded
    port, metrics_port = free_port(), free_port()
    with OtlpReceiver() as otlp:
        env = {**gateway_env(seaweed, bucket_name, broker), **otlp.environment("offload-gateway")}
        gw = GatewayProcess(env).start()
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("OFFLOAD_", "OTEL_"))}
        proxy = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "--broker", broker.url, "--port", str(port),
             "--endpoint", gw.url, "--metrics-port", str(metrics_port)],
            env={**environ, "PYTHONPATH": str(ROOT), **otlp.environment("offload-proxy")},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT,
        )  # fmt: skip
        try:
            wait_for_port(port, 30, proxy)
            got = {}
            for topic, device in (
                (continued, ["-D", "publish", "user-property", "traceparent", CALLER]),
                (started, []),
            ):
                sub = _mosquitto_sub(broker, port, topic)
                pub = subprocess.run(
                    ["mosquitto_pub", "-p", str(port), "-t", topic, "-V", "5", "-q", "1",
                     "-f", str(source), *device],
                    capture_output=True, timeout=120,
                )  # fmt: skip
                assert pub.returncode == 0, pub.stderr
                out, err = sub.communicate(timeout=150)
                assert sub.returncode == 0, err
                got[topic] = out.decode().strip()

            def complete(spans: list[ReceivedSpan]) -> bool:
                names = {(s.service, s.name) for s in spans}
                wanted = {("offload-proxy", f"{verb} {t}") for verb in ("publish", "fetch")
                          for t in (continued, started)}  # fmt: skip
                return (
                    wanted <= names
                    and sum(s.name == "GET /msg/{message_id}/payload" for s in spans) >= 2
                )

            spans = otlp.wait_for(complete)
            openmetrics = httpx.get(
                f"http://127.0.0.1:{metrics_port}/metrics",
                headers={"Accept": "application/openmetrics-text; version=1.0.0"},
            ).text
        finally:
            proxy.terminate()
            proxy.wait(30)
            gw.kill()

    # The device's context: kept on the placeholder as it came, so mosquitto_sub (served the
    # payload by the proxy) gets the device's own traceparent user property.
    props, length = got[continued].rsplit("|", 1)
    assert int(length) == 300_000
    assert f"traceparent:{CALLER}" in props
    publish = one(spans, "offload-proxy", f"publish {continued}")
    fetch = one(spans, "offload-proxy", f"fetch {continued}")
    assert publish.trace_id == CALLER_TRACE and publish.kind == "client"
    assert publish.parent_span_id == CALLER.split("-")[2]
    assert publish.links == ((CALLER_TRACE, CALLER.split("-")[2]),)
    puts = [s for s in spans if s.name == "PUT /msg/{message_id}" and s.trace_id == CALLER_TRACE]
    assert [p.parent_span_id for p in puts] == [publish.span_id]  # the gateway's, continued
    assert fetch.trace_id == CALLER_TRACE and fetch.parent_span_id == CALLER.split("-")[2]
    gets = [s for s in spans if s.name == "GET /msg/{message_id}/payload"]
    assert [g.parent_span_id for g in gets if g.trace_id == CALLER_TRACE] == [fetch.span_id]

    # No context from the device: the proxy's span begins the trace, and its context is the
    # one the placeholder carries to the subscriber.
    props, length = got[started].rsplit("|", 1)
    first = one(spans, "offload-proxy", f"publish {started}")
    assert int(length) == 300_000 and first.kind == "producer" and first.parent_span_id == ""
    assert f"traceparent:00-{first.trace_id}-{first.span_id}-0" in props  # sampled (, random)
    resolved = one(spans, "offload-proxy", f"fetch {started}")
    assert resolved.trace_id == first.trace_id and resolved.parent_span_id == first.span_id

    # The latency histograms point at the traces (OpenMetrics exemplars): a bucket keeps
    # its latest observation's, so the last message's trace is there whatever the timings
    # (the device's, observed first, only when its observation fell in another bucket).
    for name in ("offload_proxy_offload_seconds_bucket", "offload_proxy_fetch_seconds_bucket"):
        assert any(
            line.startswith(name) and f'trace_id="{first.trace_id}"' in line
            for line in openmetrics.splitlines()
        ), openmetrics


def test_offload_fetch_whole_and_by_range_continues_the_callers_trace(
    seaweed: SeaweedFS, bucket_name: str, broker: Mosquitto, tmp_path: Path
) -> None:
    """`offload fetch URL` and `offload fetch URL --range`, each under its caller's
    TRACEPARENT: the CLI's `fetch` span is the caller's child, and the gateway's GET of the
    payload the fetch span's (a range fetch sent no context before: its GET began a trace
    of its own)."""
    payload = os.urandom(200_000)
    callers = {
        "whole": ("00-" + "1" * 32 + "-" + "a" * 16 + "-01", []),
        "range": ("00-" + "2" * 32 + "-" + "b" * 16 + "-01", ["--range", "100-199"]),
    }
    with OtlpReceiver() as otlp:
        env = {**gateway_env(seaweed, bucket_name, broker), **otlp.environment("offload-gateway")}
        gw = GatewayProcess(env).start()
        try:
            stored = httpx.post(f"{gw.url}/publish/traced/fetch", content=payload, timeout=30)
            assert stored.status_code == 201, stored.text
            url = stored.json()["url"]
            for name, (caller, extra) in callers.items():
                out = tmp_path / name
                fetched = subprocess.run(
                    [OFFLOAD, "fetch", url, "-o", str(out), *extra],
                    capture_output=True, text=True, timeout=60,
                    env=cli_env(otlp, TRACEPARENT=caller),
                )  # fmt: skip
                assert fetched.returncode == 0, fetched.stderr
                assert out.read_bytes() == (payload[100:200] if extra else payload)

            def complete(spans: list[ReceivedSpan]) -> bool:
                gets = [s for s in spans if s.name == "GET /msg/{message_id}/payload"]
                fetches = [s for s in spans if (s.service, s.name) == ("offload-cli", "fetch")]
                return len(gets) >= 2 and len(fetches) == 2

            spans = otlp.wait_for(complete)
        finally:
            gw.kill()

    for name, (caller, _) in callers.items():
        trace_id, parent = caller.split("-")[1:3]
        mine = [s for s in spans if s.trace_id == trace_id]
        fetch = one(mine, "offload-cli", "fetch")
        assert fetch.parent_span_id == parent, name
        gets = [s for s in mine if s.name == "GET /msg/{message_id}/payload"]
        assert gets and all(g.parent_span_id == fetch.span_id for g in gets), name


def test_client_fetch_range_continues_the_messages_trace(
    seaweed: SeaweedFS,
    bucket_name: str,
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
) -> None:
    """`Client.fetch_range` on a placeholder handed over as it is (`fetch_external=False`)
    is a `fetch {topic}` span, a child of the message's creation context (no span of the
    caller's is current), and the gateway's GET of the range is the fetch span's child."""
    topic = unique_topic("traced-range")
    payload = os.urandom(300_000)  # over the broker's 256 KiB: offloaded
    with OtlpReceiver() as otlp:
        env = {**gateway_env(seaweed, bucket_name, broker), **otlp.environment("offload-gateway")}
        gw = GatewayProcess(env).start()
        publisher = exporting_provider(otlp, "publisher")
        subscriber = exporting_provider(otlp, "subscriber")
        try:
            with Client(
                broker.url, endpoint=gw.url, fetch_external=False, tracer_provider=subscriber
            ) as sub:
                sub.subscribe(topic, 1)
                with Client(broker.url, endpoint=gw.url, tracer_provider=publisher) as pub:
                    pub.publish(topic, payload, qos=1)
                received = sub.next_message(timeout=60)
                assert isinstance(received, Message), received
                assert sub.fetch_range(received, 1000, 2000) == payload[1000:2000]
            publisher.force_flush()
            subscriber.force_flush()

            def complete(spans: list[ReceivedSpan]) -> bool:
                names = {(s.service, s.name) for s in spans}
                return {
                    ("publisher", f"publish {topic}"),
                    ("subscriber", f"fetch {topic}"),
                    ("offload-gateway", "GET /msg/{message_id}/payload"),
                } <= names

            spans = otlp.wait_for(complete)
        finally:
            gw.kill()
            publisher.shutdown()
            subscriber.shutdown()

    publish = one(spans, "publisher", f"publish {topic}")
    fetch = one(spans, "subscriber", f"fetch {topic}")
    assert (fetch.trace_id, fetch.parent_span_id) == (publish.trace_id, publish.span_id)
    message_id = publish.attributes["messaging.message.id"]
    assert fetch.attributes["messaging.message.id"] == message_id
    gets = [s for s in spans if s.name == "GET /msg/{message_id}/payload"]
    assert gets and all(g.parent_span_id == fetch.span_id for g in gets)
