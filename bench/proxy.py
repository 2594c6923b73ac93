"""offload-proxy against its baselines, each ratio measured in the same run (issue 28):

1. 1 KiB QoS 1 rate, 8 publishers to 8 subscribers, through the proxy / straight to mosquitto
   (target >= 0.7);
2. small-message p99 latency through the proxy while 16 MiB messages flow through it / the
   same p99 with the proxy idle (target <= 2);
3. 64 MiB `mosquitto_pub` -> `mosquitto_sub`, both through the proxy / `client.Client` ->
   `client.Client` end to end (target <= 1.2);
4. the proxy's peak RSS per concurrent 64 MiB transfer, 16 at once (target <= 16 MiB).

    python bench/proxy.py [--rounds 3]

Real SeaweedFS, mosquitto (256 KiB, TCP_NODELAY), `offload-gateway` and `offload-proxy`
processes; only the proxy's own figures come from its process (VmHWM).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from _harness import (
    ROOT,
    absolute_row,
    emit,
    gateway_process,
    make_bucket,
    reset_hwm,
    row,
    vm_hwm_kib,
)
from end_to_end import _wait_all, _wait_subscribed, api_run
from proxy_choices import _paho, _rate

from _servers import Mosquitto, SeaweedFS, free_port, wait_for_port

MiB = 1 << 20


def _proxy(broker: Mosquitto, endpoint: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OFFLOAD_PROXY_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "--broker", broker.url, "--port", str(port),
         "--endpoint", endpoint], env=env, stdout=subprocess.DEVNULL, cwd=ROOT,
    )  # fmt: skip
    wait_for_port(port, 30, proc)
    return proc, port


def _p99_latency(port: int, n: int) -> float:
    """p99 ms of 1 KiB QoS 1 messages, one publisher to one subscriber through `port`."""
    topic = f"bench/lat/{uuid.uuid4().hex[:8]}"
    latencies: list[float] = []
    got = threading.Semaphore(0)

    def on_message(_c: object, _u: object, message: object) -> None:
        sent = float(message.payload[:20])  # type: ignore[attr-defined]
        latencies.append((time.perf_counter() - sent) * 1000)
        got.release()

    sub = _paho(port)
    sub.on_message = on_message
    sub.subscribe(topic, 1)
    pub = _paho(port)
    time.sleep(1.0)
    for _ in range(n):
        stamp = f"{time.perf_counter():20.6f}".encode()
        pub.publish(topic, stamp + bytes(1004), 1).wait_for_publish(30)
        got.acquire(timeout=30)
    for c in (pub, sub):
        c.disconnect()
        c.loop_stop()
    return statistics.quantiles(latencies, n=100)[98]


def _mosq(port: int, program: str, topic: str) -> list[str]:
    return [program, "-h", "127.0.0.1", "-p", str(port), "-t", topic, "-q", "1", "-V", "5"]


def _big_flow(port: int, path: Path, stop: threading.Event) -> None:
    """16 MiB messages through the proxy, one after the other, to a subscriber on it."""
    topic = f"bench/flow/{uuid.uuid4().hex[:8]}"
    sub = subprocess.Popen([*_mosq(port, "mosquitto_sub", topic)], stdout=subprocess.DEVNULL)
    while not stop.is_set():
        subprocess.run([*_mosq(port, "mosquitto_pub", topic), "-f", str(path)], check=True)
    sub.terminate()
    sub.wait()


def _pub_sub_via(port: int, broker: Mosquitto, path: Path) -> float:
    topic = f"bench/e2e/{uuid.uuid4().hex[:8]}"
    ident = f"psub-{uuid.uuid4().hex[:8]}"
    sub = subprocess.Popen(
        [*_mosq(port, "mosquitto_sub", topic), "-C", "1", "-i", ident], stdout=subprocess.DEVNULL
    )
    _wait_subscribed(broker, [ident])
    start = time.perf_counter()
    subprocess.run([*_mosq(port, "mosquitto_pub", topic), "-f", str(path)], check=True)
    return _wait_all([sub]) - start


def _rss_per_transfer(proc: subprocess.Popen[bytes], port: int, path: Path, n: int) -> float:
    topic = f"bench/rss/{uuid.uuid4().hex[:8]}"
    base = vm_hwm_kib(proc.pid)
    if reset_hwm(proc.pid):
        base = vm_hwm_kib(proc.pid)
    pubs = [
        subprocess.Popen([*_mosq(port, "mosquitto_pub", f"{topic}/{i}"), "-f", str(path)])
        for i in range(n)
    ]
    _wait_all(pubs, timeout=600)
    peak = vm_hwm_kib(proc.pid)
    print(f"proxy VmHWM {base / 1024:.1f} MiB before, {peak / 1024:.1f} MiB with {n} x 64 MiB")
    return (peak - base) / 1024 / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=8000)
    parser.add_argument("--latency-messages", type=int, default=500)
    parser.add_argument("--concurrent", type=int, default=16)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    big, mid = work / "64m.bin", work / "16m.bin"
    big.write_bytes(os.urandom(64 * MiB))
    mid.write_bytes(os.urandom(16 * MiB))
    seaweed = SeaweedFS().start()
    broker = Mosquitto(max_packet_size=262144, extra_config="set_tcp_nodelay true").start()
    bucket = f"bench-proxy-{uuid.uuid4().hex[:8]}"
    make_bucket(seaweed, bucket)
    rows: list[dict[str, object]] = []
    try:
        with gateway_process(seaweed, bucket, broker=broker) as gw:
            proc, port = _proxy(broker, gw.url)
            from client import Client

            try:
                direct, via = [], []
                for _ in range(args.rounds):
                    direct.append(_rate(broker.port, args.messages, 8))
                    via.append(_rate(port, args.messages, 8))
                d, v = statistics.median(direct), statistics.median(via)
                print(f"1 KiB QoS 1 8->8: direct {d:,.0f}, via proxy {v:,.0f} msg/s")
                rows.append(row("proxy", "1 KiB QoS 1 rate 8->8, straight -> via proxy", d, v,
                                "msg/s", ">= 0.7", higher_is_better=True, limit=0.7))  # fmt: skip

                idle = _p99_latency(port, args.latency_messages)
                stop = threading.Event()
                flow = threading.Thread(target=_big_flow, args=(port, mid, stop))
                flow.start()
                time.sleep(1.0)
                try:
                    loaded = _p99_latency(port, args.latency_messages)
                    floor = _p99_latency(broker.port, args.latency_messages)
                finally:
                    stop.set()
                    flow.join()
                print(f"small-message p99: idle {idle:.1f} ms, with 16 MiB flowing {loaded:.1f} ms"
                      f" (straight to mosquitto meanwhile: {floor:.1f} ms)")  # fmt: skip
                rows.append(row("proxy", "small p99, proxy idle -> 16 MiB flowing", idle, loaded,
                                "ms", "<= 2", higher_is_better=False, limit=2.0))  # fmt: skip
                # The floor: the machine's own contention while the flow runs (info).
                rows.append(row("proxy", "small p99 while 16 MiB flow, straight -> via proxy",
                                floor, loaded, "ms", "info", higher_is_better=False,
                                limit=1e9))  # fmt: skip

                proxied, library = [], []
                with Client(broker.url, endpoint=gw.url, discovery_wait=0.0) as pub:
                    for _ in range(args.rounds):
                        proxied.append(_pub_sub_via(port, broker, big))
                        library.append(api_run(broker, gw.url, big, 1, pub))
                p, c = statistics.median(proxied), statistics.median(library)
                print(f"64 MiB pub -> sub: via proxy {p:.2f} s, client.Client {c:.2f} s")
                metric = "64 MiB pub->sub, Client e2e -> mosquitto_* via proxy"
                rows.append(row("proxy", metric, c, p, "s", "<= 1.2", higher_is_better=False,
                                limit=1.2))  # fmt: skip

                per = _rss_per_transfer(proc, port, big, args.concurrent)
                print(f"proxy peak RSS per concurrent 64 MiB transfer: {per:.1f} MiB")
                rows.append(absolute_row("proxy", f"peak RSS per 64 MiB transfer, {args.concurrent}"
                                         " at once", per, "MiB", "<= 16", per <= 16))  # fmt: skip
            finally:
                proc.terminate()
                proc.wait(30)
    finally:
        broker.close()
        seaweed.close()
    emit(rows)


if __name__ == "__main__":
    main()
