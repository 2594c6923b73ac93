"""Benchmark 8: telemetry latency while 16 MiB messages flow (head-of-line blocking).

One subscriber on `hol/#`; one producer sends 100-byte messages every 10 ms on `hol/small`
while another sends 6 x 16 MiB (QoS 1, one after the other) on `hol/big`. Two systems,
measured in the same run:

* baseline: plain paho on both ends through a mosquitto with its limit raised (none set):
  every 16 MiB PUBLISH travels through the broker, and the telemetry queues behind it;
* claim check: `client.Client` on both ends through a mosquitto limited to 256 KiB, the big
  payloads offloaded to `offload-gateway` on SeaweedFS and fetched by the subscriber's pool
  while the telemetry on its own topic is delivered (per-topic order, issue 15);
* claim check with direct transfers (`--no-direct` skips it): the same through a second
  gateway started with `OFFLOAD_S3_PUBLIC_URL`, on its own 256 KiB broker, found by
  discovery: the payloads go from the producer to SeaweedFS and from SeaweedFS to the
  subscriber, the gateway only grants, commits and redirects.

The subscriber runs as its own process (this script with `--subscriber`) and stamps each
small message's latency (receive wall clock minus the send time inside the payload); every
large message's SHA-256 is checked against what was sent. Printed: p50/p99 of the small
messages' latency for each system per run, their medians over `--runs` runs (the systems
alternate, so all see the same machine) and, for each claim-check system, the ratio of its
median p99 to the baseline's (target <= 0.10).
The floor: beside each claim-check subscriber, on the same broker in the same run, a plain
paho subscriber (no fetching, no claim-check code) stamps the same small messages; its p99,
printed and reported as an info row against the same baseline, is what the machine allows
any subscriber while the transfer runs (SeaweedFS, the gateway and the producer share the
two cores with it). The client's p99 can only be judged against that floor.
Telemetry comes from its own process (another device); `--same-process` sends it from a
thread of the large messages' producer instead, which adds that process's upload work (GIL)
to the claim check's telemetry latency.

Where the claim check's tail comes from (2 cores, November 2026; `--worst 5` prints, per
run, when the large messages arrived and when the slowest small ones were sent): before 25
November, among the slowest samples were the first telemetry messages, sent before any large
one: paho leaves Nagle's algorithm on, and the second small PUBLISH after connecting waited
for mosquitto's delayed ACK (31-33 ms, every time; `bench/telemetry_latency.py`), which alone
made a p99 of ~30 ms out of ~220 samples. `MqttConnection` now sets TCP_NODELAY. What is left
sits where an upload starts and where large messages arrive: a thread in the subscriber that
sleeps 1 ms at a time overslept by 15-60 ms at those moments, also while the subscriber had
nothing to do (an upload starting): the two cores were busy with SeaweedFS, the gateway and
both clients' transfers. Renicing SeaweedFS and the gateway to 15 took the median p99 from
~30 to ~20 ms (ratio ~0.18): CPU on shared cores, which a deployment with the store and the
gateway on other machines does not pay.

    python bench/hol.py
    python bench/hol.py --runs 1 --big 4 --size-mib 8
    python bench/hol.py --worst 6   # when the slowest samples were sent
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from _harness import ROOT, MiB, Mosquitto, SeaweedFS, emit, gateway_process, make_bucket, row

NODELAY = "set_tcp_nodelay true"
NAMES = {
    "paho": "raised-limit mosquitto + paho",
    "client": "claim check (Client)",
    "direct": "claim check, direct transfers",
}
SMALL = 100
PERIOD = 0.010


def _stamp() -> bytes:
    return f"{time.time():.6f}".encode().ljust(SMALL, b" ")


# -- subscriber process ---------------------------------------------------------------------


def subscriber(kind: str, broker: str, endpoint: str | None, big: int) -> None:
    """Print READY once subscribed, then one JSON line: latencies (s) and big SHA-256s."""
    lat: list[float] = []
    marks: list[tuple[float, float]] = []  # (sent, received); sent -1: a large message
    bigs: list[bytes] = []
    done = threading.Event()

    def seen(topic: str, payload: bytes) -> None:
        now = time.time()
        if topic == "hol/small":
            if payload == b"END":
                if len(bigs) >= big:
                    done.set()
            else:
                lat.append(now - float(payload))
                marks.append((float(payload), now))
        else:
            marks.append((-1.0, now))
            # Hashed at the end: hashing 16 MiB here would hold up the next small message
            # in the application's own loop, for either system.
            bigs.append(payload)
        if len(bigs) >= big and ended.is_set():
            done.set()

    ended = threading.Event()
    if kind == "paho":
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        host, port = broker.removeprefix("mqtt://").rsplit(":", 1)
        sub = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        subscribed = threading.Event()
        sub.on_subscribe = lambda *a: subscribed.set()

        def on_message(c: object, u: object, msg: mqtt.MQTTMessage) -> None:
            if msg.topic == "hol/small" and msg.payload == b"END":
                ended.set()
            seen(msg.topic, bytes(msg.payload))

        sub.on_message = on_message
        sub.connect(host, int(port))
        sub.loop_start()
        sub.subscribe("hol/#", 1)
        subscribed.wait(10)
        print("READY", flush=True)
        done.wait(600)
        sub.loop_stop()
    else:
        from client import Client, Message

        with Client(broker, endpoint=endpoint) as client:
            client.subscribe("hol/#", 1)
            print("READY", flush=True)
            deadline = time.monotonic() + 600
            while not done.is_set() and time.monotonic() < deadline:
                item = client.next_message(5)
                if isinstance(item, Message):
                    if item.topic == "hol/small" and item.payload == b"END":
                        ended.set()
                    seen(item.topic, item.payload)
                elif item is not None:
                    print(f"error: {item}", file=sys.stderr)
    shas = [hashlib.sha256(b).hexdigest() for b in bigs]
    print(json.dumps({"latency": lat, "big": shas, "marks": marks}), flush=True)


# -- producers ------------------------------------------------------------------------------


Publish = Callable[[bytes], None]


def _publishers(kind: str, broker: str, endpoint: str | None) -> tuple[Publish, Publish, Publish]:
    """(small, big, close) for plain paho or the project's Client."""
    if kind == "paho":
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        host, port = broker.removeprefix("mqtt://").rsplit(":", 1)
        pubs = []
        for _ in range(2):
            p = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
            p.connect(host, int(port))
            p.loop_start()
            pubs.append(p)

        def close(_: bytes = b"") -> None:
            for p in pubs:
                p.disconnect()
                p.loop_stop()

        return (
            lambda body: pubs[0].publish("hol/small", body, 0).wait_for_publish(10),
            lambda body: pubs[1].publish("hol/big", body, 1).wait_for_publish(120),
            close,
        )
    from client import Client

    small_c = Client(broker, endpoint=endpoint)
    big_c = Client(broker, endpoint=endpoint)
    small_c.connect()
    big_c.connect()

    def close_clients(_: bytes = b"") -> None:
        small_c.close()
        big_c.close()

    def small(body: bytes) -> None:
        small_c.publish("hol/small", body, qos=0)

    def big(body: bytes) -> None:
        big_c.publish("hol/big", body, qos=1, timeout=120)

    return small, big, close_clients


def _tick(small: Publish, stop: threading.Event) -> None:
    next_at = time.monotonic()
    while not stop.is_set():
        small(_stamp())
        next_at += PERIOD
        time.sleep(max(0.0, next_at - time.monotonic()))
    small(b"END")


def ticker(kind: str, broker: str, endpoint: str | None) -> None:
    """The telemetry producer as its own process: ticks until its stdin closes."""
    small, _, close = _publishers(kind, broker, endpoint)
    stop = threading.Event()
    thread = threading.Thread(target=_tick, args=(small, stop))
    print("READY", flush=True)
    thread.start()
    sys.stdin.read()
    stop.set()
    thread.join()
    time.sleep(0.2)
    close(b"")


def _child(role: str, kind: str, broker: Mosquitto, endpoint: str | None, big: int) -> Any:
    cmd = [sys.executable, __file__, role, kind, "--broker", broker.url, "--big", str(big)]
    cmd += ["--endpoint", endpoint] if endpoint else []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "READY"
    return child


def _worst(marks: list[list[float]], count: int) -> str:
    """When the large messages arrived and the slowest small ones were sent, ms from the
    first arrival (where a tail comes from: start-up, a fetch, an upload)."""
    t0 = min(received for _, received in marks)
    bigs = [round((received - t0) * 1000) for sent, received in marks if sent < 0]
    small = sorted((m for m in marks if m[0] >= 0), key=lambda m: m[0] - m[1])[:count]
    slow = [f"{(s - t0) * 1000:.0f}: {(r - s) * 1000:.1f}" for s, r in small]
    return f"large at {bigs}; slowest small (sent at: latency) {', '.join(slow)}"


def _run(
    kind: str,
    broker: Mosquitto,
    endpoint: str | None,
    payloads: list[bytes],
    same: bool,
    worst: int = 0,
) -> tuple[list[float], list[float]]:
    """Latencies (ms) of the subscriber's small messages, and of the floor's (claim check)."""
    sub = _child("--subscriber", kind, broker, endpoint, len(payloads))
    # The floor: a plain paho subscriber beside the client, on the same broker in the same
    # run. It fetches nothing, so its tail is what the machine allows any subscriber.
    floor = None if kind == "paho" else _child("--subscriber", "paho", broker, None, len(payloads))
    small, big, close = _publishers(kind, broker.url, endpoint)
    stop = threading.Event()
    tick = None
    if same:  # telemetry from a thread of the process that sends the large messages
        tick = threading.Thread(target=_tick, args=(small, stop), daemon=True)
        tick.start()
    else:  # telemetry from its own process, as from another device
        tick = _child("--ticker", kind, broker, endpoint, len(payloads))
    time.sleep(0.5)
    for body in payloads:
        big(body)
    time.sleep(0.5)
    if isinstance(tick, threading.Thread):
        stop.set()
        tick.join()
    else:
        tick.communicate(timeout=60)
    out, _ = sub.communicate(timeout=600)
    floor_out = floor.communicate(timeout=600)[0] if floor is not None else ""
    close(b"")
    result = json.loads(out.strip().splitlines()[-1])
    if worst:
        print(f"  {kind}: {_worst(result['marks'], worst)}")
    sent = [hashlib.sha256(b).hexdigest() for b in payloads]
    if sorted(result["big"]) != sorted(sent):
        raise SystemExit(f"{kind}: large messages not delivered intact ({len(result['big'])})")
    beside = json.loads(floor_out.strip().splitlines()[-1])["latency"] if floor_out else []
    return [x * 1000 for x in result["latency"]], [x * 1000 for x in beside]


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--subscriber", choices=["paho", "client"])
    parser.add_argument("--ticker", choices=["paho", "client"])
    parser.add_argument(
        "--same-process",
        action="store_true",
        help="send telemetry from a thread of the large messages' producer process",
    )
    parser.add_argument("--broker")
    parser.add_argument("--endpoint")
    parser.add_argument("--big", type=int, default=6)
    parser.add_argument("--size-mib", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3, help="runs per system (medians)")
    parser.add_argument("--no-direct", action="store_true", help="skip the direct-transfer runs")
    parser.add_argument(
        "--worst", type=int, default=0, metavar="N", help="print each run's N slowest samples"
    )
    args = parser.parse_args()
    if args.subscriber:
        subscriber(args.subscriber, args.broker, args.endpoint, args.big)
        return
    if args.ticker:
        ticker(args.ticker, args.broker, args.endpoint)
        return
    payloads = [os.urandom(args.size_mib * MiB) for _ in range(args.big)]
    seaweed = SeaweedFS().start()
    raised = Mosquitto(extra_config=NODELAY).start()
    limited = Mosquitto(max_packet_size=262144, extra_config=NODELAY).start()
    # Its own broker: the direct gateway's discovery record reaches only its clients.
    direct_broker = Mosquitto(max_packet_size=262144, extra_config=NODELAY).start()
    public = {"OFFLOAD_S3_PUBLIC_URL": f"http://{seaweed.endpoint}"}
    bucket = f"hol-{uuid.uuid4().hex[:8]}"
    p99s: dict[str, list[float]] = {name: [] for name in NAMES}
    p50s: dict[str, list[float]] = {name: [] for name in NAMES}
    floors: dict[str, list[float]] = {name: [] for name in NAMES}
    try:
        make_bucket(seaweed, bucket)
        with (
            gateway_process(seaweed, bucket, broker=limited) as gw,
            gateway_process(seaweed, bucket, broker=direct_broker, extra_env=public),
        ):
            systems = [("paho", "paho", raised, gw.url), ("client", "client", limited, gw.url)]
            if not args.no_direct:  # found by discovery, with the store it advertises
                systems.append(("direct", "client", direct_broker, ""))
            for run in range(1, args.runs + 1):  # the systems alternate: same conditions
                for name, kind, broker, endpoint in systems:
                    lat, beside = _run(
                        kind, broker, endpoint or None, payloads, args.same_process, args.worst
                    )
                    p50s[name].append(_pct(lat, 50))
                    p99s[name].append(_pct(lat, 99))
                    note = ""
                    if beside:
                        floors[name].append(_pct(beside, 99))
                        note = f" (plain paho beside it: p99 {floors[name][-1]:.1f} ms)"
                    p50, p99 = p50s[name][-1], p99s[name][-1]
                    print(f"run {run} {NAMES[name]}: {len(lat)} small messages, "
                          f"p50 {p50:.1f} ms, p99 {p99:.1f} ms{note}")  # fmt: skip
    finally:
        direct_broker.close()
        limited.close()
        raised.close()
        seaweed.close()
    b50, b99 = statistics.median(p50s["paho"]), statistics.median(p99s["paho"])
    rows = []
    for name in [n for n, v in p99s.items() if v and n != "paho"]:
        c50, c99 = statistics.median(p50s[name]), statistics.median(p99s[name])
        f99 = statistics.median(floors[name])
        print(f"median of {args.runs}: {NAMES['paho']} p50 {b50:.1f} ms p99 {b99:.1f} ms; "
              f"{NAMES[name]} p50 {c50:.1f} ms p99 {c99:.1f} ms; p99 ratio {c99 / b99:.3f} "
              f"(target <= 0.10); the plain subscriber beside it p99 {f99:.1f} ms, ratio "
              f"{f99 / b99:.3f}; {args.big} x {args.size_mib} MiB intact")  # fmt: skip
        which = "" if name == "client" else f", {NAMES[name]}"
        flow = f"{args.big} x {args.size_mib} MiB flow{which}"
        rows += [
            row("8 head-of-line", f"telemetry p99 while {flow}",
                b99, c99, "ms", "<= 0.10", higher_is_better=False, limit=0.10),
            row("8 head-of-line", f"telemetry p50 (info){which}", b50, c50, "ms", "-",
                higher_is_better=False, limit=float("inf")),
            row("8 head-of-line", f"floor: a plain paho subscriber beside it, p99 (info){which}",
                b99, f99, "ms", "info", higher_is_better=False, limit=float("inf")),
        ]  # fmt: skip
        rows[-1]["met"] = None
    emit(rows)


if __name__ == "__main__":
    main()
