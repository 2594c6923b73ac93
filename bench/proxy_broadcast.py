"""A firmware broadcast through offload-proxy against mosquitto with a raised limit, in one
run (issue 50): one message of `--size` MiB to `--devices` devices subscribed to one topic.

Paths, alternating, best of `--rounds`:

- **straight**: the devices and `mosquitto_pub` on a mosquitto whose limit is raised to
  take the message (`max_packet_size` 64 MiB);
- **proxy**: the same through `offload-proxy` in front of a 256 KiB mosquitto, the real
  `offload-gateway` and SeaweedFS (the publisher's PUBLISH offloaded, the placeholder
  resolved for each device); `--against DIR` adds the proxy of another tree (`git archive
  main | tar -x -C DIR`) on the same broker and gateway.

A round's time runs from `mosquitto_pub`'s start to the last device's last byte. The
devices are raw MQTT clients on one asyncio loop (tests/_fleet.py), each from its own
loopback address (127.0.1.1, ...), QoS 1, each payload compared byte for byte as it
arrives. Printed per proxy: time, its ratio to straight, the payload bytes the gateway
served for the round (its own `offload_http_sent_bytes_total` for the payload route, in
payloads), and the proxy's RSS growth (VmHWM over the RSS before the round).

`--lies N` then measures "a lie costs the liar" for each proxy: a device uploads a payload
of its own through the proxy, then N placeholders naming it with fresh false SHA-256s are
published, each followed by a small true message; a plain paho subscriber (reconnecting, as
paho does) through the proxy counts its disconnects and what it got.

    python bench/proxy_broadcast.py [--devices 200] [--size 8] [--rounds 3] [--mqtt 5|311]
                                    [--against DIR] [--lies 20]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from _harness import ROOT, absolute_row, emit, gateway_process, make_bucket, reset_hwm, row

from _fleet import Fleet
from _servers import Mosquitto, SeaweedFS, free_port, wait_for_port, wait_until

MiB = 1 << 20
PAYLOAD_ROUTE = 'offload_http_sent_bytes_total{route="/msg/{message_id}/payload"}'


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def _served(metrics_url: str) -> float:
    """Payload bytes the gateway has sent so far (its own metric)."""
    text = httpx.get(metrics_url, timeout=10).text
    pattern = re.escape(PAYLOAD_ROUTE) + r" ([0-9.e+]+)"
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


@dataclass
class Route:
    """One way to the devices: its MQTT port, and the proxy process (None: straight)."""

    name: str
    port: int
    proc: subprocess.Popen[bytes] | None = None


@contextmanager
def offload_proxy(broker: Mosquitto, endpoint: str, root: Path) -> Iterator[Route]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env.update({"PYTHONPATH": str(root), "OFFLOAD_PROXY_LOG_LEVEL": "WARNING"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "--broker", broker.url, "--port", str(port),
         "--endpoint", endpoint], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, cwd=root,
    )  # fmt: skip
    try:
        wait_for_port(port, 60, proc)
        yield Route(str(root), port, proc)
    finally:
        proc.terminate()
        proc.wait(60)


@dataclass
class Round:
    seconds: float
    served: float  # payloads the gateway served
    growth: float  # MiB of proxy RSS


def _round(args: argparse.Namespace, path: Route, payload: Path, data: bytes, gw: str) -> Round:
    topic = f"firmware/{uuid.uuid4().hex[:10]}"
    fleet = Fleet(path.port, topic, args.devices, data, v5=args.mqtt == "5").start()
    before = _served(gw)
    rss = 0
    if path.proc is not None:
        reset_hwm(path.proc.pid)
        rss = _rss_kib(path.proc.pid)
    start = time.perf_counter()
    pub = subprocess.run(
        ["mosquitto_pub", "-p", str(path.port), "-t", topic, "-q", "1", "-f", str(payload),
         "-V", "mqttv5" if args.mqtt == "5" else "mqttv311"],
        capture_output=True, timeout=300,
    )  # fmt: skip
    assert pub.returncode == 0, pub.stderr.decode()
    published = time.perf_counter() - start
    results = fleet.results(600)
    bad = [r for r in results if r.done is None or not r.exact or r.received != len(data)]
    assert not bad, f"{len(bad)} devices did not get the payload byte-exact: {bad[:3]}"
    done = sorted(r.done - start for r in results if r.done is not None)
    seconds = done[-1]
    growth = 0.0
    if path.proc is not None:
        growth = (_rss_kib(path.proc.pid, "VmHWM") - rss) / 1024
    print(f"    published (acknowledged) after {published:.2f} s; first device done after "
          f"{done[0]:.2f} s, median {done[len(done) // 2]:.2f} s")  # fmt: skip
    return Round(seconds, (_served(gw) - before) / len(data), growth)


def _lies(args: argparse.Namespace, broker: Mosquitto, path: Route) -> tuple[int, int, int]:
    """Disconnects of a plain subscriber through `path` while N false digests arrive, and
    the true messages and placeholders it got."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    topic = f"lies/{uuid.uuid4().hex[:10]}"
    got: list[bytes] = []
    drops = 0

    def dropped(*_: object) -> None:
        nonlocal drops
        drops += 1

    sub = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    sub.on_message = lambda _c, _u, m: got.append(m.payload)
    sub.on_disconnect = dropped
    sub.on_connect = lambda c, *_: c.subscribe(topic, 1)
    sub.reconnect_delay_set(0.1, 0.5)
    sub.connect("127.0.0.1", path.port)
    sub.loop_start()
    spy = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    refs: list[bytes] = []
    spy.on_message = lambda _c, _u, m: refs.append(m.payload)
    spy.connect("127.0.0.1", broker.port)
    spy.subscribe(topic, 1)
    spy.loop_start()
    time.sleep(1.0)
    own = os.urandom(2 * MiB)
    pub = subprocess.run(
        ["mosquitto_pub", "-p", str(path.port), "-t", topic, "-q", "1", "-s"],
        input=own, capture_output=True, timeout=60,
    )  # fmt: skip
    assert pub.returncode == 0, pub.stderr.decode()
    wait_until(lambda: len(got) >= 1 and len(refs) >= 1, "the device's own payload", 60)
    ref = json.loads(refs[0])
    start = time.perf_counter()
    for i in range(args.lies):
        lie = {**ref, "sha256": hashlib.sha256(os.urandom(16)).hexdigest()}
        spy.publish(topic, json.dumps(lie), qos=1).wait_for_publish(30)
        spy.publish(topic, f"true {i}", qos=1).wait_for_publish(30)
    deadline = time.monotonic() + 20  # a subscriber that was cut off may have lost some
    while sum(p.startswith(b"true") for p in got) < args.lies and time.monotonic() < deadline:
        time.sleep(0.05)
    elapsed, cut = time.perf_counter() - start, drops
    for client in (sub, spy):
        client.loop_stop()
        client.disconnect()
    true = sum(p.startswith(b"true") for p in got)
    placeholders = sum(p.startswith(b"{") for p in got)
    print(f"  {path.name}: {cut} disconnects in {elapsed:.1f} s; {true} true messages, "
          f"{placeholders} placeholders handed on")  # fmt: skip
    return cut, true, placeholders


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--size", type=int, default=8, help="MiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mqtt", choices=("5", "311"), default="5")
    parser.add_argument("--against", type=Path, help="another tree whose proxy is measured too")
    parser.add_argument("--lies", type=int, default=0, help="false digests (0: none)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-broadcast-"))
    data = os.urandom(args.size * MiB)
    payload = work / "firmware.bin"
    payload.write_bytes(data)
    seaweed = SeaweedFS().start()
    broker = Mosquitto(max_packet_size=262144, extra_config="set_tcp_nodelay true").start()
    raised = Mosquitto(max_packet_size=64 * MiB, extra_config="set_tcp_nodelay true").start()
    bucket = f"bench-broadcast-{uuid.uuid4().hex[:8]}"
    make_bucket(seaweed, bucket)
    rows: list[dict[str, object]] = []
    print(f"load average at start: {_load()}; {args.devices} devices, {args.size} MiB")
    try:
        with (
            gateway_process(seaweed, bucket, broker=broker) as gw,
            proxies_of(broker, gw.url, args.against) as proxies,
        ):
            paths = [Route("straight", raised.port), *proxies]
            times: dict[str, list[Round]] = {p.name: [] for p in paths}
            for number in range(args.rounds):
                for path in paths[number % len(paths) :] + paths[: number % len(paths)]:
                    result = _round(args, path, payload, data, gw.metrics_url)
                    times[path.name].append(result)
                    print(f"  round {number + 1} {path.name}: {result.seconds:.2f} s, gateway "
                          f"served {result.served:.2f} payloads, RSS +{result.growth:.0f} MiB "
                          f"(load {_load()})")  # fmt: skip
            rows.extend(_summary(args, times))
            if args.lies:
                print(f"{args.lies} false digests, each followed by a true message:")
                for path in proxies:
                    drops, _, _ = _lies(args, broker, path)
                    if path.name == str(ROOT):
                        metric = f"disconnects of a subscriber under {args.lies} false digests"
                        rows.append(absolute_row("broadcast", metric, drops, "", "0", drops == 0))
    finally:
        broker.close()
        raised.close()
        seaweed.close()
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average at end: {_load()}")
    emit(rows)


def _summary(args: argparse.Namespace, times: dict[str, list[Round]]) -> list[dict[str, object]]:
    straight = min(r.seconds for r in times["straight"])
    rows: list[dict[str, object]] = []
    for name, rounds in times.items():
        if name == "straight":
            print(f"straight to mosquitto (raised limit): best {straight:.2f} s")
            continue
        best = min(r.seconds for r in rounds)
        served = max(r.served for r in rounds)
        growth = max(r.growth for r in rounds)
        label = "this tree" if name == str(ROOT) else name
        # Each round's own ratio: the paths of a round run back to back, under one load.
        paired = [r.seconds / s.seconds for r, s in zip(rounds, times["straight"], strict=True)]
        print(f"through offload-proxy ({label}): best {best:.2f} s = {best / straight:.2f} x "
              f"straight's best (median {statistics.median(r.seconds for r in rounds):.2f} s; "
              f"each round against its own straight: {', '.join(f'{x:.2f}' for x in paired)}, "
              f"median {statistics.median(paired):.2f}); gateway served up to {served:.2f} "
              f"payloads a round; proxy RSS up to +{growth:.0f} MiB")  # fmt: skip
        if name != str(ROOT):
            continue
        metric = f"{args.size} MiB to {args.devices} devices, straight (raised limit) -> proxy"
        rows.append(row("broadcast", metric, straight, best, "s", "<= 1.5",
                        higher_is_better=False, limit=1.5))  # fmt: skip
        rows.append(absolute_row("broadcast", "payloads the gateway served a round", served,
                                 "", "<= 2", served <= 2))  # fmt: skip
        rows.append(absolute_row("broadcast", "proxy RSS growth", growth, "MiB", "<= 200",
                                 growth <= 200))  # fmt: skip
    return rows


@contextmanager
def proxies_of(broker: Mosquitto, endpoint: str, against: Path | None) -> Iterator[list[Route]]:
    with offload_proxy(broker, endpoint, ROOT) as this:
        if against is None:
            yield [this]
            return
        with offload_proxy(broker, endpoint, against.resolve()) as other:
            yield [this, other]


if __name__ == "__main__":
    main()
