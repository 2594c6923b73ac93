"""The full chaos soak (issue 29, point 4): nothing acknowledged is lost while anything restarts.

    python bench/soak.py [--duration 300] [--seed 1]

Real parts only, each its own process: a 256 KiB mosquitto with persistence on, SeaweedFS,
and two `offload-gateway` replicas sharing one `OFFLOAD_AUTH_SECRET`. Four producers publish
QoS 1 messages of 1 KiB to 4 MiB (log-uniform): producers 0 and 2 offload through replica A,
producer 1 through replica B, producer 3 has no endpoint and no offload, so everything over
the broker's limit goes in ADR-23 chunks (an offloading producer also falls back to chunks
while its replica is down). Four persistent-session consumers (fixed client ids,
`session_expiry`, QoS 1; consumers 0 and 2 on replica A, 1 and 3 on B) subscribe to all;
1 and 3 read slowly while the producers run (`slow` seconds a message, 8 taken ahead), so
they fall behind and the broker holds a backlog in their sessions when it restarts (last in
each round).

Meanwhile, in turn, for `--duration` seconds: the broker is restarted gracefully (SIGTERM:
mosquitto saves its sessions and queues; same port), each replica is SIGKILLed and started
again on the same port, and SeaweedFS is SIGKILLed and started again on the same data dir and
ports. After each fault the soak waits until it recovered before the next: every producer
the part serves has had a publish that needed the part (any for the broker, an offloaded one
for a replica or the store) start after the part was back and return. The time to recover is
from the fault to that moment.

Every payload carries its own id and the SHA-256 of the rest (`encode`/`decode`), so the
check is independent of the library: every publish that returned must reach every consumer
intact at least once; a payload whose digest does not match is corrupt; a second delivery is
a duplicate, counted and reported. mosquitto's per-client queue limit is lifted
(`max_queued_messages 0`): at its default of 1000 the broker itself drops QoS 1 messages for
a consumer that falls behind, which is a broker setting, not what this soak is about.

`run()` is also what tests/test_soak.py runs at a smaller scale.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import random
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT / "tests", ROOT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from client import Client, Message, MessageError, OffloadError, Route  # noqa: E402
from gateway.storage import S3Store  # noqa: E402

from _gateway import GatewayProcess  # noqa: E402
from _servers import Mosquitto, SeaweedFS  # noqa: E402

KiB = 1024
MiB = 1024 * KiB
BROKER_LIMIT = 256 * KiB
MAGIC = b"SOAK1"
HEADER = struct.Struct(">5sBI32s")  # magic, producer, sequence, SHA-256 of the body
# The broker last in each round: by then the slow consumers have a backlog at the broker.
KINDS = ("gateway-a", "gateway-b", "store", "broker")
PRODUCER_GATEWAY = {0: "a", 1: "b", 2: "a", 3: None}  # 3: no endpoint, chunks
CONSUMER_GATEWAY = {0: "a", 1: "b", 2: "a", 3: "b"}


def encode(producer: int, seq: int, size: int, rng: random.Random) -> tuple[str, bytes, str]:
    """A payload of `size` bytes carrying its id and its body's digest: (id, payload, digest)."""
    body = rng.randbytes(max(size - HEADER.size, 0))
    digest = hashlib.sha256(body).digest()
    return f"p{producer}-{seq}", HEADER.pack(MAGIC, producer, seq, digest) + body, digest.hex()


def decode(payload: bytes) -> tuple[str, str] | None:
    """(id, digest) of an intact payload; None when it is not one of ours or is corrupt."""
    if len(payload) < HEADER.size:
        return None
    magic, producer, seq, digest = HEADER.unpack_from(payload)
    if magic != MAGIC or hashlib.sha256(memoryview(payload)[HEADER.size :]).digest() != digest:
        return None
    return f"p{producer}-{seq}", digest.hex()


@dataclass
class Figures:
    seconds: float = 0.0
    published: dict[str, str] = field(default_factory=dict)  # id -> digest, publish returned
    failed: int = 0  # publishes that raised: nothing promised
    routes: Counter[str] = field(default_factory=Counter)
    delivered: dict[int, dict[str, int]] = field(default_factory=dict)  # consumer -> id -> n
    corrupt: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    restarts: Counter[str] = field(default_factory=Counter)
    recover: dict[str, list[float]] = field(default_factory=dict)  # kind -> seconds
    backlog: list[int] = field(default_factory=list)  # most undelivered at each broker restart
    duplicate_routes: Counter[str] = field(default_factory=Counter)  # how the repeats came
    connections: dict[int, int] = field(default_factory=dict)  # consumer -> MQTT connections
    drained: float = 0.0  # seconds from the last publish until every consumer had everything

    def missing(self, consumer: int) -> set[str]:
        return set(self.published) - set(self.delivered[consumer])

    def duplicates(self, consumer: int) -> int:
        return sum(n - 1 for n in self.delivered[consumer].values())

    def lines(self) -> list[str]:
        out = [
            f"soak {self.seconds:.0f} s: published {len(self.published)} "
            f"({', '.join(f'{k} {v}' for k, v in sorted(self.routes.items()))}), "
            f"publishes that raised {self.failed}; consumers done {self.drained:.0f} s after "
            "the last publish",
        ]
        for c in sorted(self.delivered):
            out.append(
                f"  consumer {c}: delivered {len(set(self.delivered[c]) & set(self.published))}"
                f"/{len(self.published)}, duplicates {self.duplicates(c)}, "
                f"missing {len(self.missing(c))}, connections {self.connections.get(c)}"
            )
        out.append(
            f"  corrupt {len(self.corrupt)}, delivery errors {len(self.errors)}, duplicates by "
            f"route {dict(self.duplicate_routes)}"
        )
        if self.backlog:
            out.append(
                f"  messages not yet delivered to the slowest consumer at each broker restart: "
                f"max {max(self.backlog)}, min {min(self.backlog)}"
            )
        for kind in KINDS:
            times = self.recover.get(kind, [])
            worst = f"{max(times):.1f} s" if times else "-"
            out.append(f"  {kind}: restarts {self.restarts[kind]}, max time to recover {worst}")
        return out


@dataclass
class _Publish:
    producer: int
    route: Route
    started: float
    ended: float


class Soak:
    """The servers, the clients and the fault loop of one soak run."""

    def __init__(
        self, *, seed: int = 1, max_size: int = 4 * MiB, pause: float = 0.3, slow: float = 0.08
    ) -> None:
        self.seed = seed
        self.max_size = max_size
        self.pause = pause  # seconds a producer waits between publishes
        self.slow = slow  # seconds consumers 1 and 3 spend on each message
        self.figures = Figures()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.stop_consumers = threading.Event()
        self.ok: list[_Publish] = []
        self.state = Path(tempfile.mkdtemp(prefix="offload-soak-"))
        self.state.chmod(0o777)  # mosquitto run as root writes as its own user
        self.broker = Mosquitto(
            max_packet_size=BROKER_LIMIT,
            extra_config=f"persistence true\npersistence_location {self.state}/\n"
            "max_queued_messages 0\n",
        )
        self.store = SeaweedFS()
        self.gateways: dict[str, GatewayProcess] = {}

    # -- servers ---------------------------------------------------------------------------

    def start(self) -> None:
        self.broker.start()
        self.store.start()
        S3Store(
            self.store.endpoint,
            "soak",
            access_key=self.store.access_key,
            secret_key=self.store.secret_key,
        ).ensure_bucket()
        env = {
            "OFFLOAD_STORAGE_URL": self.store.storage_url("soak"),
            "OFFLOAD_S3_ACCESS_KEY": self.store.access_key,
            "OFFLOAD_S3_SECRET_KEY": self.store.secret_key,
            "OFFLOAD_AUTH_SECRET": os.urandom(32).hex(),
            "OFFLOAD_SWEEP_INTERVAL": "0",
            "OFFLOAD_LOG_LEVEL": "WARNING",
            "OFFLOAD_ALLOW_ANONYMOUS": "true",
        }
        for name in ("a", "b"):
            self.gateways[name] = GatewayProcess(env).start()

    def close(self) -> None:
        for gw in self.gateways.values():
            gw.kill()
        self.broker.close()
        self.store.close()
        shutil.rmtree(self.state, ignore_errors=True)

    def fault(self, kind: str) -> None:
        if kind == "broker":
            self.broker.restart()  # SIGTERM: sessions and queues saved; same port
        elif kind == "store":
            assert self.store.proc is not None
            os.killpg(self.store.proc.pid, signal.SIGKILL)
            self.store.proc.wait()
            self.store.proc = None
            self.store.start()  # same ports, same data dir
        else:
            gw = self.gateways[kind[-1]]
            gw.kill()  # SIGKILL
            gw.start()  # same port

    def _needed(self, kind: str, p: _Publish) -> bool:
        if kind == "broker":
            return True
        if p.route is not Route.OFFLOADED:
            return False
        return kind == "store" or PRODUCER_GATEWAY[p.producer] == kind[-1]

    def recovered(self, kind: str, since: float) -> bool:
        with self.lock:
            done = {p.producer for p in self.ok if p.started >= since and self._needed(kind, p)}
        wanted = (
            set(PRODUCER_GATEWAY)
            if kind == "broker"
            else {
                n for n, g in PRODUCER_GATEWAY.items() if g and (kind == "store" or g == kind[-1])
            }
        )
        return wanted <= done

    # -- clients ---------------------------------------------------------------------------

    def produce(self, n: int) -> None:
        rng = random.Random(self.seed * 100 + n)
        gw = PRODUCER_GATEWAY[n]
        settings: dict[str, object] = {"client_id": f"soak-p{n}", "http_timeout": 10}
        if gw is None:
            settings["automatic_offload"] = False  # everything over 256 KiB in chunks
        else:
            settings["endpoint"] = self.gateways[gw].url
        with Client(self.broker.url, **settings) as pub:  # type: ignore[arg-type]
            seq = 0
            while not self.done.is_set():
                seq += 1
                size = int(KiB * (self.max_size / KiB) ** rng.random())
                mid, payload, digest = encode(n, seq, size, rng)
                started = time.monotonic()
                try:
                    result = pub.publish(f"soak/p{n}", payload, qos=1, timeout=30)
                except OffloadError:
                    with self.lock:
                        self.figures.failed += 1  # not acknowledged: nothing promised
                else:
                    with self.lock:
                        self.figures.published[mid] = digest
                        fell_back = gw is not None and result.route is Route.CHUNKED
                        route = (
                            "chunked after a failed offload" if fell_back else result.route.value
                        )
                        self.figures.routes[route] += 1
                        self.ok.append(_Publish(n, result.route, started, time.monotonic()))
                self.done.wait(self.pause)

    def consumer(self, n: int) -> Client:
        urls = ",".join(gw.url for gw in self.gateways.values())
        return Client(
            self.broker.url,
            endpoint=self.gateways[CONSUMER_GATEWAY[n]].url,
            discovery_allowlist=urls,  # placeholders from either replica
            client_id=f"soak-c{n}",
            session_expiry=3600,
            fetch_retry_for=120,
            # The slow ones take few ahead (the MQTT 5 Receive Maximum): the rest waits in
            # their sessions at the broker, through its restarts.
            max_pending_deliveries=8 if n % 2 else 1000,
        )  # type: ignore[arg-type]

    def consume(self, n: int, client: Client) -> None:
        seen = self.figures.delivered[n]
        while not self.stop_consumers.is_set():
            item = client.next_message(0.5)
            if isinstance(item, MessageError):
                with self.lock:
                    self.figures.errors.append(f"consumer {n}: {item.message_id}: {item.error}")
            elif isinstance(item, Message):
                decoded = decode(item.payload)
                with self.lock:
                    if decoded is None:
                        self.figures.corrupt.append(f"consumer {n}: {item.message_id}")
                    else:
                        seen[decoded[0]] = seen.get(decoded[0], 0) + 1
                        if seen[decoded[0]] > 1:
                            self.figures.duplicate_routes[item.route.value] += 1
                        if self.figures.published.get(decoded[0], decoded[1]) != decoded[1]:
                            self.figures.corrupt.append(f"consumer {n}: {decoded[0]}")
                if n % 2 and not self.done.is_set():  # slow while the producers run
                    time.sleep(self.slow)

    # -- the run ---------------------------------------------------------------------------

    def run(
        self,
        duration: float,
        *,
        rounds: int = 1,
        gap: float = 5.0,
        drain: float = 180.0,
        log: Callable[[str], None] = print,
    ) -> Figures:
        """Fault in turn for `duration` seconds and at least `rounds` rounds of every kind."""
        f = self.figures
        consumers = {n: self.consumer(n) for n in CONSUMER_GATEWAY}
        threads = []
        for n, c in consumers.items():
            f.delivered[n] = {}
            c.connect()
            c.subscribe("soak/#", 1)
            threads.append(threading.Thread(target=self.consume, args=(n, c), daemon=True))
        producers = [
            threading.Thread(target=self.produce, args=(n,), daemon=True) for n in PRODUCER_GATEWAY
        ]
        for t in threads + producers:
            t.start()
        started = time.monotonic()
        try:
            while (
                time.monotonic() - started < duration or min(f.restarts[k] for k in KINDS) < rounds
            ):
                for kind in KINDS:
                    self.done.wait(gap)  # traffic between faults
                    if kind == "broker":
                        with self.lock:
                            f.backlog.append(max(len(f.missing(n)) for n in consumers))
                    fault = time.monotonic()
                    self.fault(kind)
                    back = time.monotonic()
                    f.restarts[kind] += 1
                    while not self.recovered(kind, back) and time.monotonic() - back < 180:
                        time.sleep(0.1)
                    took = time.monotonic() - fault
                    f.recover.setdefault(kind, []).append(took)
                    log(
                        f"{back - started:6.1f} s  {kind} back after {back - fault:.1f} s, "
                        f"recovered after {took:.1f} s"
                    )
            f.seconds = time.monotonic() - started
            self.done.set()
            for t in producers:
                t.join(60)
            stopped = time.monotonic()
            while any(f.missing(n) for n in consumers) and time.monotonic() - stopped < drain:
                time.sleep(0.5)
            f.drained = time.monotonic() - stopped
        finally:
            self.done.set()
            self.stop_consumers.set()
            for t in threads:
                t.join(10)
            for n, c in consumers.items():
                f.connections[n] = c.connection.connections
                c.close()
        return f


def main() -> None:
    # Not one warning per publish that falls back to chunks while a part is down: the
    # figures count them ("chunked after a failed offload").
    logging.getLogger("client").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of faults")
    parser.add_argument("--gap", type=float, default=5.0, help="seconds of traffic between")
    parser.add_argument("--pause", type=float, default=0.3, help="seconds between publishes")
    parser.add_argument("--slow", type=float, default=0.08, help="seconds a message, slow ones")
    parser.add_argument("--drain", type=float, default=600, help="most seconds to wait at the end")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    soak = Soak(seed=args.seed, pause=args.pause, slow=args.slow)
    try:
        soak.start()
        f = soak.run(args.duration, gap=args.gap, drain=args.drain)
    finally:
        soak.close()
    for line in f.lines():
        print(line)
    for problem in f.corrupt[:20] + f.errors[:20]:
        print("  ", problem)
    lost = {c: sorted(f.missing(c))[:20] for c in f.delivered if f.missing(c)}
    if lost:
        print("  LOST (first 20 per consumer):", lost)
    sys.exit(1 if lost or f.corrupt else 0)


if __name__ == "__main__":
    main()
