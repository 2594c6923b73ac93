"""Small messages relayed: straight to mosquitto, through HAProxy (TCP mode) and through
`offload-proxy`, in one run, alternating, best of `--rounds` (issue 44).

The workload is the issue's: 4 `mosquitto_pub -l` publishers (5,000 lines of 1,000 bytes
each, one topic each) and 4 `mosquitto_sub`, at QoS 1 and at QoS 0. A run's rate is the
messages the subscribers got over the time from the publishers' start to the last message
in. Printed per path: messages/s, the ratio against straight and against HAProxy, and the
CPU each relay spent per message (utime + stime from /proc, children included).

    python bench/proxy_relay.py [--rounds 3] [--qos 1,0] [--lines 5000]
    python bench/proxy_relay.py --against /tmp/base   # also the proxy of another tree
    python bench/proxy_relay.py --mqtt 311             # MQTT 3.1.1 clients (the tools' default)
    python bench/proxy_relay.py --broker defaults      # mosquitto at its defaults only
    python bench/proxy_relay.py --fleet                # also the fleet paths below
    python bench/proxy_relay.py --profile /tmp/prof    # py-spy of offload-proxy, per QoS
    python bench/proxy_relay.py --connects 500 --qos ""   # CPU per connect, with a PROXY
                                                          # header (the gate) and without

`--fleet` adds the paths of a fleet larger than one process: HAProxy sending PROXY v2 to
one offload-proxy, the same HAProxy balancing over two offload-proxy processes, and one
`offload-proxy --workers 2` straight (against the single process straight); `--only-fleet`
measures those, straight and the single process only.

Every path is measured twice (`--broker both`, the default): against a mosquitto with
`set_tcp_nodelay true`, then against one at its defaults (Nagle's algorithm on its sockets,
as most brokers are run; issue 50), each with its own HAProxy and proxies in front.

Real programs only: mosquitto 2 (256 KiB limit, no per-packet logging),
HAProxy 2.6 (Debian's `haproxy`; scripts/_bootstrap.sh installs it with the test peers),
the mosquitto clients and `offload-proxy` as its own process. No gateway: nothing is over
the limit and nothing is a placeholder, so the proxy relays every packet.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from _harness import ROOT, CpuMeter, emit, info_row, py_spy, row

from _haproxy import HAProxy
from _haproxy import Route as HaRoute
from _servers import free_port, mqtt_answers, wait_for_port, wait_until

PAIRS = 4
SIZE = 1000
#: A subscriber that has had nothing for this long after its publisher ended is done (QoS 0
#: may lose messages; none were lost in the runs recorded).
QUIET = 2.0


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@dataclass
class Broker:
    """mosquitto without `-v`: verbose logging writes two lines per message relayed."""

    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def subscribed(self, ident: str) -> bool:
        return f" {ident} " in self.log.read_text(errors="replace")


@contextmanager
def broker(work: Path, *, nodelay: bool = True) -> Iterator[Broker]:
    """mosquitto on a free port; `nodelay`: with `set_tcp_nodelay true` (else its default,
    Nagle's algorithm on its sockets)."""
    port = free_port()
    log = work / "mosquitto.log"
    conf = work / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\npersistence false\nallow_anonymous true\n"
        "max_packet_size 262144\n"
        + ("set_tcp_nodelay true\n" if nodelay else "")
        + f"log_dest file {log}\nlog_type error\nlog_type warning\nlog_type subscribe\n"
    )
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    # mosquitto started as root runs as the user `mosquitto`: its log must be writable to it.
    # A file, not stdout: mosquitto's stdout is block-buffered into a file.
    log.touch(mode=0o666)
    log.chmod(0o666)
    work.chmod(0o755)
    proc = subprocess.Popen([binary, "-c", str(conf)], stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: mqtt_answers(port), f"mosquitto on {port}", 10, proc)
        yield Broker(port, proc, log)
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def haproxy(
    upstreams: list[int], *, send_proxy: str = ""
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """HAProxy in TCP mode in front of `upstreams` (round robin); `send_proxy` is
    `send-proxy` or `send-proxy-v2` (a PROXY header to each upstream) or empty."""
    lb = HAProxy({"relay": HaRoute(tuple(upstreams), send_proxy)}).start()
    try:
        assert lb.proc is not None
        yield lb.ports["relay"], lb.proc
    finally:
        lb.close()


@contextmanager
def offload_proxy(
    broker_port: int, *, root: Path = ROOT, workers: int = 1, trusted: str = ""
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env.update(
        {
            "PYTHONPATH": str(root),
            "OFFLOAD_PROXY_LOG_LEVEL": "WARNING",
            "OFFLOAD_PROXY_ENDPOINT": "http://127.0.0.1:9",  # never reached: nothing offloaded
        }
    )
    if trusted:
        env["OFFLOAD_PROXY_TRUSTED_LBS"] = trusted
    args = ["--broker", f"mqtt://127.0.0.1:{broker_port}", "--port", str(port)]
    if workers > 1:
        args += ["--workers", str(workers)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", *args], env=env, stdout=subprocess.PIPE, cwd=root
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # "listening": printed once every worker listens
        wait_for_port(port, 60, proc)
        yield port, proc
    finally:
        proc.terminate()
        proc.wait(60)


@dataclass
class Route:
    """One way from the clients to mosquitto, and the relay processes whose CPU counts."""

    name: str
    port: int
    relays: dict[str, int] = field(default_factory=dict)  # name -> pid


@dataclass
class Run:
    received: int
    seconds: float
    cpu: dict[str, float]

    @property
    def rate(self) -> float:
        return self.received / self.seconds


def _counter(stream: object, counts: list[int], times: list[float], i: int) -> None:
    """Count the lines `mosquitto_sub` prints (one per message), noting when the last came."""
    fd = stream.fileno()  # type: ignore[attr-defined]
    while True:
        data = os.read(fd, 1 << 16)
        if not data:
            return
        counts[i] += data.count(b"\n")
        times[i] = time.perf_counter()


def _tool(program: str, port: int, qos: int, topic: str, ident: str, mqtt: str) -> list[str]:
    return [program, "-h", "127.0.0.1", "-p", str(port), "-V", mqtt, "-q", str(qos),
            "-t", topic, "-i", ident]  # fmt: skip


def measure(path: Route, brk: Broker, lines: Path, n: int, qos: int, mqtt: str = "5") -> Run:
    tag = uuid.uuid4().hex[:8]
    topics = [f"bench/relay/{tag}/{i}" for i in range(PAIRS)]
    subs = []
    for i, topic in enumerate(topics):
        ident = f"rsub-{tag}-{i}"
        command = [*_tool("mosquitto_sub", path.port, qos, topic, ident, mqtt), "-C", str(n)]
        subs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
        wait_until(lambda ident=ident: brk.subscribed(ident), f"{ident} subscribed", 30)
    counts, times = [0] * PAIRS, [0.0] * PAIRS
    readers = [
        threading.Thread(target=_counter, args=(s.stdout, counts, times, i), daemon=True)
        for i, s in enumerate(subs)
    ]
    for t in readers:
        t.start()
    meter = CpuMeter(**{name: pid for name, pid in path.relays.items()})
    before = meter.read()
    with ExitStack() as stack:
        inputs = [stack.enter_context(lines.open("rb")) for _ in topics]
        start = time.perf_counter()
        pubs = [
            subprocess.Popen(
                [*_tool("mosquitto_pub", path.port, qos, topic, f"rpub-{tag}-{i}", mqtt), "-l"],
                stdin=inputs[i],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i, topic in enumerate(topics)
        ]
        for p in pubs:
            p.wait(300)
    deadline = time.perf_counter() + 300
    while sum(counts) < n * PAIRS and time.perf_counter() < deadline:
        last = max([*times, start])
        if time.perf_counter() - last > QUIET:
            break  # QoS 0 messages lost: nothing more is coming
        time.sleep(0.01)
    spent = CpuMeter.spent(before, meter.read())
    for s in subs:
        if s.poll() is None:
            s.send_signal(signal.SIGTERM)
        s.wait(30)
    for t in readers:
        t.join(30)
    received = sum(counts)
    return Run(received, max(times) - start, spent)


def _lines(work: Path, n: int) -> Path:
    path = work / "lines.txt"
    alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789"
    with path.open("wb") as out:
        for i in range(n):
            head = f"{i:08d} ".encode()
            body = (alphabet * (SIZE // len(alphabet) + 1))[: SIZE - len(head)]
            out.write(head + body + b"\n")
    return path


def _fmt_cpu(run: Run, n: int) -> str:
    return ", ".join(f"{k} {v / n * 1e6:.0f} us" for k, v in run.cpu.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--qos", default="1,0", help="QoS levels, comma-separated")
    parser.add_argument("--lines", type=int, default=5000, help="messages per publisher")
    parser.add_argument("--against", type=Path, help="another tree's proxy, measured too")
    parser.add_argument("--fleet", action="store_true", help="also the multi-process paths")
    parser.add_argument("--only-fleet", action="store_true", help="the fleet paths alone")
    parser.add_argument("--profile", type=Path, help="py-spy the proxy into this directory")
    parser.add_argument(
        "--mqtt", default="5", choices=["5", "311"], help="the clients' MQTT version"
    )
    parser.add_argument(
        "--connects", type=int, default=0, help="also CPU per connect: plain and gated"
    )
    parser.add_argument(
        "--broker",
        default="both",
        choices=["nodelay", "defaults", "both"],
        help="mosquitto with set_tcp_nodelay, at its defaults (Nagle's algorithm), or both",
    )
    args = parser.parse_args()
    if args.profile is not None and shutil.which("py-spy") is None:
        parser.error("--profile needs py-spy on PATH: pip install py-spy")
    work = Path(tempfile.mkdtemp(prefix="bench-relay-"))
    work.chmod(0o755)  # mosquitto (as its own user) writes its log in a folder below
    lines = _lines(work, args.lines)
    rows: list[dict[str, object]] = []
    print(f"load average at start: {_load()}")
    modes = ["nodelay", "defaults"] if args.broker == "both" else [args.broker]
    try:
        for mode in modes:
            print(f"mosquitto {BROKER_MODES[mode]}:")
            (work / mode).mkdir()
            rows += _measure_broker(args, work / mode, lines, mode)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average at end: {_load()}")
    emit(rows)


#: How mosquitto is run: `set_tcp_nodelay true` (Nagle's algorithm off on its sockets,
#: as the rounds before 19 ran it) or at its defaults (Nagle on).
BROKER_MODES = {"nodelay": "with set_tcp_nodelay", "defaults": "at its defaults"}


def _measure_broker(
    args: argparse.Namespace, work: Path, lines: Path, mode: str
) -> list[dict[str, object]]:
    """Every path of `args` against one mosquitto run as `mode` says; the result rows."""
    n = args.lines
    rows: list[dict[str, object]] = []
    with ExitStack() as stack:
        brk = stack.enter_context(broker(work, nodelay=mode == "nodelay"))
        paths = [Route("straight", brk.port, {"mosquitto": brk.proc.pid})]
        if not args.only_fleet:
            lb, lb_proc = stack.enter_context(haproxy([brk.port]))
            paths.append(Route("haproxy", lb, {"haproxy": lb_proc.pid}))
        port, proc = stack.enter_context(offload_proxy(brk.port))
        paths.append(Route("proxy", port, {"proxy": proc.pid}))
        if not args.only_fleet and args.against is not None:
            port, proc = stack.enter_context(offload_proxy(brk.port, root=args.against.resolve()))
            paths.append(Route(f"proxy@{args.against.name}", port, {"proxy": proc.pid}))
        if args.fleet or args.only_fleet:
            paths += _fleet(stack, brk.port)
        if args.connects:
            rows += connect_cost(stack, brk.port, args.connects, args.rounds, args.against)
        for qos in (int(q) for q in args.qos.split(",") if q):
            runs: dict[str, list[Run]] = {p.name: [] for p in paths}
            for r in range(args.rounds):
                for p in paths:
                    with _profiled(args.profile, p, qos, r, mode):
                        run = measure(p, brk, lines, n, qos, args.mqtt)
                    runs[p.name].append(run)
                    print(f"  QoS {qos} round {r + 1}: {p.name:>14} {run.rate:8,.0f} msg/s"
                          f" ({run.received}/{n * PAIRS} in {run.seconds:.2f} s; CPU per"
                          f" message: {_fmt_cpu(run, run.received)}; load {_load()})",
                          flush=True)  # fmt: skip
            label = f"QoS {qos}" + ("" if mode == "nodelay" else ", mosquitto at its defaults")
            rows += _report(label, runs)
    return rows


_CONNECT = bytes([0x10, 13, 0, 4, *b"MQTT", 5, 0x02, 0, 60, 0, 0, 0])  # MQTT 5, clean


def _v2_header() -> bytes:
    """PROXY v2, TCP over IPv4, from 198.51.100.7:4000 (what HAProxy's send-proxy-v2 sends)."""
    block = bytes([198, 51, 100, 7, 127, 0, 0, 1]) + (4000).to_bytes(2, "big")
    block += (1883).to_bytes(2, "big")
    return b"\r\n\r\n\x00\r\nQUIT\n\x21\x11" + len(block).to_bytes(2, "big") + block


def connect_cost(
    stack: ExitStack, broker_port: int, n: int, rounds: int, against: Path | None = None
) -> list[dict[str, object]]:
    """The proxy's CPU per connection (CONNECT, CONNACK, DISCONNECT, one after the other):
    the plain listener against the gate reading a PROXY v2 header first (and the plain
    listener of `against`'s proxy, when given)."""
    import socket

    plain, plain_proc = stack.enter_context(offload_proxy(broker_port))
    gated, gated_proc = stack.enter_context(offload_proxy(broker_port, trusted="127.0.0.1"))
    paths = [("plain", plain, plain_proc, b""), ("gate", gated, gated_proc, _v2_header())]
    if against is not None:
        other, other_proc = stack.enter_context(offload_proxy(broker_port, root=against.resolve()))
        paths.append((f"plain@{against.name}", other, other_proc, b""))
    cost: dict[str, list[float]] = {name: [] for name, *_ in paths}
    for r in range(rounds):
        for name, port, proc, header in paths:
            meter = CpuMeter(proxy=proc.pid)
            before = meter.read()
            for _ in range(n):
                with socket.create_connection(("127.0.0.1", port), 10) as conn:
                    conn.sendall(header + _CONNECT)
                    assert conn.recv(64)[:1] == b"\x20", "no CONNACK"
                    conn.sendall(b"\xe0\x00")  # DISCONNECT
            cost[name].append(CpuMeter.spent(before, meter.read())["proxy"] / n * 1e3)
            print(f"  connects round {r + 1}: {name:>5} {cost[name][-1]:.3f} ms CPU each"
                  f" (load {_load()})", flush=True)  # fmt: skip
    medians = {name: statistics.median(values) for name, values in cost.items()}
    print("CPU per connect (median): " + ", ".join(f"{k} {v:.3f} ms" for k, v in medians.items()))
    rows = [info_row("proxy relay", "CPU per connect, plain -> PROXY v2 gate", medians["plain"],
                     medians["gate"], "ms")]  # fmt: skip
    if against is not None:
        rows.append(info_row("proxy relay", f"CPU per connect, {against.name} -> this tree",
                             medians[f"plain@{against.name}"], medians["plain"], "ms"))  # fmt: skip
    return rows


def _fleet(stack: ExitStack, broker_port: int) -> list[Route]:
    """HAProxy with PROXY v2 in front of one proxy and of two; one proxy with 2 workers."""
    trusted = "127.0.0.1"
    one, one_proc = stack.enter_context(offload_proxy(broker_port, trusted=trusted))
    lb1, lb1_proc = stack.enter_context(haproxy([one], send_proxy="send-proxy-v2"))
    a, a_proc = stack.enter_context(offload_proxy(broker_port, trusted=trusted))
    b, b_proc = stack.enter_context(offload_proxy(broker_port, trusted=trusted))
    lb2, lb2_proc = stack.enter_context(haproxy([a, b], send_proxy="send-proxy-v2"))
    w2, w2_proc = stack.enter_context(offload_proxy(broker_port, workers=2))
    return [
        Route("lb+1 proxy", lb1, {"haproxy": lb1_proc.pid, "proxy": one_proc.pid}),
        Route(
            "lb+2 proxies",
            lb2,
            {"haproxy": lb2_proc.pid, "proxy": a_proc.pid, "proxy2": b_proc.pid},
        ),
        Route("--workers 2", w2, {"proxy": w2_proc.pid}),
    ]


@contextmanager
def _profiled(
    where: Path | None, path: Route, qos: int, round_: int, mode: str = "nodelay"
) -> Iterator[None]:
    pid = path.relays.get("proxy")
    if where is None or pid is None or round_ != 0:
        yield
        return
    name = path.name.replace(" ", "_").replace("/", "_")
    out = where / f"{name}-qos{qos}{'' if mode == 'nodelay' else '-defaults'}.txt"
    with py_spy(pid, out):
        yield


def _best(runs: list[Run]) -> Run:
    return max(runs, key=lambda r: r.rate)


def _report(qos: str, runs: dict[str, list[Run]]) -> list[dict[str, object]]:
    """Printed per path, and the result rows; `qos`: what the rows' names begin with."""
    rows: list[dict[str, object]] = []
    best = {name: _best(rs) for name, rs in runs.items()}
    straight = best["straight"].rate
    lb = best["haproxy"].rate if "haproxy" in best else None
    for name, b in best.items():
        cpu = {k: statistics.median(r.cpu[k] / r.received * 1e6 for r in runs[name])
               for k in b.cpu}  # fmt: skip
        ratio_lb = f", {b.rate / lb:.2f} x HAProxy" if lb else ""
        cpu_text = ", ".join(f"{k} {v:.0f}" for k, v in cpu.items())
        # The medians beside the best: one round of a path can be 1.5 x another on a
        # shared machine, and the medians say whether the best is typical.
        mid = {n: statistics.median(r.rate for r in rs) for n, rs in runs.items()}
        mid_lb = f", {mid[name] / mid['haproxy']:.2f}" if "haproxy" in mid else ""
        print(f"{qos} {name:>14}: best {b.rate:8,.0f} msg/s = {b.rate / straight:.2f} x"
              f" straight{ratio_lb}; median CPU per message: {cpu_text} us; median"
              f" {mid[name]:,.0f} msg/s ({mid[name] / mid['straight']:.2f}{mid_lb})")  # fmt: skip
    if "proxy" in best:
        proxy = best["proxy"].rate
        rows.append(row("proxy relay", f"{qos}: straight -> offload-proxy", straight, proxy,
                        "msg/s", ">= 1.0", higher_is_better=True, limit=1.0))  # fmt: skip
        if lb:
            rows.append(row("proxy relay", f"{qos}: HAProxy -> offload-proxy", lb, proxy,
                            "msg/s", ">= 0.75", higher_is_better=True, limit=0.75))  # fmt: skip
            rows.append(info_row("proxy relay", f"{qos}: straight -> HAProxy", straight, lb,
                                 "msg/s"))  # fmt: skip
            lb_cpu = statistics.median(r.cpu["haproxy"] / r.received * 1e6 for r in runs["haproxy"])
            px_cpu = statistics.median(r.cpu["proxy"] / r.received * 1e6 for r in runs["proxy"])
            rows.append(info_row("proxy relay", f"{qos}: CPU per message, HAProxy -> proxy",
                                 lb_cpu, px_cpu, "us"))  # fmt: skip
    if "lb+1 proxy" in best and "lb+2 proxies" in best:
        one, two = best["lb+1 proxy"].rate, best["lb+2 proxies"].rate
        rows.append(info_row("proxy fleet", f"{qos}: HAProxy+1 proxy -> HAProxy+2 proxies",
                             one, two, "msg/s"))  # fmt: skip
    if "proxy" in best and "--workers 2" in best:
        rows.append(info_row("proxy fleet", f"{qos}: 1 process -> --workers 2",
                             best["proxy"].rate, best["--workers 2"].rate, "msg/s"))  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
