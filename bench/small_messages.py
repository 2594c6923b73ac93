"""Benchmark: 1 KiB QoS 1 messages, :meth:`client.Client.publish` versus plain paho.

Both publish to the same local mosquitto (tests/_servers.py, `set_tcp_nodelay true`, 256 KiB
limit) in the same run, each message acknowledged before the next one is sent (what
`Client.publish` does; paho: `publish(...).wait_for_publish()`). Blocks alternate
(paho, client, paho, client, ...) so background load hits both alike; the ratio is the
client's message rate over paho's, target >= 0.9.

    python bench/small_messages.py                   # 5 x 1000 messages each
    python bench/small_messages.py --messages 5000 --blocks 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from client import Client

from _servers import Mosquitto


def paho_block(pub: mqtt.Client, topic: str, payload: bytes, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        pub.publish(topic, payload, 1).wait_for_publish(10)
    return n / (time.perf_counter() - t0)


def client_block(pub: Client, topic: str, payload: bytes, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        pub.publish(topic, payload, qos=1)
    return n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1000, help="per block")
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args()
    payload = os.urandom(args.size)
    topic = f"bench/small/{uuid.uuid4().hex[:8]}"
    broker = Mosquitto(max_packet_size=262144, extra_config="set_tcp_nodelay true").start()
    raw = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    try:
        raw.connect("127.0.0.1", broker.port)
        raw.loop_start()
        opts = {"automatic_offload": False, "fetch_external": False}
        with Client(broker.url, **opts) as ours:  # type: ignore[arg-type]
            paho_block(raw, topic, payload, 100)  # warm-up
            client_block(ours, topic, payload, 100)
            paho_rates, client_rates = [], []
            for _ in range(args.blocks):
                paho_rates.append(paho_block(raw, topic, payload, args.messages))
                client_rates.append(client_block(ours, topic, payload, args.messages))
        p, c = statistics.median(paho_rates), statistics.median(client_rates)
        print(
            f"{args.size}-byte QoS 1, {args.blocks} x {args.messages} each: "
            f"paho {p:.0f} msg/s, Client.publish {c:.0f} msg/s, ratio {c / p:.2f}"
        )
    finally:
        raw.loop_stop()
        raw.disconnect()
        broker.close()


if __name__ == "__main__":
    main()
