"""A payload of any size through the CLI: `offload publish` -> gateway -> `offload subscribe`.

The raw upload (`PUT /msg/<id>`) has no 2 GiB BSON cap; this shows a 10 GiB message end to
end with bounded memory everywhere: it prints the wall time, throughput, CPU seconds and
peak RSS of the producer (`offload publish -f FILE`), the gateway (`offload-gateway`, its
own process) and the subscriber (`offload subscribe --out DIR`).

    python bench/huge.py                  # 10 GiB (needs about 20 GiB of free disk)
    python bench/huge.py --size-gib 1     # quicker
    python bench/run_all.py --only huge   # opt-in: not part of the default run

Disk: the source is real, incompressible data (a random 64 MiB block repeated: a store
that compresses gains nothing, and every byte is written to and read from disk), deleted as
soon as the producer exits; the store (SeaweedFS in a temporary directory) and the
subscriber's delivered file are removed at the end. Peak use is about twice the size:
source + store while uploading, store + the subscriber's spool while fetching.

Peak RSS is each process's VmHWM (psutil has no peak figure), polled every 50 ms until the
CLI processes exit; the gateway's is reset once it is ready, so start-up does not count.
CPU seconds of the CLI processes come from wait4. The delivered file is hashed
by `sha256sum` and compared with the hash taken while the source was written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from _harness import (
    ROOT,
    MiB,
    absolute_row,
    emit,
    gateway_process,
    make_bucket,
    reset_hwm,
    vm_hwm_kib,
)

from _servers import Mosquitto, SeaweedFS

GiB = 1024 * MiB
BLOCK = 64 * MiB
OFFLOAD = shutil.which("offload") or "offload"


@dataclass
class Finished:
    """A CLI process's outcome: exit code, output, and its own resource figures."""

    code: int
    stdout: str
    stderr: str
    seconds: float
    cpu_seconds: float
    peak_rss: int  # bytes


def _peak_rss_while_alive(pid: int, peaks: list[int]) -> None:
    """Poll a process's VmHWM (its own peak RSS since exec) until it exits."""
    while True:
        try:
            peaks.append(vm_hwm_kib(pid) * 1024)
        except (OSError, KeyError):  # gone (or a zombie without memory figures)
            return
        time.sleep(0.05)


def _run_measured(proc: subprocess.Popen[str], started: float) -> Finished:
    """Wait for `proc` with wait4 (its CPU time) while its VmHWM is polled (its peak RSS).

    Not `ru_maxrss`: after fork and exec it also counts the parent's memory at the fork.
    """
    out: list[str] = []
    err: list[str] = []
    peaks: list[int] = [0]
    threads = [
        threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else "")),
        threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else "")),
        threading.Thread(target=_peak_rss_while_alive, args=(proc.pid, peaks)),
    ]
    for t in threads:
        t.start()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in threads:
        t.join()
    return Finished(
        proc.returncode,
        "".join(out),
        "".join(err),
        seconds,
        usage.ru_utime + usage.ru_stime,
        max(peaks),
    )


def write_source(path: Path, size: int) -> str:
    """`size` bytes of a repeated random block; their SHA-256 (taken while writing)."""
    block = os.urandom(BLOCK)
    digest = hashlib.sha256()
    with path.open("wb") as out:
        left = size
        while left:
            piece = block[: min(left, BLOCK)]
            out.write(piece)
            digest.update(piece)
            left -= len(piece)
    return digest.hexdigest()


def sha256sum(path: Path) -> str:
    """`sha256sum` (coreutils) of a file, read through a pipe: no copy on disk."""
    with path.open("rb") as src:
        done = subprocess.run(["sha256sum"], stdin=src, capture_output=True, text=True, check=True)
    return done.stdout.split()[0]


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env["OFFLOAD_CONFIG"] = os.devnull
    env["PYTHONPATH"] = str(ROOT)  # this checkout's client, whatever is installed
    env.update(extra)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gib", type=float, default=10.0)
    parser.add_argument("--dir", type=Path, default=None, help="where the files go (tmp)")
    args = parser.parse_args()
    size = int(args.size_gib * GiB)
    work = Path(tempfile.mkdtemp(prefix="huge-", dir=args.dir))
    (work / "weed").mkdir()
    seaweed = SeaweedFS(workdir=work / "weed")
    broker = Mosquitto()
    try:
        run(size, work, seaweed, broker)
    finally:
        broker.close()
        seaweed.close()
        shutil.rmtree(work, ignore_errors=True)


def run(size: int, work: Path, seaweed: SeaweedFS, broker: Mosquitto) -> None:
    source = work / "source.bin"
    out_dir = work / "delivered"
    print(f"size: {size} bytes ({size / GiB:.2f} GiB); files in {work}", flush=True)
    t0 = time.monotonic()
    expected = write_source(source, size)
    print(f"source written and hashed in {time.monotonic() - t0:.1f} s: {expected}", flush=True)

    seaweed.start()
    broker.start()
    bucket = f"huge-{uuid.uuid4().hex[:8]}"
    make_bucket(seaweed, bucket)
    limits = {"OFFLOAD_MAX_BODY_BYTES": str(size + MiB)}
    with gateway_process(seaweed, bucket, broker=broker, extra_env=limits) as gw:
        reset = reset_hwm(gw.pid)
        gateway_base = vm_hwm_kib(gw.pid) * 1024
        topic = f"huge/{uuid.uuid4().hex[:8]}"
        common = ["--broker", broker.url, "--endpoint", gw.url]
        env = _env({"OFFLOAD_MAX_FETCH_BYTES": str(size + MiB)})
        started = time.monotonic()
        subscriber = subprocess.Popen(
            [OFFLOAD, "subscribe", *common, "-t", topic, "--count", "1", "--out", str(out_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        time.sleep(2.0)  # its SUBSCRIBE reaches the broker before the placeholder does
        pub_start = time.monotonic()
        producer = subprocess.Popen(
            [OFFLOAD, "publish", *common, "-t", topic, "-f", str(source)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        published = _run_measured(producer, pub_start)
        source.unlink()  # the producer is done with it: free the disk before the fetch
        if published.code != 0:
            subscriber.kill()
            raise SystemExit(f"publish failed ({published.code}): {published.stderr.strip()}")
        received = _run_measured(subscriber, started)
        end = time.monotonic()
        gateway_peak = vm_hwm_kib(gw.pid) * 1024
    if received.code != 0:
        raise SystemExit(f"subscribe failed ({received.code}): {received.stderr.strip()}")
    pub_doc = json.loads(published.stdout.splitlines()[-1])
    sub_doc = json.loads(received.stdout.splitlines()[-1])
    delivered = Path(sub_doc["file"])
    t_hash = time.monotonic()
    actual = sha256sum(delivered)
    hash_seconds = time.monotonic() - t_hash
    delivered.unlink()
    intact = actual == expected == sub_doc["sha256"] == pub_doc["sha256"]
    fetch_seconds = end - (pub_start + published.seconds)
    total = end - pub_start
    print(f"route: {pub_doc['route']}, packets: {pub_doc['packets']}, id: {pub_doc['id']}")
    print(f"delivered {sub_doc['size']} bytes, sha256sum {actual}: intact={intact}")
    print(
        f"publish (hash pass + upload): {published.seconds:.1f} s wall, "
        f"{size / published.seconds / MiB:.0f} MiB/s, {published.cpu_seconds:.1f} CPU s, "
        f"peak RSS {published.peak_rss / MiB:.0f} MiB"
    )
    print(
        f"fetch (placeholder -> delivered): {fetch_seconds:.1f} s wall, "
        f"{size / fetch_seconds / MiB:.0f} MiB/s; subscriber {received.cpu_seconds:.1f} CPU s, "
        f"peak RSS {received.peak_rss / MiB:.0f} MiB"
    )
    print(
        f"gateway peak RSS {gateway_peak / MiB:.0f} MiB "
        f"(at the start {gateway_base / MiB:.0f} MiB{'' if reset else ', HWM not reset'})"
    )
    print(
        f"end to end: {total:.1f} s, {size / total / MiB:.0f} MiB/s; sha256sum {hash_seconds:.1f} s"
    )
    label = f"{size / GiB:g} GiB via CLI"
    emit([
        absolute_row("huge", f"{label}: delivered intact, route offloaded",
                     1.0 if intact and pub_doc["route"] == "offloaded" else 0.0, "bool",
                     "== 1", intact and pub_doc["route"] == "offloaded"),
        absolute_row("huge", f"{label}: end-to-end throughput", size / total / MiB, "MiB/s",
                     "-", True),
        absolute_row("huge", f"{label}: producer peak RSS", published.peak_rss / MiB, "MiB",
                     "< 200", published.peak_rss < 200 * MiB),
        absolute_row("huge", f"{label}: gateway peak RSS", gateway_peak / MiB, "MiB",
                     "< 150", gateway_peak < 150 * MiB),
        absolute_row("huge", f"{label}: subscriber peak RSS", received.peak_rss / MiB, "MiB",
                     "< 200", received.peak_rss < 200 * MiB),
    ])  # fmt: skip
    if not intact:
        sys.exit(1)


if __name__ == "__main__":
    main()
