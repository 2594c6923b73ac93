"""Benchmark: what tracing costs a message, end to end (issue 46).

Three ways of running the same publisher and subscriber (`client.Client`, one process,
QoS 1), each block in a fresh process, alternating (absent, off, on, absent, ...; each
round begins one mode later, so that no mode always runs first):

* **absent**: OpenTelemetry cannot be imported (`sys.modules["opentelemetry"] = None`
  before the library loads: what a venv without the `otel` extra sees); the library's
  seam is the no-op;
* **off**: OpenTelemetry installed, no SDK provider set (an application that does not
  trace): the library makes its spans on the API's no-op tracer;
* **on**: an SDK `TracerProvider` sampling everything (the SDK's default sampler), a
  `BatchSpanProcessor` and the OTLP/HTTP exporter sending every span to a local receiver
  (tests/_otlp.py, which decodes each export as a collector would): spans are built,
  batched, encoded and sent during the measurement;
* **app** (caller-span row only): as **on**, with the library's tracing switched off
  (`tracer_provider=client.tracing.DISABLED`): the application's own span and its export,
  without the library's part;
* **ctx** (caller-span row only): as **on**, with `trace_direct=True`: each 1 KB PUBLISH
  carries the caller's context as a `traceparent` user property (off by default);
* **prop** (caller-span row only): as **app**, each PUBLISH with the same `traceparent`
  user property set by the application itself: what one user property costs through paho
  (packed by the publisher, unpacked by the subscriber) and the broker, tracing aside;
* **prop-paho** (caller-span row only): as **prop**, the properties packed by paho's own
  `Properties` instead of the library's encoder (client/mqtt/_props.py `PackedProperties`):
  what that encoder saves.

The gateway runs as its own process per mode (`offload-gateway`); for **on** it exports
too, configured by `OTEL_EXPORTER_OTLP_ENDPOINT`. FastAPI itself imports
opentelemetry-api, so the gateway's **absent** is its **off** (no `OTEL_*`: the gateway
imports nothing of OpenTelemetry for itself).

Rows (ratios against **off**, in the same run, medians of the blocks):

* 1 KB messages, published and received: a message that fits goes to the broker as it
  is, with no span and no context of the library's own unless the caller is in a span;
* 1 KB messages each published inside a caller's span (the application traces its own
  work; the library adds nothing to a message sent as it is unless `trace_direct`, **ctx**);
* 64 MiB messages offloaded through the gateway and fetched by the subscriber (seconds).

    python bench/tracing.py                        # 10 blocks x 2000 small, 3 x 64 MiB
    python bench/tracing.py --blocks 3 --messages 1000 --large 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import (  # noqa: E402
    MiB,
    emit,
    gateway_process,
    make_bucket,
    row,
)

from _otlp import OtlpReceiver  # noqa: E402
from _servers import Mosquitto, SeaweedFS  # noqa: E402

MODES = ("absent", "off", "on")
#: Only for the caller-span row: the SDK on for the application's own spans, the library's
#: tracing DISABLED: what the application's tracing costs without the library's part.
APP_ONLY = "app"
#: Only for the caller-span row: as "on", with `trace_direct` (the context on every PUBLISH).
CONTEXT = "ctx"
#: Only for the caller-span row: as "app", each PUBLISH with a `traceparent` user property
#: of the application's own.
PROPERTY = "prop"
#: As "prop", with paho's own `Properties` packing them (the library's encoder's baseline).
PAHO_PACKED = "prop-paho"
IN_SPAN_MODES = (*MODES, APP_ONLY, CONTEXT, PROPERTY, PAHO_PACKED)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


# -- the worker: one mode, one block --------------------------------------------------------


def _worker(args: argparse.Namespace) -> None:
    if args.mode == "absent":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]
    sys.path.insert(0, str(HERE.parent))
    provider = None
    caller = None
    if args.mode in ("on", APP_ONLY, CONTEXT, PROPERTY, PAHO_PACKED):
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=Resource({"service.name": "bench"}))
        exporter = OTLPSpanExporter(endpoint=f"{args.otlp}/v1/traces")
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)  # the application's own: the library uses it
    if args.mode != "absent":
        from opentelemetry import trace

        caller = trace.get_tracer("bench-app")

    from client import Client, Message, PublishProperties
    from client.tracing import DISABLED

    library: dict[str, object] = {}
    if args.mode in (APP_ONLY, PROPERTY, PAHO_PACKED):
        library["tracer_provider"] = DISABLED
    if args.mode == CONTEXT:
        library["trace_direct"] = True
    own = None
    if args.mode in (PROPERTY, PAHO_PACKED):
        own = PublishProperties(user_properties=(("traceparent", TRACEPARENT),))
    if args.mode == PAHO_PACKED:
        _pack_with_paho()
    topic = f"bench/trace/{uuid.uuid4().hex[:8]}"
    payload = os.urandom(args.size)
    result: dict[str, float] = {}
    with (
        Client(args.broker, endpoint=args.endpoint, **library) as pub,  # type: ignore[arg-type]
        Client(args.broker, endpoint=args.endpoint, **library) as sub,  # type: ignore[arg-type]
    ):
        sub.subscribe(topic, 1)

        def send(n: int, in_span: bool) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                if in_span and caller is not None:
                    with caller.start_as_current_span("work"):
                        pub.publish(topic, payload, qos=1, properties=own)
                else:
                    pub.publish(topic, payload, qos=1)
            got = 0
            while got < n:
                item = sub.next_message(timeout=120)
                assert isinstance(item, Message), item
                got += 1
            return time.perf_counter() - t0

        if args.size <= MiB:
            send(100, args.in_span)  # warm-up
            result["rate"] = args.messages / send(args.messages, args.in_span)
        else:
            send(1, False)  # warm-up: connections, the gateway's part buffers
            seconds = [send(1, False) for _ in range(args.messages)]
            result["seconds"] = statistics.median(seconds)
    if provider is not None:
        provider.shutdown()
    print("WORKER " + json.dumps(result), flush=True)


def _pack_with_paho() -> None:
    """The properties of a PUBLISH built and packed by paho's own `Properties` (how the
    library packed them before client/mqtt/_props.py's `PackedProperties`)."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from client.mqtt import _paho_publishes, _props

    def paho_packed(props: Any, packet: int = PacketTypes.PUBLISH) -> Any:
        if props is None or props == type(props)():
            return None
        out = Properties(packet)  # type: ignore[no-untyped-call]
        for name, value in _props._attributes(props).items():
            setattr(out, name, value)
        return out

    _paho_publishes.to_paho_properties = paho_packed  # type: ignore[assignment]


def _block(
    mode: str, *, size: int, messages: int, in_span: bool, urls: dict[str, str]
) -> dict[str, float]:
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--worker", mode,
        "--broker", urls["broker"], "--endpoint", urls[mode], "--otlp", urls["otlp"],
        "--size", str(size), "--messages", str(messages),
    ]  # fmt: skip
    if in_span:
        cmd.append("--in-span")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OFFLOAD_", "OTEL_"))}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} block failed: {done.stderr[-2000:]}")
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("WORKER ")][-1]
    return dict(json.loads(line[len("WORKER ") :]))


def _rotated(modes: tuple[str, ...], turn: int) -> tuple[str, ...]:
    """`modes` beginning `turn` places later: a mode's place in the order is no bias."""
    start = turn % len(modes)
    return modes[start:] + modes[:start]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=10, help="blocks per mode (small messages)")
    parser.add_argument(
        "--messages",
        type=int,
        default=2000,
        help="small messages per block (published before they are read: far more may outrun "
        "mosquitto's queue of 1000 per subscriber)",
    )
    parser.add_argument("--large", type=int, default=3, help="64 MiB messages per mode")
    parser.add_argument("--worker", choices=IN_SPAN_MODES)
    parser.add_argument("--broker")
    parser.add_argument("--endpoint")
    parser.add_argument("--otlp")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--in-span", action="store_true")
    args = parser.parse_args()
    if args.worker:
        args.mode = args.worker
        _worker(args)
        return

    bucket = f"trace-{uuid.uuid4().hex[:8]}"
    with ExitStack() as stack:
        seaweed = SeaweedFS().start()
        stack.callback(seaweed.close)
        make_bucket(seaweed, bucket)
        broker = Mosquitto(max_packet_size=262144, extra_config="set_tcp_nodelay true").start()
        stack.callback(broker.close)
        otlp = stack.enter_context(OtlpReceiver())
        urls = {"broker": broker.url, "otlp": otlp.endpoint}
        for mode in ("off", "on"):
            extra = otlp.environment("offload-gateway") if mode == "on" else {}
            gw = stack.enter_context(gateway_process(seaweed, bucket, extra_env=extra))
            urls[mode] = gw.url
        urls["absent"] = urls["off"]  # FastAPI imports opentelemetry-api: see the docstring
        for mode in (APP_ONLY, CONTEXT, PROPERTY, PAHO_PACKED):
            urls[mode] = urls["on"]

        small: dict[tuple[str, bool], list[float]] = {}
        for turn in range(args.blocks):
            for in_span in (False, True):
                for mode in _rotated(IN_SPAN_MODES if in_span else MODES, turn):
                    rate = _block(
                        mode, size=1024, messages=args.messages, in_span=in_span, urls=urls
                    )
                    small.setdefault((mode, in_span), []).append(rate["rate"])
        large: dict[str, list[float]] = {m: [] for m in MODES}
        for turn in range(args.large):
            for mode in _rotated(MODES, turn):
                took = _block(mode, size=64 * MiB, messages=1, in_span=False, urls=urls)
                large[mode].append(took["seconds"])
        spans = len(otlp.snapshot())

    rows = []
    rate = {key: statistics.median(values) for key, values in small.items()}
    comparisons = [
        (False, "absent", "off", "info"),
        (False, "on", "off", ">= 0.95"),
        (True, "absent", "off", "info"),
        (True, "on", "off", "info"),
        (True, "on", APP_ONLY, ">= 0.95"),
        (True, CONTEXT, APP_ONLY, "info"),
        (True, PROPERTY, APP_ONLY, "info"),
        (True, PROPERTY, PAHO_PACKED, "info"),
    ]
    for in_span, mode, base, target in comparisons:
        label = "1 KB QoS 1 sent and received" + (", each in a caller span" if in_span else "")
        got, ref = rate[(mode, in_span)], rate[(base, in_span)]
        print(f"{label}: {mode} {got:.0f} msg/s, {base} {ref:.0f} msg/s, ratio {got / ref:.3f}")
        limit = 0.95 if target != "info" else 0.0
        rows.append(
            row("tracing", f"{label}, {mode} / {base}", ref, got, "msg/s", target,
                higher_is_better=True, limit=limit)
        )  # fmt: skip
        if target == "info":
            rows[-1]["met"] = None
    off_large = statistics.median(large["off"])
    for mode in ("absent", "on"):
        got = statistics.median(large[mode])
        ratio = got / off_large
        print(f"64 MiB end to end: {mode} {got:.2f} s, off {off_large:.2f} s, ratio {ratio:.3f}")
        rows.append(
            row("tracing", f"64 MiB offloaded end to end, {mode} / off", off_large, got, "s",
                "info", higher_is_better=False, limit=0.0)
        )  # fmt: skip
        rows[-1]["met"] = None
    print(f"spans the receiver decoded: {spans}")
    emit(rows)


if __name__ == "__main__":
    main()
