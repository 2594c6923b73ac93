"""Benchmark: QoS 0 messages delivered per second, `Client.publish` versus plain paho.

Telemetry is mostly QoS 0. Each system publishes `--messages` 100-byte QoS 0 messages as
fast as it can to the same local mosquitto (`set_tcp_nodelay true`), and `mosquitto_sub -C N`
(C, its own process) counts them; the time runs from the first publish to the moment the
subscriber has all N, so a publisher that only queues (paho's `publish` returns before the
write, its queue unbounded) is timed by what arrives, not by what it queued. Blocks
alternate (paho, client, ...); the ratio is the client's median rate over paho's.

    python bench/qos0_rate.py
    python bench/qos0_rate.py --messages 50000 --blocks 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Callable

import paho.mqtt.client as mqtt
from _harness import Mosquitto, emit_rate
from paho.mqtt.enums import CallbackAPIVersion

Send = Callable[[bytes], None]


def _paho(broker: Mosquitto) -> tuple[Send, Callable[[], None]]:
    pub = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    connected = threading.Event()
    pub.on_connect = lambda *a: connected.set()
    pub.connect("127.0.0.1", broker.port)
    pub.loop_start()
    connected.wait(10)

    def close() -> None:
        pub.disconnect()
        pub.loop_stop()

    return lambda body: pub.publish(TOPIC, body, 0), close


def _client(broker: Mosquitto) -> tuple[Send, Callable[[], None]]:
    from client import Client  # after _harness has put the project on sys.path

    pub = Client(broker.url)
    pub.connect()
    return lambda body: pub.publish(TOPIC, body, qos=0), pub.close


TOPIC = f"bench/qos0/{uuid.uuid4().hex[:8]}"
SYSTEMS = {"paho": _paho, "client": _client}


def _block(make: Callable[[Mosquitto], tuple[Send, Callable[[], None]]], broker: Mosquitto,
           n: int) -> float:  # fmt: skip
    """Messages per second from the first publish until the subscriber has all `n`."""
    mosquitto_sub = shutil.which("mosquitto_sub") or "mosquitto_sub"
    sub = subprocess.Popen(
        [mosquitto_sub, "-p", str(broker.port), "-t", TOPIC, "-C", str(n), "-q", "0"],
        stdout=subprocess.DEVNULL,
    )
    send, close = make(broker)
    try:
        time.sleep(0.5)  # mosquitto_sub subscribed
        body = b"t" * 100
        start = time.perf_counter()
        for _ in range(n):
            send(body)
        sub.wait(60)
        return n / (time.perf_counter() - start)
    finally:
        close()
        if sub.poll() is None:
            sub.kill()
            raise SystemExit("the subscriber did not get every message")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20000, help="per block")
    parser.add_argument("--blocks", type=int, default=3, help="blocks per system")
    args = parser.parse_args()
    broker = Mosquitto(max_packet_size=262144, extra_config="set_tcp_nodelay true").start()
    rates: dict[str, list[float]] = {name: [] for name in SYSTEMS}
    try:
        for block in range(1, args.blocks + 1):
            for name, make in SYSTEMS.items():
                rates[name].append(_block(make, broker, args.messages))
                print(f"block {block} {name}: {rates[name][-1]:.0f} msg/s")
    finally:
        broker.close()
    paho, client = statistics.median(rates["paho"]), statistics.median(rates["client"])
    print(f"100-byte QoS 0, {args.messages} per block: paho {paho:.0f} msg/s, "
          f"Client.publish {client:.0f} msg/s, ratio {client / paho:.2f}")  # fmt: skip
    emit_rate("qos0", "100-byte QoS 0 delivered, Client / paho", paho, client, "msg/s")


if __name__ == "__main__":
    main()
