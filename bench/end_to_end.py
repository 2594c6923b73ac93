"""Benchmark 2: 64 MiB end to end through `Client.publish`, against the store's own floor.

Starts SeaweedFS, two mosquitto brokers (`set_tcp_nodelay true`; one with
`max_packet_size 262144`, one without a limit) and `offload-gateway` as a subprocess. The
payload is a 64 MiB file on disk. For 1 and 4 subscribers, each run times publish start to
the moment the last subscriber has the message:

* API (the candidate): a connected :class:`client.Client` publishes the file; N subscriber
  processes (each a connected Client, SHA-256 verified) stamp the wall clock on delivery;
  stops at the last stamp;
* S3 floor (the baseline, issue 15): the MinIO SDK alone puts the file (parts of the
  gateway's default size, 2 at once) and N threads get it in parallel: what any claim
  check through this store must pay. Target: API / floor <= 1.15 for N = 1 and N = 4;
* S3 floor with the check (info): the same, each get hashing what it reads (SHA-256, as
  every subscriber must before it hands a payload over): what verifying costs on top of
  the floor on these cores, where the store, the gets and the hashes share two of them;
* mosquitto (info): `mosquitto_pub -f FILE -q 1` -> N x `mosquitto_sub -C 1` through the
  unlimited broker (the raised-limit alternative);
* CLI (info, `--cli`): `offload publish -f FILE` -> N x `offload subscribe -c 1`, with the
  publisher's Python start-up which mosquitto_pub does not pay;
* direct transfers (info, the issue's row 2 read for direct transfers): the same API run
  through a second gateway started with `OFFLOAD_S3_PUBLIC_URL` set to SeaweedFS's URL (as
  tests/test_direct.py does), on its own 256 KiB broker so its discovery record reaches only
  these clients: publisher and subscribers find the gateway by discovery, the bytes go
  straight to and from the store (presigned part PUTs; 307 to a presigned GET), against the
  same floor. `--no-direct` skips it.

Subscribers are started before the clock and are known to be subscribed (their SUBSCRIBE in
the broker log). Runs are interleaved (mosquitto, API, floor, ...) so load hits all alike.

    python bench/end_to_end.py               # 3 runs per case
    python bench/end_to_end.py --runs 5 --size 134217728 --cli
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _harness import (
    ROOT,
    MiB,
    Mosquitto,
    SeaweedFS,
    emit,
    gateway_process,
    make_bucket,
    minio_client,
    row,
)

NODELAY = "set_tcp_nodelay true"
PART = 8 * MiB  # the gateway's default OFFLOAD_S3_PART_SIZE
TARGET = 1.15  # Client.publish -> N Clients / the store's floor (issue 15)


def _wait_subscribed(broker: Mosquitto, ids: list[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = broker.log()
        if all(f"Received SUBSCRIBE from {i}" in log for i in ids):
            return
        time.sleep(0.02)
    raise TimeoutError(f"subscribers {ids} did not subscribe")


def _wait_all(procs: list[subprocess.Popen[bytes]], timeout: float = 300.0) -> float:
    """Wall-clock time (perf_counter) when the last process exited."""
    deadline = time.monotonic() + timeout
    pending = list(procs)
    last = time.perf_counter()
    while pending:
        for p in list(pending):
            if p.poll() is not None:
                last = time.perf_counter()
                pending.remove(p)
                if p.returncode != 0:
                    raise RuntimeError(f"{p.args} exited with {p.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError("subscribers did not finish")
        time.sleep(0.002)
    return last


def _mosq(program: str, broker: Mosquitto, topic: str) -> list[str]:
    return [program, "-h", "127.0.0.1", "-p", str(broker.port), "-t", topic, "-q", "1", "-V", "5"]


def mosquitto_run(broker: Mosquitto, path: Path, subscribers: int) -> float:
    topic = f"bench/e2e/{uuid.uuid4().hex[:8]}"
    ids = [f"msub-{uuid.uuid4().hex[:8]}" for _ in range(subscribers)]
    subs = [
        subprocess.Popen(
            [*_mosq("mosquitto_sub", broker, topic), "-C", "1", "-i", i],
            stdout=subprocess.DEVNULL,
        )
        for i in ids
    ]
    _wait_subscribed(broker, ids)
    t0 = time.perf_counter()
    pub = subprocess.run(
        [*_mosq("mosquitto_pub", broker, topic), "-f", str(path)],
        check=True,
    )
    assert pub.returncode == 0
    return _wait_all(subs) - t0


def cli_run(broker: Mosquitto, endpoint: str, path: Path, subscribers: int) -> float:
    topic = f"bench/e2e/{uuid.uuid4().hex[:8]}"
    ids = [f"osub-{uuid.uuid4().hex[:8]}" for _ in range(subscribers)]
    common = ["--broker", broker.url, "--endpoint", endpoint, "--discovery-wait", "0"]
    subs = [
        subprocess.Popen(
            ["offload", "subscribe", *common, "-t", topic, "-q", "1", "-c", "1", "--client-id", i],
            stdout=subprocess.DEVNULL,
        )
        for i in ids
    ]
    _wait_subscribed(broker, ids)
    t0 = time.perf_counter()
    subprocess.run(
        ["offload", "publish", *common, "-t", topic, "-q", "1", "-f", str(path)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return _wait_all(subs) - t0


def api_subscriber(broker_url: str, endpoint: str, topic: str, client_id: str) -> None:
    """Child process: one Client subscriber; prints the wall clock at delivery.

    An empty `endpoint` means: find the gateway (and its direct store) by discovery.
    """
    sys.path.insert(0, str(ROOT))
    from client import Client, Message

    found = {"endpoint": endpoint} if endpoint else {}
    with Client(broker_url, client_id=client_id, discovery_wait=10.0, **found) as c:
        if not endpoint:
            assert c.wait_for_endpoint(30) and c.discovery_record is not None
            assert c.discovery_record.direct_store, "no direct transfers advertised"
        c.subscribe(topic, 1)
        msg = c.next_message(120)
        stamp = time.time()
        assert isinstance(msg, Message) and msg.route == "offloaded", msg
        msg.body.discard()
        print(f"DELIVERED {stamp:.6f} {msg.size}", flush=True)


def api_run(broker: Mosquitto, endpoint: str, path: Path, subscribers: int, pub: object) -> float:
    topic = f"bench/e2e/{uuid.uuid4().hex[:8]}"
    ids = [f"asub-{uuid.uuid4().hex[:8]}" for _ in range(subscribers)]
    subs = [
        subprocess.Popen(
            [sys.executable, __file__, "--api-subscriber", broker.url, endpoint, topic, i],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in ids
    ]
    _wait_subscribed(broker, ids)
    t0 = time.time()
    pub.publish(topic, path, qos=1)  # type: ignore[attr-defined]
    stamps = []
    for p in subs:
        out, _ = p.communicate(timeout=300)
        line = [x for x in out.splitlines() if x.startswith("DELIVERED")]
        assert p.returncode == 0 and line, out
        stamps.append(float(line[0].split()[1]))
    return max(stamps) - t0


def store_floor(
    seaweed: SeaweedFS, bucket: str, path: Path, subscribers: int, *, sha256: str | None = None
) -> float:
    """The object store alone: put the file (as the gateway does) then N parallel gets;
    with `sha256`, each get hashes what it reads and checks it, as a subscriber must
    (hashlib drops the GIL: the threads overlap)."""
    from concurrent.futures import ThreadPoolExecutor

    s3 = minio_client(seaweed)
    key = f"floor/{uuid.uuid4().hex}"
    t0 = time.perf_counter()
    s3.fput_object(bucket, key, str(path), part_size=PART, num_parallel_uploads=2)  # type: ignore[attr-defined]

    def get(_: int) -> bool:
        digest = hashlib.sha256()
        got = 0
        r = s3.get_object(bucket, key)  # type: ignore[attr-defined]
        try:
            for piece in r.stream(4 * MiB):
                got += len(piece)
                if sha256 is not None:
                    digest.update(piece)
        finally:
            r.close()
            r.release_conn()
        return got == path.stat().st_size and sha256 in (None, digest.hexdigest())

    with ThreadPoolExecutor(subscribers) as pool:
        assert all(pool.map(get, range(subscribers)))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", type=int, default=64 * MiB)
    parser.add_argument("--subscribers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--workers", type=int, default=1, help="gateway uvicorn workers")
    parser.add_argument("--cli", action="store_true", help="also time the offload CLI")
    parser.add_argument("--no-direct", action="store_true", help="skip the direct-transfer runs")
    parser.add_argument("--api-subscriber", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.api_subscriber:
        api_subscriber(*args.api_subscriber)
        return

    from client import Client

    workdir = Path(tempfile.mkdtemp(prefix="bench-e2e-", dir="/dev/shm"))
    path = workdir / "payload.bin"
    with path.open("wb") as f:
        block = os.urandom(MiB)
        for i in range(args.size // MiB):
            f.write(i.to_bytes(8, "big") + block[8:])
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    seaweed = SeaweedFS().start()
    limited = Mosquitto(max_packet_size=262144, extra_config=NODELAY).start()
    raised = Mosquitto(extra_config=NODELAY).start()
    # Its own broker: the direct gateway's discovery record must not reach the other clients.
    direct_broker = Mosquitto(max_packet_size=262144, extra_config=NODELAY).start()
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    rows = []
    mib = args.size // MiB
    try:
        make_bucket(seaweed, bucket)
        public = {"OFFLOAD_S3_PUBLIC_URL": f"http://{seaweed.endpoint}"}
        with (
            gateway_process(seaweed, bucket, broker=limited, workers=args.workers) as gw,
            gateway_process(
                seaweed, bucket, broker=direct_broker, workers=args.workers, extra_env=public
            ),
            Client(limited.url, endpoint=gw.url, discovery_wait=0.0) as pub,
            Client(direct_broker.url, discovery_wait=10.0) as direct_pub,
        ):
            direct = not args.no_direct
            if direct:
                assert direct_pub.wait_for_endpoint(30)
                record = direct_pub.discovery_record
                assert record is not None and record.direct_store, "no direct transfers"
            # Warm-up: SeaweedFS volume growth, the gateway's first upload, page cache.
            mosquitto_run(raised, path, 1)
            if args.cli:
                cli_run(limited, gw.url, path, 1)
            api_run(limited, gw.url, path, 1, pub)
            if direct:
                api_run(direct_broker, "", path, 1, direct_pub)
            store_floor(seaweed, bucket, path, 1)
            for n in args.subscribers:
                times: dict[str, list[float]] = {
                    "mosquitto": [], "cli": [], "api": [], "direct": [], "s3": [], "checked": []
                }  # fmt: skip
                for _ in range(args.runs):
                    times["mosquitto"].append(mosquitto_run(raised, path, n))
                    if args.cli:
                        times["cli"].append(cli_run(limited, gw.url, path, n))
                    times["api"].append(api_run(limited, gw.url, path, n, pub))
                    if direct:
                        times["direct"].append(api_run(direct_broker, "", path, n, direct_pub))
                    times["s3"].append(store_floor(seaweed, bucket, path, n))
                    times["checked"].append(store_floor(seaweed, bucket, path, n, sha256=digest))
                med = {k: statistics.median(v) * 1e3 for k, v in times.items() if v}
                print(
                    f"{mib} MiB, {n} subscriber(s): store floor {med['s3']:.0f} ms, "
                    f"Client.publish {med['api']:.0f} ms, ratio {med['api'] / med['s3']:.2f} "
                    f"(target <= {TARGET}); raised-limit mosquitto {med['mosquitto']:.0f} ms"
                    + (f", CLI {med['cli']:.0f} ms" if "cli" in med else "")
                )
                print(
                    f"{mib} MiB, {n} subscriber(s): store floor with the SHA-256 check "
                    f"{med['checked']:.0f} ms, ratio {med['checked'] / med['s3']:.2f} (info)"
                )
                rows.append(
                    row("2 end to end", f"{mib} MiB {n} sub, Client / store floor", med["s3"],
                        med["api"], "ms", f"<= {TARGET}", higher_is_better=False, limit=TARGET)
                )  # fmt: skip
                checked = row("2 end to end",
                              f"{mib} MiB {n} sub, floor with each get's SHA-256 / store floor",
                              med["s3"], med["checked"], "ms", "info",
                              higher_is_better=False, limit=0)  # fmt: skip
                checked["met"] = None
                rows.append(checked)
                for kind in ("api", "cli"):
                    if kind in med:
                        info = row("2 end to end", f"{mib} MiB {n} sub, {kind} / mosquitto",
                                   med["mosquitto"], med[kind], "ms", "info",
                                   higher_is_better=False, limit=0)  # fmt: skip
                        info["met"] = None
                        rows.append(info)
                if "direct" in med:
                    print(
                        f"{mib} MiB, {n} subscriber(s), direct transfers: Client.publish "
                        f"{med['direct']:.0f} ms, ratio {med['direct'] / med['s3']:.2f} "
                        f"(info; row 2's target <= {TARGET})"
                    )
                    info = row("2 end to end", f"{mib} MiB {n} sub, direct Client / store floor",
                               med["s3"], med["direct"], "ms", f"info (<= {TARGET})",
                               higher_is_better=False, limit=0)  # fmt: skip
                    info["met"] = None
                    rows.append(info)
    finally:
        limited.close()
        raised.close()
        direct_broker.close()
        seaweed.close()
        shutil.rmtree(workdir, ignore_errors=True)
    emit(rows)


if __name__ == "__main__":
    main()
