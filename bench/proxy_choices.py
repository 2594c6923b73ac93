"""The proxy's chosen parts, measured: its own wire core against the `mqtt5` codec (PyPI,
Rust), and asyncio's event loop against uvloop, for 1 KiB QoS 1 messages relayed by
`offload-proxy` (bench/RESULTS.md, "Proxy: codec and event loop").

    python bench/proxy_choices.py [--messages 20000] [--mqtt5 /tmp/mqtt5pkg]

The codec part needs mqtt5 importable (pip install --target /tmp/mqtt5pkg mqtt5); without
it only the own core is timed.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

from _harness import ROOT, CpuMeter, emit, row

from _servers import Mosquitto, free_port, wait_for_port


def _packet(v5: bool, payload: bytes) -> bytes:
    from proxy.protocol import encode_varint
    from proxy.protocol._properties import encode_properties, user_property

    topic = b"bench/topic/one"
    body = len(topic).to_bytes(2, "big") + topic + (7).to_bytes(2, "big")
    if v5:
        body += encode_properties([user_property("app", "bench"), user_property("k", "v")])
    body += payload
    return b"\x32" + encode_varint(len(body)) + body


def codec(n: int, mqtt5_path: str | None) -> list[dict[str, object]]:
    from proxy.protocol import Body, Framer, Head, publish_header

    packet = _packet(True, os.urandom(1024))
    framer = Framer()
    start = time.perf_counter()
    for _ in range(n):
        framer.feed(packet)
        head = framer.next_event()
        body = framer.next_event()
        assert isinstance(head, Head) and isinstance(body, Body)
        publish_header(body.data, qos=1, v5=True)
        out = head.raw + body.data  # relayed as it came
    own = n / (time.perf_counter() - start)
    print(f"own core: {own:,.0f} PUBLISH/s (frame, read the header, relay the bytes)")
    if mqtt5_path is None:
        return []
    sys.path.insert(0, mqtt5_path)
    import mqtt5  # type: ignore[import-not-found]

    view = memoryview(packet)
    start = time.perf_counter()
    for _ in range(n):
        parsed, _size = mqtt5.read(view)
        out = parsed.write()  # a parsed packet is relayed by writing it again
    theirs = n / (time.perf_counter() - start)
    assert len(out) == len(packet)
    print(f"mqtt5 0.8: {theirs:,.0f} PUBLISH/s (read whole, write again); MQTT 5 only")
    return [row("proxy choices", "1 KiB PUBLISH codec rate, mqtt5 -> own core", theirs, own,
                "pkt/s", "info", higher_is_better=True, limit=0.0)]  # fmt: skip


def _paho(port: int) -> Any:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    def no_delay(_c: object, _u: object, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.on_socket_open = no_delay
    client.connect("127.0.0.1", port)
    client.loop_start()
    return client


def _rate(port: int, n: int, pairs: int) -> float:
    """1 KiB QoS 1 messages, `pairs` publishers (each waits for its PUBACK, as an
    application does) to `pairs` subscribers, one topic each: delivered msg/s."""
    base = f"bench/{uuid.uuid4().hex[:8]}"
    done = threading.Semaphore(0)
    per = n // pairs
    subs, pubs = [], []
    for i in range(pairs):
        counter = {"n": 0}

        def on_message(*_a: object, counter: dict[str, int] = counter) -> None:
            counter["n"] += 1
            if counter["n"] == per:
                done.release()

        sub = _paho(port)
        sub.on_message = on_message
        sub.subscribe(f"{base}/{i}", 1)[1]
        subs.append(sub)
        pubs.append(_paho(port))
    time.sleep(1.0)  # SUBACKs
    payload = os.urandom(1024)

    def publish(i: int) -> None:
        for _ in range(per):
            pubs[i].publish(f"{base}/{i}", payload, 1).wait_for_publish(30)

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(pairs)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for _ in range(pairs):
        done.acquire(timeout=120)
    rate = per * pairs / (time.perf_counter() - start)
    for t in threads:
        t.join()
    for c in subs + pubs:
        c.disconnect()
        c.loop_stop()
    return rate


def loops(n: int, rounds: int, pairs: int) -> list[dict[str, object]]:
    # mosquitto leaves Nagle on by default: its PUBACKs and deliveries then wait for delayed
    # ACKs (~80 msg/s straight to it); every client here sets TCP_NODELAY, so does it.
    broker = Mosquitto(max_packet_size=262144, extra_config="set_tcp_nodelay true").start()
    rates: dict[str, list[float]] = {"direct": [], "asyncio": [], "uvloop": []}
    cpu: dict[str, list[float]] = {"asyncio": [], "uvloop": []}  # proxy CPU-s per 10k msgs
    try:
        for _ in range(rounds):
            rates["direct"].append(_rate(broker.port, n, pairs))
            for loop in ("asyncio", "uvloop"):
                port = free_port()
                env = {**os.environ, "PYTHONPATH": str(ROOT), "OFFLOAD_PROXY_LOOP": loop,
                       "OFFLOAD_PROXY_ENDPOINT": "http://127.0.0.1:9"}  # fmt: skip
                proc = subprocess.Popen(
                    [sys.executable, "-m", "proxy.cli", "--broker", broker.url, "--port",
                     str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    cwd=ROOT,
                )  # fmt: skip
                try:
                    wait_for_port(port, 20, proc)
                    meter = CpuMeter(proxy=proc.pid)
                    before = meter.read()
                    rates[loop].append(_rate(port, n, pairs))
                    spent = CpuMeter.spent(before, meter.read())["proxy"]
                    cpu[loop].append(spent / n * 10_000)
                finally:
                    proc.terminate()
                    proc.wait(10)
    finally:
        broker.close()
    best = {k: statistics.median(v) for k, v in rates.items()}
    for k, v in rates.items():
        print(
            f"{k}: "
            + ", ".join(f"{r:,.0f}" for r in v)
            + f" msg/s (1 KiB QoS 1, {pairs} -> {pairs})"
        )
    for k, v in cpu.items():
        print(f"proxy CPU on {k}: " + ", ".join(f"{c:.2f}" for c in v) + " CPU-s per 10k messages")
    least = {k: statistics.median(v) for k, v in cpu.items()}
    return [
        row("proxy choices", "proxy CPU per 10k 1 KiB QoS 1, asyncio -> uvloop",
            least["asyncio"], least["uvloop"], "CPU-s", "info", higher_is_better=False,
            limit=10.0),
        row("proxy choices", "1 KiB QoS 1 rate, direct -> via proxy (uvloop)", best["direct"],
            best["uvloop"], "msg/s", ">= 0.7", higher_is_better=True, limit=0.7),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--packets", type=int, default=200_000)
    parser.add_argument("--mqtt5", default="/tmp/mqtt5pkg")
    args = parser.parse_args()
    mqtt5_path = args.mqtt5 if os.path.isdir(args.mqtt5) else None
    emit(codec(args.packets, mqtt5_path) + loops(args.messages, args.rounds, args.pairs))


if __name__ == "__main__":
    main()
