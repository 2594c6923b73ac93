"""Gateway memory while a large raw body streams through `POST /publish/{topic}`.

Starts `offload-gateway` as a subprocess on a file:// store (or an s3:// URL you pass) and a
real mosquitto, streams SIZE bytes of generated data (never held whole: 1 MiB pieces) and
samples the gateway's VmRSS / VmHWM from /proc/<pid>/status with psutil every 0.1 s.

    python bench/upload_memory.py --size 2GiB            # file store in a temp directory
    python bench/upload_memory.py --size 2GiB --chunked  # no Content-Length

Prints one JSON line: bytes, seconds, MiB/s, RSS before / peak during / after, VmHWM.
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
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _servers import Mosquitto, free_port, wait_for_port

PIECE = 1 << 20


def parse_size(text: str) -> int:
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "B": 1}
    upper = text.strip().upper()
    for suffix, factor in units.items():
        if upper.endswith(suffix):
            return int(float(upper[: -len(suffix)]) * factor)
    return int(upper)


def body(size: int, digest: hashlib._Hash) -> Iterator[bytes]:
    # Pseudo-random but cheap: one random MiB, each piece perturbed by its index.
    base = bytearray(os.urandom(PIECE))
    sent = 0
    index = 0
    while sent < size:
        base[:8] = index.to_bytes(8, "little")
        piece = bytes(base[: min(PIECE, size - sent)])
        digest.update(piece)
        sent += len(piece)
        index += 1
        yield piece


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="2GiB")
    parser.add_argument("--storage-url", help="default: file:// in a temp directory")
    parser.add_argument("--chunked", action="store_true", help="send without Content-Length")
    args = parser.parse_args()
    size = parse_size(args.size)

    workdir = Path(tempfile.mkdtemp(prefix="offload-bench-"))
    broker = Mosquitto().start()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env.update({
        "OFFLOAD_STORAGE_URL": args.storage_url or f"file://{workdir}/store",
        "OFFLOAD_MQTT_URL": broker.url,
        "OFFLOAD_MAX_BODY_BYTES": str(max(size * 2, 1 << 30)),
        "OFFLOAD_LOG_LEVEL": "WARNING",
        "OFFLOAD_ALLOW_ANONYMOUS": "true",
    })  # fmt: skip
    gateway = subprocess.Popen(
        ["offload-gateway", "--port", str(port)], env=env, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port, 30, gateway)
        url = f"http://127.0.0.1:{port}"
        while httpx.get(f"{url}/readyz").status_code != 200:
            time.sleep(0.1)
        proc = psutil.Process(gateway.pid)
        rss_before = proc.memory_info().rss
        peak = rss_before
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, proc.memory_info().rss)
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        digest = hashlib.sha256()
        headers = {"Content-Type": "application/octet-stream"}
        if not args.chunked:
            headers["Content-Length"] = str(size)
        t0 = time.monotonic()
        r = httpx.post(
            f"{url}/publish/bench/memory",
            content=body(size, digest),
            headers=headers,
            timeout=httpx.Timeout(600.0),
        )
        seconds = time.monotonic() - t0
        stop.set()
        sampler.join()
        r.raise_for_status()
        answer = r.json()
        assert answer["size"] == size and answer["sha256"] == digest.hexdigest(), answer
        result = {
            "bytes": size,
            "chunked": args.chunked,
            "store": env["OFFLOAD_STORAGE_URL"].split(":", 1)[0],
            "seconds": round(seconds, 1),
            "mib_per_s": round(size / seconds / (1 << 20), 1),
            "rss_before_mib": round(rss_before / (1 << 20), 1),
            "rss_peak_mib": round(peak / (1 << 20), 1),
            "rss_after_mib": round(status_kib(gateway.pid, "VmRSS") / 1024, 1),
            "vm_hwm_mib": round(status_kib(gateway.pid, "VmHWM") / 1024, 1),
        }
        print(json.dumps(result))
    finally:
        gateway.terminate()
        gateway.wait(30)
        broker.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
