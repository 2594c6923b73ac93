"""One account floods, another's small messages still pass: account B's latency under
account A's flood, straight to mosquitto and through `offload-proxy` in the same run
(issue 50, "Every account gets its turn").

Account A floods small QoS 0 PUBLISHes (32-byte payloads, as fast as each socket takes
them) from 4 addresses (127.0.0.2-5, one process each), and one subscriber of A's
(127.0.0.6) takes them all; account B publishes a 64-byte QoS 1 message every 20 ms from
127.0.0.7 to its own subscriber on 127.0.0.8 (QoS 1, each PUBACKed). B's latency is from
the publisher's write to the subscriber's read of the whole PUBLISH (one process, one
clock). Printed per path: B's p50 and p99, B's messages lost, duplicated or out of order,
the flood's rate, the share of the time mosquitto and the relay ran and waited, runnable,
for a CPU (/proc/<pid>/schedstat: on 2 cores the flood's extra hops can take them all),
and B's p99 through the proxy over B's p99 straight (the goal: <= 2).

    python bench/proxy_flood.py [--rounds 3] [--seconds 15] [--nodelay] [--against DIR]
    python bench/proxy_flood.py --quiet        # also B without the flood, per path
    python bench/proxy_flood.py --rate 10000   # each flooder at a set pace
    python bench/proxy_flood.py --unsubscribed # nobody takes A's flood
    python bench/proxy_flood.py --no-haproxy   # without HAProxy's path

HAProxy in TCP mode (its default threads) is measured beside them, a relay in C: the share
of B's latency any hop adds on the machine at hand, where the flood's relayed bytes cost
CPU the broker shares. mosquitto 2 runs at its defaults (256 KiB limit, no
`set_tcp_nodelay`: `--nodelay` sets it) and allows anonymous logins: the user name is the
account (proxy/_account.py). No gateway: nothing is offloaded.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import socket
import statistics
import struct
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import emit, info_row, row
from proxy_relay import broker, haproxy, offload_proxy

from _wire import packet, read_packet, text

FLOODERS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
FLOOD_SUB, VICTIM_PUB, VICTIM_SUB = "127.0.0.6", "127.0.0.7", "127.0.0.8"
FLOOD_PAYLOAD = 32
VICTIM_SIZE = 64
EVERY = 0.020
#: What B's latency through the proxy may be, against straight to mosquitto (issue 50).
GOAL = 2.0


def connect(port: int, source: str, user: str) -> socket.socket:
    """An MQTT 5 client from `source` logged in as `user` (its account), CONNACK read."""
    sock = socket.create_connection(("127.0.0.1", port), 10, source_address=(source, 0))
    ident = f"{user}-{uuid.uuid4().hex[:8]}"
    body = text("MQTT") + bytes([5, 0x82]) + (0).to_bytes(2, "big") + b"\x00"
    sock.sendall(packet(0x10, body + text(ident) + text(user)))
    first, answer = read_packet(sock, bytearray())
    if first != 0x20 or answer[1] != 0:
        raise ConnectionError(f"CONNACK {answer.hex()}")
    return sock


def subscribe(sock: socket.socket, topic: str, qos: int) -> bytearray:
    sock.sendall(packet(0x82, b"\x00\x01\x00" + text(topic) + bytes([qos])))
    buf = bytearray()
    first, _ = read_packet(sock, buf)
    if first != 0x90:
        raise ConnectionError("no SUBACK")
    return buf


def _flood(port: int, source: str, topic: str, rate: int, stop: object, sent: object) -> None:
    """Account A: QoS 0 PUBLISHes, `rate` a second (0: as fast as the socket takes them, in
    64 KiB writes; else a write each millisecond or so of what is due)."""
    sock = connect(port, source, "account-a")
    one = packet(0x30, text(topic) + b"\x00" + bytes(FLOOD_PAYLOAD))
    most = 65536 // len(one)
    batch = one * most
    n = 0
    start = time.perf_counter()
    try:
        while not stop.is_set():  # type: ignore[attr-defined]
            count = most
            if rate:
                due = int((time.perf_counter() - start) * rate) - n
                if due <= 0:
                    time.sleep(0.001)
                    continue
                count = min(due, most)
            sock.sendall(batch[: count * len(one)])
            n += count
    except OSError:
        pass
    sent.value = n  # type: ignore[attr-defined]
    sock.close()


def _drain(port: int, topic: str, ready: object, stop: object, got: object) -> None:
    """Account A's subscriber: takes every byte of the flood as it comes."""
    sock = connect(port, FLOOD_SUB, "account-a")
    subscribe(sock, topic, 0)
    ready.set()  # type: ignore[attr-defined]
    sock.settimeout(0.5)
    total = 0
    while not stop.is_set():  # type: ignore[attr-defined]
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            continue
        if not data:
            break
        total += len(data)
    got.value = total  # type: ignore[attr-defined]
    sock.close()


@dataclass
class Flood:
    sent: int
    received_bytes: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds else 0.0


@contextmanager
def flood(port: int, tag: str, *, rate: int = 0, subscribed: bool = True) -> Iterator[list[Flood]]:
    """Account A's 4 flooders and its subscriber (`subscribed`), each a process of its own."""
    ctx = multiprocessing.get_context("fork")
    topic = f"flood/{tag}"
    stop, ready = ctx.Event(), ctx.Event()
    got = ctx.Value("q", 0)
    sink = ctx.Process(target=_drain, args=(port, f"{topic}/#", ready, stop, got), daemon=True)
    sinks = [sink] if subscribed else []
    for p in sinks:
        p.start()
    if sinks and not ready.wait(30):
        raise RuntimeError("the flood's subscriber did not subscribe")
    counts = [ctx.Value("q", 0) for _ in FLOODERS]
    procs = [
        ctx.Process(
            target=_flood, args=(port, a, f"{topic}/{i}", rate, stop, counts[i]), daemon=True
        )
        for i, a in enumerate(FLOODERS)
    ]
    start = time.perf_counter()
    for p in procs:
        p.start()
    out: list[Flood] = []
    try:
        time.sleep(1.0)  # the flood at full pace before B is measured
        yield out
    finally:
        stop.set()
        for p in (*procs, *sinks):
            p.join(30)
            if p.is_alive():
                p.kill()
        out.append(Flood(sum(c.value for c in counts), got.value, time.perf_counter() - start))


@dataclass
class Victim:
    latencies: list[float]  # seconds, in the order received
    sent: int
    lost: int
    duplicated: int
    out_of_order: int
    unacked: int

    def quantile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def victim(port: int, tag: str, seconds: float) -> Victim:
    """Account B: a 64-byte QoS 1 PUBLISH every 20 ms, each timed to its subscriber."""
    topic = f"victim/{tag}"
    sub = connect(port, VICTIM_SUB, "account-b")
    buf = subscribe(sub, topic, 1)
    pub = connect(port, VICTIM_PUB, "account-b")
    arrived: list[tuple[int, float]] = []
    acked: set[int] = set()
    done = threading.Event()

    def receive() -> None:
        sub.settimeout(0.2)
        while not done.is_set():
            try:
                first, body = read_packet(sub, buf)
            except TimeoutError:
                continue
            now = time.perf_counter()
            if first >> 4 != 3:
                continue
            at = 2 + int.from_bytes(body[:2], "big")
            packet_id = body[at : at + 2]
            props = body[at + 2]  # a property block of under 128 bytes
            seq, sent_at = struct.unpack_from("!Qd", body, at + 3 + props)
            arrived.append((seq, now - sent_at))
            sub.sendall(b"\x40\x02" + packet_id)

    def acks() -> None:
        pub.settimeout(0.2)
        pbuf = bytearray()
        while not done.is_set():
            try:
                first, body = read_packet(pub, pbuf)
            except TimeoutError:
                continue
            if first >> 4 == 4:
                acked.add(int.from_bytes(body[:2], "big"))

    threads = [threading.Thread(target=f, daemon=True) for f in (receive, acks)]
    for t in threads:
        t.start()
    head = text(topic)
    n = int(seconds / EVERY)
    next_at = time.perf_counter()
    for seq in range(n):
        next_at += EVERY
        pause = next_at - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        packet_id = seq % 65535 + 1
        payload = struct.pack("!Qd", seq, time.perf_counter())
        body = head + packet_id.to_bytes(2, "big") + b"\x00" + payload
        body += bytes(VICTIM_SIZE - len(payload))
        pub.sendall(packet(0x32, body))
    deadline = time.perf_counter() + 5
    while len(arrived) < n and time.perf_counter() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # the last PUBACKs
    done.set()
    for t in threads:
        t.join(5)
    for sock in (pub, sub):
        sock.sendall(b"\xe0\x00")
        sock.close()
    seqs = [s for s, _ in arrived]
    return Victim(
        latencies=[lat for _, lat in arrived],
        sent=n,
        lost=n - len(set(seqs)),
        duplicated=len(seqs) - len(set(seqs)),
        out_of_order=sum(1 for a, b in itertools.pairwise(seqs) if b < a),
        unacked=n - len(acked & {s % 65535 + 1 for s in range(n)}),
    )


def _schedstat(pid: int) -> tuple[int, int]:
    """Nanoseconds `pid`'s main thread has run, and waited runnable for a CPU (HAProxy's
    other threads are not counted)."""
    ran, waited, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(ran), int(waited)


@dataclass
class Sched:
    """What mosquitto and the relay did with the CPU while B was measured: the share of the
    time each ran and each waited, runnable, for a CPU (2 cores: when the flood's hops
    take them all, every process in B's path waits its turn of the kernel's scheduler)."""

    pids: dict[str, int]
    start: dict[str, tuple[int, int]] = field(default_factory=dict)
    at: float = 0.0
    shares: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __enter__(self) -> Sched:
        self.start = {name: _schedstat(pid) for name, pid in self.pids.items()}
        self.at = time.perf_counter()
        return self

    def __exit__(self, *_: object) -> None:
        seconds = (time.perf_counter() - self.at) * 1e9
        for name, pid in self.pids.items():
            ran, waited = _schedstat(pid)
            before = self.start[name]
            self.shares[name] = ((ran - before[0]) / seconds, (waited - before[1]) / seconds)

    def __str__(self) -> str:
        return ", ".join(
            f"{name} ran {ran:.2f} waited {waited:.2f}"
            for name, (ran, waited) in self.shares.items()
        )


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0, help="B's messages per round")
    parser.add_argument("--nodelay", action="store_true", help="mosquitto's set_tcp_nodelay")
    parser.add_argument("--quiet", action="store_true", help="also B without the flood")
    parser.add_argument("--unsubscribed", action="store_true", help="no subscriber takes A's flood")
    parser.add_argument(
        "--rate", type=int, default=0, help="each flooder's messages/s (0: as fast as it can)"
    )
    parser.add_argument("--against", type=Path, help="another tree's proxy, measured too")
    parser.add_argument("--no-haproxy", action="store_true", help="leave HAProxy's path out")
    args = parser.parse_args()
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-flood-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    print(f"load average at start: {_load()}")
    results: dict[str, list[Victim]] = {}
    quiet: dict[str, list[Victim]] = {}
    floods: dict[str, list[Flood]] = {}
    with ExitStack() as stack:
        brk = stack.enter_context(broker(work, nodelay=args.nodelay))
        paths = {"straight": (brk.port, {"mosquitto": brk.proc.pid})}
        if not args.no_haproxy:  # a relay in C beside it: what any hop costs here
            port, proc = stack.enter_context(haproxy([brk.port]))
            paths["haproxy"] = (port, {"mosquitto": brk.proc.pid, "haproxy": proc.pid})
        port, proc = stack.enter_context(offload_proxy(brk.port))
        paths["proxy"] = (port, {"mosquitto": brk.proc.pid, "proxy": proc.pid})
        if args.against is not None:
            port, proc = stack.enter_context(offload_proxy(brk.port, root=args.against.resolve()))
            paths[f"proxy@{args.against.name}"] = (
                port,
                {"mosquitto": brk.proc.pid, "proxy": proc.pid},
            )
        for r in range(args.rounds):
            for name, (port, pids) in paths.items():
                tag = uuid.uuid4().hex[:8]
                if args.quiet:
                    calm = victim(port, tag, args.seconds / 3)
                    quiet.setdefault(name, []).append(calm)
                with (
                    flood(port, tag, rate=args.rate, subscribed=not args.unsubscribed) as flooded,
                    Sched(pids) as sched,
                ):
                    got = victim(port, tag, args.seconds)
                results.setdefault(name, []).append(got)
                floods.setdefault(name, []).append(flooded[0])
                print(f"  round {r + 1}: {name:>12} B p50 {_ms(got.quantile(0.5))}, p99"
                      f" {_ms(got.quantile(0.99))}, {len(got.latencies)}/{got.sent} arrived"
                      f" (lost {got.lost}, duplicated {got.duplicated}, out of order"
                      f" {got.out_of_order}, unacked {got.unacked}); flood"
                      f" {flooded[0].rate:,.0f} msg/s; {sched}; load {_load()}",
                      flush=True)  # fmt: skip
    print(f"load average at end: {_load()}")
    emit(_report(results, quiet, floods))


def _report(
    results: dict[str, list[Victim]],
    quiet: dict[str, list[Victim]],
    floods: dict[str, list[Flood]],
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    p99 = {name: statistics.median(v.quantile(0.99) for v in vs) for name, vs in results.items()}
    for name, vs in results.items():
        p50 = statistics.median(v.quantile(0.5) for v in vs)
        lost = sum(v.lost + v.out_of_order for v in vs)
        rate = statistics.median(f.rate for f in floods[name])
        calm = ""
        if name in quiet:
            calm = f"; without the flood p99 {_ms(statistics.median(v.quantile(0.99) for v in quiet[name]))}"  # noqa: E501
        print(f"{name:>12}: B p50 {_ms(p50)}, p99 {_ms(p99[name])} (median of rounds) ="
              f" {p99[name] / p99['straight']:.2f} x straight; B lost or reordered {lost};"
              f" flood {rate:,.0f} msg/s{calm}")  # fmt: skip
    rows.append(row("proxy flood", "B's p99 under A's flood: straight -> offload-proxy",
                    p99["straight"] * 1e3, p99["proxy"] * 1e3, "ms", f"<= {GOAL}",
                    higher_is_better=False, limit=GOAL))  # fmt: skip
    if "haproxy" in p99:
        rows.append(info_row("proxy flood", "B's p99 under A's flood: straight -> HAProxy",
                             p99["straight"] * 1e3, p99["haproxy"] * 1e3, "ms"))  # fmt: skip
    for name in results:
        if name.startswith("proxy@"):
            rows.append(info_row("proxy flood", f"B's p99 under A's flood: {name} -> this tree",
                                 p99[name] * 1e3, p99["proxy"] * 1e3, "ms"))  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
