"""Benchmark: 1 MiB through a 64 KiB mosquitto limit as ADR-23 chunks, publish to delivery.

Starts two local mosquitto brokers (tests/_servers.py): one with `max_packet_size 65536`, one
without a limit. Each run publishes 1 MiB of random bytes and stops the clock when the
subscriber holds the whole, verified message:

* chunked: :class:`client.Client` publisher -> 17 chunks -> :class:`client.Client` subscriber
  (reassembly and SHA-256 check included), on the 64 KiB broker;
* baseline: the same 1 MiB as one PUBLISH with plain paho on both ends, on the unlimited broker.

Both run in the same process and session, one block after the other, for QoS 0 and 1;
the medians are compared. The issue's anchor: ~300 ms for a 1 MB round trip with the Azure IoT
Operations prototype; target < 50 ms median.

Broker setting that matters: mosquitto's `set_tcp_nodelay` defaults to false, so Nagle's
algorithm holds back the broker's second and later PUBACKs until the client's delayed ACK
(40 ms on Linux) fires: every QoS 1 chunked message then pays ~40 ms no matter how fast the
client is (plain paho publishing 3 QoS 1 packets back to back pays it too). Both brokers run
with `set_tcp_nodelay true` unless `--no-nodelay` is given, to show that stall.

    python bench/chunking.py               # N=50
    python bench/chunking.py --runs 200
    python bench/chunking.py --no-nodelay  # mosquitto's default TCP settings
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import time
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from client import Client, Message, Route

from _servers import Mosquitto

MiB = 1024 * 1024


def _paho(port: int, on_message: object = None) -> mqtt.Client:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    if on_message is not None:
        c.on_message = on_message  # type: ignore[assignment]
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def chunked_runs(broker: Mosquitto, qos: int, runs: int, payload: bytes) -> list[float]:
    topic = f"bench/chunk/{uuid.uuid4().hex[:8]}"
    times: list[float] = []
    opts = {"automatic_offload": False, "fetch_external": False, "discovery_wait": 0.0}
    with Client(broker.url, **opts) as sub, Client(broker.url, **opts) as pub:  # type: ignore[arg-type]
        sub.subscribe(topic, qos)
        for _ in range(runs + 1):  # the first run warms up
            t0 = time.perf_counter()
            result = pub.publish(topic, payload, qos=qos)
            msg = sub.next_message(30)
            elapsed = time.perf_counter() - t0
            assert result.route is Route.CHUNKED
            assert isinstance(msg, Message) and msg.size == len(payload), msg
            times.append(elapsed)
    return times[1:]


def baseline_runs(broker: Mosquitto, qos: int, runs: int, payload: bytes) -> list[float]:
    topic = f"bench/base/{uuid.uuid4().hex[:8]}"
    got: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    sub = _paho(broker.port, lambda c, u, m: got.put(m.payload))
    pub = _paho(broker.port)
    try:
        sub.subscribe(topic, qos)[1]
        time.sleep(0.3)
        times: list[float] = []
        for _ in range(runs + 1):
            t0 = time.perf_counter()
            pub.publish(topic, payload, qos)
            data = got.get(timeout=30)
            times.append(time.perf_counter() - t0)
            assert len(data) == len(payload)
        return times[1:]
    finally:
        for c in (sub, pub):
            c.loop_stop()
            c.disconnect()


def _stats(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered) * 1e3, ordered[int(0.9 * (len(ordered) - 1))] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--size", type=int, default=MiB)
    parser.add_argument("--nodelay", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    payload = os.urandom(args.size)
    extra = f"set_tcp_nodelay {'true' if args.nodelay else 'false'}"
    limited = Mosquitto(max_packet_size=65536, extra_config=extra).start()
    open_broker = Mosquitto(extra_config=extra).start()
    try:
        print(
            f"{args.size} bytes, N={args.runs}, limit 65536 vs none (mosquitto, loopback, {extra})"
        )
        for qos in (0, 1):
            chunked = chunked_runs(limited, qos, args.runs, payload)
            base = baseline_runs(open_broker, qos, args.runs, payload)
            c_med, c_p90 = _stats(chunked)
            b_med, b_p90 = _stats(base)
            print(
                f"QoS {qos}: chunked median {c_med:.1f} ms p90 {c_p90:.1f} ms | "
                f"single-message baseline median {b_med:.1f} ms p90 {b_p90:.1f} ms | "
                f"ratio {c_med / b_med:.2f}x"
            )
    finally:
        limited.close()
        open_broker.close()


if __name__ == "__main__":
    main()
