"""A reconnect storm: straight to mosquitto and through `offload-proxy`, in one run (issue 50).

After a proxy deploy or a network outage every device of a fleet connects again at once.
`--devices` devices (5,000) from `--addresses` loopback addresses (50: 127.0.x.y), at most
`--window` of them (1,000) connecting at a time: each opens a TCP connection, writes an
MQTT 5 CONNECT (clean start, its own client id, the same ids every round: a reconnect),
reads the CONNACK whole and checks its reason code is 0, then stays connected; the next
device starts as soon as one has its CONNACK. A storm's rate is the devices accepted over
the time from the first SYN to the last CONNACK. The paths alternate within each round,
every device disconnecting (DISCONNECT, then close) between them, and each path's ratio is
taken against straight in the same round (the median round's is the result row): other
work on the machine moves the rates of a round together.

Printed per path: CONNACKs/s, the ratio against straight, the kernel's listen-queue
overflows during the storm (`ListenOverflows` of /proc/net/netstat: each costs a device a
1 s SYN retry; the counter is the whole machine's, and other work on it counts too), how
many devices waited a second or more, and the relay's CPU per connect. Then, with
`--held 2000,9000`, the proxy's CPU per connect while that many other devices stay
connected through it, for `--cycles` (2,000) devices that connect and leave (CONNECT,
CONNACK, DISCONNECT, 50 at a time) and for `--burst` (500) that connect at once and stay,
three times: it must not grow with the connections held.

    python bench/proxy_storm.py [--rounds 3] [--devices 5000] [--window 1000]
    python bench/proxy_storm.py --workers 2           # also offload-proxy --workers 2
    python bench/proxy_storm.py --against /tmp/main   # also the proxy of another tree
    python bench/proxy_storm.py --held 2000,9000 --rounds 1
    python bench/proxy_storm.py --profile /tmp/prof   # py-spy of the proxy's storms
    python bench/proxy_storm.py --mqtt 311             # MQTT 3.1.1 devices

The devices are `--clients` processes (2) of uvloop on raw sockets (tests/_storm.py), each
a share of the window; mosquitto 2 as bench/proxy_relay.py runs it (its own listen backlog
is 100: straight, a storm overflows it too). The machine's cores are shared with
everything else on it: compare ratios within a run, never absolute rates across runs. The
open-file limit is raised to the hard one.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.connection
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from _harness import CpuMeter, emit, info_row, py_spy, row
from proxy_relay import broker, offload_proxy

from _storm import Devices, Storm, devices_for


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def listen_overflows() -> int:
    """The kernel's count of connections dropped because a listen queue was full."""
    lines = [line.split() for line in Path("/proc/net/netstat").read_text().splitlines()]
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names[0] == "TcpExt:":
            return int(values[names.index("ListenOverflows")])
    return 0


def accept_queues(ports: set[int]) -> dict[int, int]:
    """The connections waiting in each listening socket's accept queue, by port (the
    `rx_queue` of a LISTEN line of /proc/net/tcp)."""
    queues: dict[int, int] = {}
    with open("/proc/net/tcp") as lines:
        next(lines)
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":
                break  # the listening sockets come first, then the connections
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if port in ports:
                queues[port] = queues.get(port, 0) + int(fields[4].split(":")[1], 16)
    return queues


class QueuePeaks:
    """The longest accept queue of each of `ports` seen while it runs (sampled every 5 ms):
    a queue at its listener's backlog drops what comes next."""

    def __init__(self, ports: dict[str, int]) -> None:
        self.ports = ports
        self.peaks = dict.fromkeys(ports, 0)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        by_port = {port: name for name, port in self.ports.items()}
        while not self._done.wait(0.005):
            for port, length in accept_queues(set(by_port)).items():
                name = by_port[port]
                self.peaks[name] = max(self.peaks[name], length)

    def stop(self) -> dict[str, int]:
        self._done.set()
        self._thread.join(5)
        return self.peaks


def _device_process(pipe: multiprocessing.connection.Connection) -> None:
    """Serve the parent's commands: ("storm", port, devices, window, mqtt, keep),
    ("release",), ("quit",)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    devices = Devices()
    while True:
        command = pipe.recv()
        if command[0] == "storm":
            pipe.send(loop.run_until_complete(devices.storm(*command[1:])))
        elif command[0] == "release":
            pipe.send(loop.run_until_complete(devices.release(*command[1:])))
        else:
            return


class Fleet:
    """`clients` device processes, each given its share of the devices and the window."""

    def __init__(self, clients: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes = []
        self.procs = []
        for _ in range(clients):
            parent, child = context.Pipe()
            proc = context.Process(target=_device_process, args=(child,), daemon=True)
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)

    def storm(
        self, port: int, devices: list[tuple[str, str]], window: int, mqtt: str, keep: bool = True
    ) -> Storm:
        n = len(self.pipes)
        for i, pipe in enumerate(self.pipes):
            share = window // n + (1 if i < window % n else 0)
            pipe.send(("storm", port, devices[i::n], max(share, 1), mqtt, keep))
        parts: list[Storm] = [pipe.recv() for pipe in self.pipes]
        total = Storm(start=min(p.start for p in parts), last=max(p.last for p in parts))
        for part in parts:
            total.add(part)
        return total

    def release(self, last: int | None = None) -> int:
        """Every held device, or each process's `last` that connected."""
        for pipe in self.pipes:
            pipe.send(("release", last))
        return sum(pipe.recv() for pipe in self.pipes)

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(("quit",))
        for proc in self.procs:
            proc.join(30)


# -- the paths and the measurements ----------------------------------------------------------


@dataclass
class Route:
    name: str
    port: int
    pids: dict[str, int]  # the relay processes whose CPU counts (children included)
    listeners: dict[str, int] = field(default_factory=dict)  # accept queues watched


@dataclass
class Result:
    storm: Storm
    overflows: int
    cpu: dict[str, float]
    queues: dict[str, int]  # the longest accept queue of each listener

    @property
    def rate(self) -> float:
        return self.storm.accepted / max(self.storm.last - self.storm.start, 1e-9)

    @property
    def slow(self) -> int:
        """Devices that waited a second or more: a SYN retried at least once."""
        return sum(1 for wait in self.storm.waits if wait >= 1.0)


def run_storm(
    fleet: Fleet, path: Route, devices: list[tuple[str, str]], args: argparse.Namespace
) -> Result:
    meter = CpuMeter(**path.pids)
    before, overflows = meter.read(), listen_overflows()
    peaks = QueuePeaks(path.listeners)
    storm = fleet.storm(path.port, devices, args.window, args.mqtt)
    overflows = listen_overflows() - overflows
    queues = peaks.stop()
    cpu = CpuMeter.spent(before, meter.read())
    fleet.release()
    time.sleep(1.0)  # the broker and the proxy see the DISCONNECTs and close
    return Result(storm, overflows, cpu, queues)


def held_cost(
    fleet: Fleet, path: Route, held: int, args: argparse.Namespace
) -> tuple[float, float]:
    """The proxy's CPU (ms) per connect while `held` other devices stay connected: for
    `--cycles` devices that connect and leave (CONNECT, CONNACK, DISCONNECT), 50 at a
    time, and for `--burst` devices connecting at once (the window) and staying, three
    times over (each burst leaves before the next)."""
    fleet.storm(path.port, devices_for(held, args.addresses, "held"), args.window, args.mqtt)
    time.sleep(2.0)  # the held ones settle
    meter = CpuMeter(**path.pids)
    before = meter.read()
    cycles = devices_for(args.cycles, args.addresses, "cycle")
    done = fleet.storm(path.port, cycles, 50, args.mqtt, keep=False).accepted
    cycle = sum(CpuMeter.spent(before, meter.read()).values()) / max(done, 1) * 1e3
    spent, done = 0.0, 0
    for i in range(3):
        time.sleep(0.5)
        before = meter.read()
        burst = devices_for(args.burst, args.addresses, f"burst{i}")
        done += fleet.storm(path.port, burst, args.window, args.mqtt).accepted
        spent += sum(CpuMeter.spent(before, meter.read()).values())
        fleet.release(last=args.burst // len(fleet.pipes))
    fleet.release()
    time.sleep(1.0)
    return cycle, spent / max(done, 1) * 1e3


@contextmanager
def _profiled(where: Path | None, path: Route, round_: int, native: bool = False) -> Iterator[None]:
    pid = path.pids.get("proxy")
    if where is None or pid is None or round_ != 0:
        yield
        return
    name = path.name.replace(" ", "_").replace("/", "_")
    with py_spy(pid, where / f"storm-{name}.txt", native=native):
        yield


def _line(name: str, r: Result) -> str:
    s = r.storm
    cpu = ", ".join(f"{k} {v / max(s.accepted, 1) * 1e3:.2f}" for k, v in r.cpu.items())
    refused = f", refused {s.refused}" if s.refused else ""
    failed = f", failed {s.failed}" if s.failed else ""
    p99 = statistics.quantiles(s.waits, n=100)[98] if len(s.waits) > 1 else 0.0
    return (
        f"{name:>16} {r.rate:7,.0f} CONNACKs/s ({s.accepted} in {s.last - s.start:.2f} s"
        f"{refused}{failed}; overflows {r.overflows}, longest accept queue {r.queues}; waited"
        f" >= 1 s {r.slow}, p99 wait {p99:.2f} s; CPU per connect {cpu} ms)"
    )


def _paths(stack: ExitStack, brk_port: int, brk_pid: int, args: argparse.Namespace) -> list[Route]:
    broker = {"mosquitto": brk_port}
    paths = [Route("straight", brk_port, {"mosquitto": brk_pid}, broker)]
    port, proc = stack.enter_context(offload_proxy(brk_port))
    paths.append(Route("proxy", port, {"proxy": proc.pid}, {"proxy": port, **broker}))
    if args.against is not None:
        port, proc = stack.enter_context(offload_proxy(brk_port, root=args.against.resolve()))
        name = f"proxy@{args.against.name}"
        paths.append(Route(name, port, {"proxy": proc.pid}, {"proxy": port, **broker}))
    if args.workers > 1:
        port, proc = stack.enter_context(offload_proxy(brk_port, workers=args.workers))
        name = f"--workers {args.workers}"
        paths.append(Route(name, port, {"proxy": proc.pid}, {"proxy": port, **broker}))
    return paths


def _report(results: dict[str, list[Result]]) -> list[dict[str, object]]:
    """Per path: the best storm, and the ratio against straight in each round (the two ran
    one after the other: the load other work puts on the machine moves both). The rows
    are the round whose ratio is the median."""
    best = {name: max(rs, key=lambda r: r.rate) for name, rs in results.items()}
    straight = results["straight"]
    rows = []
    for name, runs in results.items():
        ratios = [r.rate / s.rate for r, s in zip(runs, straight, strict=True)]
        middle = sorted(range(len(runs)), key=lambda i: ratios[i])[len(runs) // 2]
        b = best[name]
        print(f"{name:>16}: best {b.rate:7,.0f} CONNACKs/s; x straight in each round"
              f" {', '.join(f'{x:.2f}' for x in ratios)} (median {ratios[middle]:.2f});"
              f" overflows per storm {[r.overflows for r in runs]}")  # fmt: skip
        if name == "straight":
            continue
        target = ">= 0.5" if name == "proxy" else "info"
        rows.append(row("proxy storm", f"CONNACKs/s: straight -> {name} (median round)",
                        straight[middle].rate, runs[middle].rate, "conn/s", target,
                        higher_is_better=True, limit=0.5 if name == "proxy" else 0.0))  # fmt: skip
    return rows


def _held(
    fleet: Fleet, paths: list[Route], counts: list[int], args: argparse.Namespace
) -> list[dict[str, object]]:
    """CPU per connect with each count held, per proxy path; rows for the first count
    against the last (the goal: no growth)."""
    rows = []
    for p in paths:
        cost = {}
        for held in counts:
            cost[held] = held_cost(fleet, p, held, args)
            print(f"{p.name:>16}: CPU per connect with {held} held: {cost[held][0]:.3f} ms"
                  f" connecting and leaving, {cost[held][1]:.3f} ms {args.burst} at once"
                  f" (load {_load()})", flush=True)  # fmt: skip
        if len(counts) > 1:
            first, last = counts[0], counts[-1]
            for i, kind in enumerate(("connect and leave", "at once")):
                rows.append(info_row("proxy storm", f"{p.name}: CPU per connect ({kind}),"
                                     f" {first} -> {last} held", cost[first][i], cost[last][i],
                                     "ms"))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--devices", type=int, default=5000)
    parser.add_argument("--addresses", type=int, default=50)
    parser.add_argument("--window", type=int, default=1000, help="devices connecting at once")
    parser.add_argument("--clients", type=int, default=2, help="device processes")
    parser.add_argument("--workers", type=int, default=1, help="also offload-proxy --workers N")
    parser.add_argument("--against", type=Path, help="another tree's proxy, measured too")
    parser.add_argument("--held", default="", help="CPU per connect with N held: 2000,9000")
    parser.add_argument("--cycles", type=int, default=2000, help="--held: connect and leave")
    parser.add_argument("--burst", type=int, default=500, help="--held: connect at once, x 3")
    parser.add_argument("--mqtt", default="5", choices=["5", "311"])
    parser.add_argument("--profile", type=Path, help="py-spy the proxy into this directory")
    parser.add_argument("--native", action="store_true", help="--profile's native frames too")
    args = parser.parse_args()
    if args.profile is not None and shutil.which("py-spy") is None:
        parser.error("--profile needs py-spy on PATH: pip install py-spy")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the servers inherit it
    need = args.devices + max((int(n) for n in args.held.split(",") if n), default=0)
    if hard < 2 * need + 1000:
        print(f"warning: open-file limit {hard}: the proxy may hold fewer than {need} devices")
    somaxconn = Path("/proc/sys/net/core/somaxconn").read_text().strip()
    print(f"load average at start: {_load()}; somaxconn {somaxconn}; open-file limit {hard}")
    work = Path(tempfile.mkdtemp(prefix="bench-storm-"))
    rows: list[dict[str, object]] = []
    fleet = Fleet(args.clients)
    try:
        with ExitStack() as stack:
            brk = stack.enter_context(broker(work))
            paths = _paths(stack, brk.port, brk.proc.pid, args)
            devices = devices_for(args.devices, args.addresses, "d")
            results: dict[str, list[Result]] = {p.name: [] for p in paths}
            for r in range(args.rounds):
                for p in paths:
                    with _profiled(args.profile, p, r, args.native):
                        result = run_storm(fleet, p, devices, args)
                    results[p.name].append(result)
                    print(f"  round {r + 1}: {_line(p.name, result)}; load {_load()}", flush=True)
            rows += _report(results)
            rows += _held(fleet, paths[1:], [int(n) for n in args.held.split(",") if n], args)
    finally:
        fleet.close()
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average at end: {_load()}")
    emit(rows)


if __name__ == "__main__":
    sys.exit(main())
