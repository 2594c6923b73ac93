"""Retention by group, one object per payload, quotas (issue 52): the goals, beside today.

Each part runs the system as it is now and, in the same run, as it was before (today's
behaviour: no groups file, dedup off, no quota), on real SeaweedFS and `offload-gateway`
processes (mosquitto for the library's publishes):

* `retention`: `--groups` consumer groups each fetch and confirm `--messages` payloads
  through two replicas, one of which is SIGKILLed at random every `--kill-every` seconds
  and restarted. Counted: payloads gone before every group confirmed them (must be 0), the
  longest time from a payload's last confirmation to its deletion (goal: 60 s), what the
  bucket holds once every group confirmed (goal: its starting size; today: every payload
  until its TTL), and `--unconfirmed` payloads one group never confirms, gone at their
  expiry all the same.
* `dedup`: the same `--size` (20 MiB) published by the library to 10 topics: bucket growth
  and bytes the gateway received (goal: <= 1.1 x the payload; today: 10 x); then a
  repeated `--repeat-size` (100 MiB) publish: bytes sent the second time (goal: none).
* `cost`: what records and a ledger cost a new small payload (distinct 256 KiB uploads, 8
  clients, raw `PUT`): uploads per second and CPU per upload, gateway and store, with dedup
  off (today), on, and with a quota.
* `quota`: 12 x 8 MiB from one account, 4 at a time through two replicas, quota 50 MiB:
  bytes accepted (goal: <= 55 MiB; today: all 96), the refusals' words, another account
  unaffected.

    python bench/lifecycle.py                       # every part, the issue's sizes
    python bench/lifecycle.py --part retention --messages 200 --groups 4 --quick
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from _harness import ROOT, Mosquitto, SeaweedFS, absolute_row, emit, free_port, info_row, row

from _servers import wait_for_port

MiB = 1024 * 1024


@dataclass
class Replica:
    """`offload-gateway` on a fixed port, to SIGKILL and start again."""

    env: dict[str, str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    kills: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Replica:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "--port", str(self.port)],
            env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for_port(self.port, 60, self.proc)
        return self

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
            self.proc = None
            self.kills += 1

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None

    def metric(self, name: str) -> float:
        """A counter's total over its labels from /metrics (0 when absent)."""
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")
        )


def base_env(seaweed: SeaweedFS, bucket: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env.update(
        OFFLOAD_STORAGE_URL=seaweed.storage_url(bucket),
        OFFLOAD_S3_ACCESS_KEY=seaweed.access_key,
        OFFLOAD_S3_SECRET_KEY=seaweed.secret_key,
        OFFLOAD_LOG_LEVEL="WARNING",
        OFFLOAD_MAX_UPLOADS_PER_CLIENT="0",
        OFFLOAD_MAX_UPLOADS_PER_USER="0",
        OFFLOAD_ALLOW_ANONYMOUS="true",
        OFFLOAD_AUTH_SECRET="bench-lifecycle-secret",
        PYTHONPATH=str(ROOT),
    )
    env.update(extra)
    return env


@contextmanager
def replicas(count: int, env: dict[str, str]) -> Iterator[list[Replica]]:
    started = [Replica(dict(env)).start() for _ in range(count)]
    try:
        yield started
    finally:
        for replica in started:
            replica.stop()


def stored(seaweed: SeaweedFS, bucket: str) -> tuple[int, int]:
    """(objects, bytes) the bucket holds, the store's probes aside, and the payloads a
    killed upload left without a sidecar (the sweeper removes those once their hour
    partition is older than OFFLOAD_SWEEP_GRACE: not within a run): listed, not counted."""
    from minio import Minio

    client = Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)
    listed = {
        obj.object_name: obj.size or 0
        for obj in client.list_objects(bucket, recursive=True)
        if obj.object_name and not obj.object_name.startswith("probes/")
    }
    orphans = [
        key for key in listed
        if key.startswith("data/") and not key.endswith(".meta.json")
        and f"{key}.meta.json" not in listed
    ]  # fmt: skip
    if orphans:
        print(f"  {len(orphans)} payloads of killed uploads, never committed: {orphans[:3]}")
    kept = {k: v for k, v in listed.items() if k not in orphans}
    if 0 < len(kept) < 10:
        print(f"  left: {sorted(kept)}")
    return len(kept), sum(kept.values())


class Through:
    """Requests to whichever replica answers: one killed mid-request is tried again on
    the next (its connection refused or cut)."""

    def __init__(self, nodes: list[Replica]) -> None:
        self.nodes = nodes
        self.http = httpx.Client(timeout=30)

    def __call__(self, method: str, path: str, **kw: object) -> httpx.Response:
        for attempt in range(200):
            node = self.nodes[(attempt + random.randrange(len(self.nodes))) % len(self.nodes)]
            try:
                answer = self.http.request(method, f"{node.url}{path}", **kw)  # type: ignore[arg-type]
            except httpx.HTTPError:
                time.sleep(0.05)
                continue
            if answer.status_code < 500:
                return answer
            time.sleep(0.05)
        raise RuntimeError(f"{method} {path}: no replica answered")


# -- retention by group ------------------------------------------------------------------


@dataclass
class Retention:
    early: int = 0  # payloads gone before every group confirmed them
    longest: float = 0.0  # seconds from the last confirmation to the deletion
    left: tuple[int, int] = (0, 0)  # what the bucket holds once every group confirmed
    expired_left: int = 0  # unconfirmed payloads still there after their expiry
    kills: int = 0
    seconds: float = 0.0


def run_retention(
    seaweed: SeaweedFS, *, messages: int, groups: int, size: int, unconfirmed: int,
    kill_every: float, grouped: bool,
) -> Retention:  # fmt: skip
    bucket = f"lc-{uuid.uuid4().hex[:10]}"
    names = [f"g{i}" for i in range(groups)]
    groups_file = Path(tempfile.mkdtemp()) / "groups.toml"
    groups_file.write_text(f'[topics]\n"bench/#" = {names!r}\n'.replace("'", '"'))
    extra = {"OFFLOAD_CONFIRM_SWEEP_INTERVAL": "5", "OFFLOAD_SWEEP_INTERVAL": "10",
             "OFFLOAD_SWEEP_GRACE": "30"}  # fmt: skip
    if grouped:
        extra["OFFLOAD_RETENTION_GROUPS_FILE"] = str(groups_file)
    result = Retention()
    started = time.monotonic()
    with replicas(2, base_env(seaweed, bucket, **extra)) as nodes:
        call = Through(nodes)
        stop = threading.Event()
        killer = threading.Thread(target=_killer, args=(nodes, kill_every, stop), daemon=True)
        killer.start()
        ids: list[str] = []
        for i in range(messages + unconfirmed):
            message_id = str(uuid.uuid4())
            ttl = 30 if i >= messages else 3600
            answer = call("PUT", f"/msg/{message_id}", params={"topic": f"bench/{i % 7}",
                          "ttl": ttl}, content=os.urandom(size))  # fmt: skip
            assert answer.status_code == 201, answer.text
            ids.append(message_id)
        expiring_at = time.monotonic() + 30
        watching = threading.Event()
        gone_at: dict[str, float] = {}
        watcher = threading.Thread(
            target=_watch, args=(seaweed, bucket, ids[:messages], gone_at, watching), daemon=True
        )
        watcher.start()
        last: dict[str, float] = {}
        lock = threading.Lock()
        confirmed: dict[str, int] = dict.fromkeys(ids, 0)

        def consume(group: str) -> int:
            early = 0
            # The short-lived ones first (all groups but the last confirm them, well within
            # their 30 s), then the rest in an order of the group's own.
            order = ids[:messages]
            random.shuffle(order)
            if group != names[-1]:
                order = ids[messages:] + order
            for message_id in order:
                fetched = call("GET", f"/msg/{message_id}/payload")
                if fetched.status_code != 200:
                    early += 1
                    print(f"gone early: {message_id}: {fetched.text[:200]}", flush=True)
                    continue
                done = call("POST", f"/msg/{message_id}/confirm", params={"group": group})
                with lock:
                    confirmed[message_id] += 1
                    if confirmed[message_id] == groups:
                        last[message_id] = time.monotonic()
                assert done.status_code in (200, 404), done.text
            return early

        with ThreadPoolExecutor(groups) as pool:
            result.early = sum(pool.map(consume, names))
        stop.set()
        killer.join()
        result.kills = sum(n.kills for n in nodes)
        deadline = time.monotonic() + 120
        while grouped and len(gone_at) < len(last) and time.monotonic() < deadline:
            time.sleep(0.5)
        watching.set()
        watcher.join()
        if grouped:
            delays = [gone_at.get(m, float("inf")) - at for m, at in last.items()]
            result.longest = max(delays, default=0.0)
        else:
            result.longest = float("nan")
        # Expiry, then sweeps past the grace period: what a kill left half-done is finished.
        time.sleep(max(0.0, expiring_at - time.monotonic()) + 45)
        result.expired_left = _present(seaweed, bucket, ids[messages:])
        result.left = stored(seaweed, bucket)
    result.seconds = time.monotonic() - started
    return result


def _killer(nodes: list[Replica], every: float, stop: threading.Event) -> None:
    while not stop.wait(random.uniform(0.5, 1.5) * every):
        victim = random.choice(nodes)
        victim.kill()
        victim.start()


def _indexed(seaweed: SeaweedFS, bucket: str) -> set[str]:
    """The ids the bucket's index names now (one listing)."""
    from minio import Minio

    client = Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)
    names = (o.object_name or "" for o in client.list_objects(bucket, prefix="ids/"))
    return {name.removeprefix("ids/").removesuffix(".json") for name in names}


def _present(seaweed: SeaweedFS, bucket: str, ids: list[str]) -> int:
    indexed = _indexed(seaweed, bucket)
    return sum(message_id in indexed for message_id in ids)


def _watch(
    seaweed: SeaweedFS,
    bucket: str,
    ids: list[str],
    gone_at: dict[str, float],
    stop: threading.Event,
) -> None:
    """Note when each of `ids` leaves the index (one listing every half second)."""
    while not stop.is_set():
        indexed = _indexed(seaweed, bucket)
        now = time.monotonic()
        for message_id in ids:
            if message_id not in indexed:
                gone_at.setdefault(message_id, now)
        stop.wait(0.5)


# -- dedup -------------------------------------------------------------------------------


def run_dedup(seaweed: SeaweedFS, *, size: int, repeat: int, dedup: bool) -> tuple[float, ...]:
    """(bucket growth, bytes received) for one payload to 10 topics; bytes received for a
    repeated publish of `repeat` bytes."""
    from client import Client

    bucket = f"lc-{uuid.uuid4().hex[:10]}"
    broker = Mosquitto(max_packet_size=262144).start()
    try:
        env = base_env(seaweed, bucket, OFFLOAD_MQTT_URL=broker.url,
                       OFFLOAD_DEDUP=str(dedup).lower())  # fmt: skip
        with replicas(1, env) as (gw,):
            payload = os.urandom(size)
            before_bytes, before_in = stored(seaweed, bucket)[1], gw.metric(RECEIVED)
            with Client(broker.url, endpoint=gw.url, dedup=dedup) as producer:
                for topic in range(10):
                    producer.publish(f"dedup/{topic}", payload, qos=1)
            grew = stored(seaweed, bucket)[1] - before_bytes
            received = gw.metric(RECEIVED) - before_in
            big = os.urandom(repeat)
            with Client(broker.url, endpoint=gw.url, dedup=dedup) as producer:
                producer.publish("dedup/big", big, qos=1)
                before_in = gw.metric(RECEIVED)
                producer.publish("dedup/big", big, qos=1)
            again = gw.metric(RECEIVED) - before_in
    finally:
        broker.close()
    return grew, received, again


RECEIVED = "offload_http_received_bytes_total"


# -- quota -------------------------------------------------------------------------------


def run_quota(seaweed: SeaweedFS, *, quota: int) -> tuple[int, int, str, int]:
    """(bytes accepted of one account's 12 x 8 MiB, refusals, a refusal's words, the other
    account's answer)."""
    from client import gateway_auth

    from _auth import credential_files

    bucket = f"lc-{uuid.uuid4().hex[:10]}"
    users = {"alice": "alice-pw", "bob": "bob-pw"}
    with credential_files("lc-", users, "pattern readwrite #\n") as files:
        env = base_env(
            seaweed,
            bucket,
            OFFLOAD_MAX_STORED_BYTES_PER_USER=str(quota),
            OFFLOAD_PASSWORD_FILE=str(files / "passwd"),
            OFFLOAD_ACL_FILE=str(files / "acl"),
            OFFLOAD_ALLOW_ANONYMOUS="false",
        )
        with replicas(2, env) as nodes:

            def put(i: int, user: str = "alice") -> httpx.Response:
                auth = gateway_auth(username=user, password=users[user], token=None)
                return httpx.put(
                    f"{nodes[i % 2].url}/msg/{uuid.uuid4()}", params={"topic": f"q/{user}"},
                    content=os.urandom(8 * MiB), auth=auth, timeout=120,
                )  # fmt: skip

            with ThreadPoolExecutor(4) as pool:
                answers = list(pool.map(put, range(12)))
            other = put(0, "bob").status_code
    accepted = 8 * MiB * sum(a.status_code == 201 for a in answers)
    refused = [a for a in answers if a.status_code == 413]
    words = refused[0].json()["detail"] if refused else ""
    return accepted, len(refused), words, other


# -- cost ---------------------------------------------------------------------------------


def run_cost(
    seaweed: SeaweedFS, env: dict[str, str], *, seconds: float, clients: int
) -> tuple[float, float, float]:
    """(uploads/s, gateway and store CPU ms per upload) of distinct 256 KiB payloads."""
    from _harness import CpuMeter

    bucket = f"lc-{uuid.uuid4().hex[:10]}"
    with replicas(1, base_env(seaweed, bucket, **env)) as (gw,):
        assert gw.proc is not None and seaweed.proc is not None
        http = httpx.Client(timeout=60, limits=httpx.Limits(max_connections=clients))
        blocks = [os.urandom(256 * 1024) for _ in range(clients)]

        def put(i: int) -> None:
            body = os.urandom(16) + blocks[i][16:]  # new to the account every time
            answer = http.put(f"{gw.url}/msg/{uuid.uuid4()}", params={"topic": "cost/x"},
                              content=body)  # fmt: skip
            assert answer.status_code == 201, answer.text

        count = [0]
        stop = time.monotonic() + seconds

        def loop(i: int) -> None:
            while time.monotonic() < stop:
                put(i)
                count[0] += 1

        for i in range(clients):
            put(i)  # warm
        meter = CpuMeter(gateway=gw.proc.pid, store=seaweed.proc.pid)
        before, started = meter.read(), time.monotonic()
        threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        spent = meter.spent(before, meter.read())
        wall = time.monotonic() - started
    n = max(count[0], 1)
    return n / wall, 1000 * spent["gateway"] / n, 1000 * spent["store"] / n


def _cost_rows(seaweed: SeaweedFS, args: argparse.Namespace) -> list[dict[str, object]]:
    modes = {
        "today (dedup off)": {"OFFLOAD_DEDUP": "false"},
        "dedup": {},
        "dedup and a quota": {"OFFLOAD_MAX_STORED_BYTES_PER_USER": str(1 << 40)},
    }
    results = {}
    for name, env in modes.items():
        results[name] = run_cost(seaweed, env, seconds=args.cost_seconds, clients=8)
        rate, gateway_ms, store_ms = results[name]
        print(
            f"cost {name}: {rate:.0f} uploads/s of new 256 KiB payloads (8 clients); CPU ms "
            f"per upload: gateway {gateway_ms:.2f}, store {store_ms:.2f}",
            flush=True,
        )
    today = results["today (dedup off)"]
    return [
        info_row("lifecycle", f"gateway CPU per new 256 KiB upload, {name}", today[1], r[1], "ms")
        for name, r in results.items()
        if r is not today
    ]


# -- main --------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--part", choices=["retention", "dedup", "quota", "cost", "all"], default="all"
    )
    parser.add_argument("--cost-seconds", type=float, default=10.0)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--unconfirmed", type=int, default=20)
    parser.add_argument("--message-size", type=int, default=4096)
    parser.add_argument("--kill-every", type=float, default=4.0)
    parser.add_argument("--size", type=int, default=20 * MiB)
    parser.add_argument("--repeat-size", type=int, default=100 * MiB)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.groups, args.unconfirmed = 100, 4, 5
        args.size, args.repeat_size = 2 * MiB, 10 * MiB
    rows: list[dict[str, object]] = []
    seaweed = SeaweedFS().start()
    try:
        if args.part in ("retention", "all"):
            rows += _retention_rows(seaweed, args)
        if args.part in ("dedup", "all"):
            rows += _dedup_rows(seaweed, args)
        if args.part in ("quota", "all"):
            rows += _quota_rows(seaweed)
        if args.part in ("cost", "all"):
            rows += _cost_rows(seaweed, args)
    finally:
        seaweed.close()
    emit(rows)


def _retention_rows(seaweed: SeaweedFS, args: argparse.Namespace) -> list[dict[str, object]]:
    common: dict[str, object] = dict(
        messages=args.messages, groups=args.groups, size=args.message_size,
        unconfirmed=args.unconfirmed, kill_every=args.kill_every,
    )  # fmt: skip
    today = run_retention(seaweed, grouped=False, **common)  # type: ignore[arg-type]
    grouped = run_retention(seaweed, grouped=True, **common)  # type: ignore[arg-type]
    for name, r in (("today (TTL only)", today), ("by group", grouped)):
        print(
            f"retention {name}: {args.messages} x {args.groups} groups, {r.kills} replica kills "
            f"in {r.seconds:.0f} s; gone before every group confirmed: {r.early}; longest from "
            f"last confirmation to deletion: {r.longest:.1f} s; bucket after: {r.left[0]} "
            f"objects, {r.left[1] / MiB:.2f} MiB; unconfirmed left after expiry: "
            f"{r.expired_left}",
            flush=True,
        )
    return [
        absolute_row("lifecycle", "payloads gone before every group confirmed",
                     grouped.early, "", "0", grouped.early == 0),
        absolute_row("lifecycle", "longest last confirmation -> deletion", grouped.longest,
                     "s", "<= 60", grouped.longest <= 60),
        info_row("lifecycle", "bucket bytes once every group had the payloads",
                 today.left[1], grouped.left[1], "B"),
        absolute_row("lifecycle", "objects left once every group confirmed",
                     grouped.left[0], "", "0", grouped.left[0] == 0),
        absolute_row("lifecycle", "unconfirmed payloads left after their expiry",
                     grouped.expired_left, "", "0", grouped.expired_left == 0),
    ]  # fmt: skip


def _dedup_rows(seaweed: SeaweedFS, args: argparse.Namespace) -> list[dict[str, object]]:
    today = run_dedup(seaweed, size=args.size, repeat=args.repeat_size, dedup=False)
    once = run_dedup(seaweed, size=args.size, repeat=args.repeat_size, dedup=True)
    for name, (grew, received, again) in (("today (no dedup)", today), ("dedup", once)):
        print(
            f"dedup {name}: {args.size / MiB:.0f} MiB to 10 topics: bucket +{grew / MiB:.1f} MiB,"
            f" gateway received {received / MiB:.1f} MiB; {args.repeat_size / MiB:.0f} MiB "
            f"published again: {again / MiB:.2f} MiB sent",
            flush=True,
        )
    return [
        row("lifecycle", "bucket growth, one payload to 10 topics", today[0], once[0], "B",
            "<= 0.11 x today (1.1 x the payload)", higher_is_better=False, limit=0.11),
        row("lifecycle", "gateway received, one payload to 10 topics", today[1], once[1], "B",
            "<= 0.11 x today (1.1 x the payload)", higher_is_better=False, limit=0.11),
        absolute_row("lifecycle", "payload bytes sent by a repeated publish", once[2], "B",
                     "0", once[2] < 0.01 * args.repeat_size),
    ]  # fmt: skip


def _quota_rows(seaweed: SeaweedFS) -> list[dict[str, object]]:
    today = run_quota(seaweed, quota=0)
    capped = run_quota(seaweed, quota=50 * MiB)
    for name, (accepted, refused, words, other) in (("today (no quota)", today),
                                                    ("quota 50 MiB", capped)):  # fmt: skip
        print(
            f"quota {name}: 12 x 8 MiB, 4 at a time, two replicas: {accepted / MiB:.0f} MiB "
            f"accepted, {refused} refused; another account: HTTP {other}"
            + (f"; refusal: {words}" if words else ""),
            flush=True,
        )
    return [
        absolute_row("lifecycle", "bytes accepted under a 50 MiB quota", capped[0] / MiB, "MiB",
                     "<= 55", capped[0] <= 55 * MiB),
        info_row("lifecycle", "bytes accepted (today: no quota)", today[0], capped[0], "B"),
        absolute_row("lifecycle", "another account's upload", capped[3], "HTTP", "201",
                     capped[3] == 201),
    ]  # fmt: skip


if __name__ == "__main__":
    main()
