"""Benchmark: receiving small QoS 1 messages, a :class:`client.Client` subscriber versus paho.

One local mosquitto (tests/_servers.py); `mosquitto_pub -l` in its own process publishes
`--messages` 100-byte QoS 1 messages as fast as it can, once per block, to a topic one
subscriber reads: plain paho (which acknowledges each as it arrives, on its network thread)
or `Client` (which acknowledges each when its receive worker takes it, under a Receive
Maximum of `max_pending_deliveries`: client/receive/_inbound.py), reading `messages()`. Blocks
alternate (paho, client, paho, ...) so background load hits both alike. The rate is messages
over the time from the first publish to the last message read; the ratio is the client's
over paho's.

    python bench/receive_rate.py                     # 5 blocks of 20,000 each
    python bench/receive_rate.py --messages 50000 --blocks 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import threading
import time
import uuid

import paho.mqtt.client as mqtt
from _harness import Mosquitto, emit_rate
from paho.mqtt.enums import CallbackAPIVersion

_OPTS = {"automatic_offload": False, "fetch_external": False}


def _publish(port: int, topic: str, n: int) -> tuple[subprocess.Popen[bytes], float]:
    """Start `mosquitto_pub -l` with `n` lines queued on its stdin; the time it started."""
    lines = b"".join(b"%099d\n" % i for i in range(n))
    proc = subprocess.Popen(
        ["mosquitto_pub", "-p", str(port), "-t", topic, "-q", "1", "-l", "-V", "5"],
        stdin=subprocess.PIPE,
    )
    t0 = time.perf_counter()
    assert proc.stdin is not None
    proc.stdin.write(lines)
    proc.stdin.close()
    return proc, t0


def paho_block(port: int, n: int) -> float:
    topic = f"bench/recv/{uuid.uuid4().hex[:8]}"
    done = threading.Event()
    count = 0

    def on_message(c: mqtt.Client, u: object, m: mqtt.MQTTMessage) -> None:
        nonlocal count
        count += 1
        if count == n:
            done.set()

    sub = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    subscribed = threading.Event()
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.on_message = on_message
    sub.connect("127.0.0.1", port)
    sub.loop_start()
    try:
        sub.subscribe(topic, 1)
        assert subscribed.wait(10)
        proc, t0 = _publish(port, topic, n)
        assert done.wait(120), f"paho got {count} of {n}"
        rate = n / (time.perf_counter() - t0)
        proc.wait(30)
        return rate
    finally:
        sub.loop_stop()
        sub.disconnect()


def client_block(url: str, port: int, n: int) -> float:
    from client import Client  # after _harness has put the project on sys.path

    topic = f"bench/recv/{uuid.uuid4().hex[:8]}"
    with Client(url, **_OPTS) as sub:  # type: ignore[arg-type]
        sub.subscribe(topic, qos=1)
        proc, t0 = _publish(port, topic, n)
        got = 0
        for _ in sub.messages(timeout=60):
            got += 1
            if got == n:
                break
        assert got == n, f"Client got {got} of {n}"
        rate = n / (time.perf_counter() - t0)
        proc.wait(30)
        return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="per block")
    parser.add_argument("--blocks", type=int, default=5)
    args = parser.parse_args()
    # Queue everything for a subscriber that falls behind (mosquitto drops beyond 1,000).
    config = "set_tcp_nodelay true\nmax_queued_messages 10000000"
    broker = Mosquitto(max_packet_size=262144, extra_config=config).start()
    try:
        paho_block(broker.port, 1000)  # warm-up
        client_block(broker.url, broker.port, 1000)
        paho_rates, client_rates = [], []
        for _ in range(args.blocks):
            paho_rates.append(paho_block(broker.port, args.messages))
            client_rates.append(client_block(broker.url, broker.port, args.messages))
        p, c = statistics.median(paho_rates), statistics.median(client_rates)
    finally:
        broker.close()
    print(
        f"100-byte QoS 1 received, {args.blocks} x {args.messages}: "
        f"paho {p:.0f} msg/s, Client {c:.0f} msg/s, ratio {c / p:.2f}"
    )
    emit_rate("receive", "100-byte QoS 1 received, Client / paho", p, c, "msg/s")


if __name__ == "__main__":
    main()
