"""Benchmark: latency of small messages sent in bursts, `Client` versus plain paho.

A telemetry device often sends a few readings at once. paho leaves Nagle's algorithm on, so
a small PUBLISH written while the one before it is still unacknowledged waits for the
broker's delayed ACK; the `Client`'s connection has TCP_NODELAY. Both publish QoS 0 to the
same local mosquitto (`set_tcp_nodelay true`, as in the other benchmarks) in the same run,
a freshly connected publisher per block; a plain paho subscriber on its own connection
stamps each message's latency (receive time minus the send time in the payload). Each block
sends `--bursts` bursts of `--burst` messages, one burst every `--period` seconds, starting
right after the connection is made. Blocks alternate (paho, client, ...). Printed per
system: p50, p99 and max over all blocks; the ratio is the client's max over paho's (a
stall is what Nagle costs; the target: no message waits for a delayed ACK).

    python bench/telemetry_latency.py
    python bench/telemetry_latency.py --blocks 5 --bursts 40 --burst 3
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from collections.abc import Callable

import paho.mqtt.client as mqtt
from _harness import Mosquitto, emit, row
from paho.mqtt.enums import CallbackAPIVersion

Send = Callable[[bytes], None]


def _paho(url: str, host: str, port: int) -> tuple[Send, Callable[[], None]]:
    pub = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    connected = threading.Event()
    pub.on_connect = lambda *a: connected.set()
    pub.connect(host, port)
    pub.loop_start()
    connected.wait(10)

    def close() -> None:
        pub.disconnect()
        pub.loop_stop()

    return lambda body: pub.publish(TOPIC, body, 0).wait_for_publish(10), close


def _client(url: str, host: str, port: int) -> tuple[Send, Callable[[], None]]:
    from client import Client  # after _harness has put the project on sys.path

    pub = Client(url)
    pub.connect()
    return lambda body: pub.publish(TOPIC, body, qos=0), pub.close


TOPIC = f"bench/telemetry/{uuid.uuid4().hex[:8]}"
SYSTEMS = {"paho": _paho, "client": _client}


def _block(make: Callable[..., tuple[Send, Callable[[], None]]], broker: Mosquitto,
           seen: list[float], bursts: int, burst: int, period: float) -> list[float]:  # fmt: skip
    send, close = make(broker.url, "127.0.0.1", broker.port)
    start = len(seen)
    try:
        for _ in range(bursts):
            for _ in range(burst):
                send(f"{time.time():.6f}".encode())
            time.sleep(period)
        deadline = time.monotonic() + 5
        while len(seen) - start < bursts * burst and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        close()
    got = seen[start:]
    if len(got) != bursts * burst:
        raise SystemExit(f"{len(got)} of {bursts * burst} messages arrived")
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=3, help="blocks per system")
    parser.add_argument("--bursts", type=int, default=20, help="bursts per block")
    parser.add_argument("--burst", type=int, default=2, help="messages per burst")
    parser.add_argument("--period", type=float, default=0.05, help="seconds between bursts")
    args = parser.parse_args()
    broker = Mosquitto(max_packet_size=262144, extra_config="set_tcp_nodelay true").start()
    seen: list[float] = []
    sub = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    subscribed = threading.Event()
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.on_message = lambda c, u, m: seen.append((time.time() - float(m.payload)) * 1000)
    lat: dict[str, list[float]] = {name: [] for name in SYSTEMS}
    try:
        sub.connect("127.0.0.1", broker.port)
        sub.loop_start()
        sub.subscribe(TOPIC, 0)
        subscribed.wait(10)
        for block in range(1, args.blocks + 1):
            for name, make in SYSTEMS.items():
                got = _block(make, broker, seen, args.bursts, args.burst, args.period)
                lat[name] += got
                print(f"block {block} {name}: p50 {statistics.median(got):.2f} ms, "
                      f"max {max(got):.2f} ms")  # fmt: skip
    finally:
        sub.disconnect()
        sub.loop_stop()
        broker.close()
    stats = {}
    for name, values in lat.items():
        p99 = statistics.quantiles(values, n=100)[98]
        stats[name] = (statistics.median(values), p99, max(values))
        print(f"{name}: {len(values)} messages, p50 {stats[name][0]:.2f} ms, "
              f"p99 {p99:.2f} ms, max {stats[name][2]:.2f} ms")  # fmt: skip
    what = f"bursts of {args.burst}, QoS 0, from connect"
    emit([
        row("telemetry", f"small-message max latency, {what}", stats["paho"][2],
            stats["client"][2], "ms", "info", higher_is_better=False, limit=float("inf")),
        row("telemetry", f"small-message p50 latency, {what}", stats["paho"][0],
            stats["client"][0], "ms", "info", higher_is_better=False, limit=float("inf")),
    ])  # fmt: skip


if __name__ == "__main__":
    main()
