"""The gateway's CPU per GiB on each proxied path, and where it goes (py-spy, when installed).

Starts SeaweedFS and `offload-gateway` (as bench/gateway_vs_s3.py does) and moves `--runs`
payloads of `--size` bytes, one at a time, through each path:

* `hop`: `POST /topic/<t>+oversized`, the hop-client BSON document (`encode_upload`);
* `raw`: `PUT /msg/<id>?topic=<t>`, the payload as it is (the native client's upload);
* `down`: `GET /msg/<id>/payload`, read with urllib3.

Prints the CPU seconds per GiB that the gateway, the store and this client spent on each
path (user + system, from /proc: a loaded machine stretches wall time, much less CPU
time). With `--profile DIR` and `py-spy` on PATH, each path is also sampled on its own
(`DIR/<path>.txt`, py-spy's raw format) and summarised with bench/profile_summary.py.

    python bench/proxy_cost.py                                # 6 x 32 MiB per path
    python bench/proxy_cost.py --profile /tmp/prof --runs 8
    python bench/proxy_cost.py --env OFFLOAD_S3_UNSIGNED_PAYLOAD=false
    python bench/proxy_cost.py --size 262144 --runs 600   # a small transfer's fixed cost
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from _harness import CpuMeter, MiB, SeaweedFS, cpu_text, gateway_process, make_bucket
from profile_summary import summarise
from urllib3 import PoolManager

from client.protocol import MessageId, encode_upload

PATHS = ("hop", "raw", "down")


@contextlib.contextmanager
def sampled(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy on `pid` while the block runs (nothing when `out` is None)."""
    spy = shutil.which("py-spy")
    if out is None or spy is None:
        yield
        return
    proc = subprocess.Popen(
        [spy, "record", "-r", "200", "-f", "raw", "-o", str(out), "--pid", str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes its output and exits
        proc.wait(60)


def summary(path: Path, top: int) -> str:
    inclusive, own, busy, _ = summarise(str(path))
    lines = [f"  busy samples {busy}; self time:"]
    for frame, n in own.most_common(top):
        lines.append(f"  {100 * n / max(busy, 1):5.1f} %  {frame[:110]}")
    lines.append("  inclusive (gateway/, minio/, hashlib, crc):")
    for frame, n in inclusive.most_common(400):
        if any(s in frame for s in ("gateway/", "minio/", "crc32c", "_read_part", "read (")):
            lines.append(f"  {100 * n / max(busy, 1):5.1f} %  {frame[:110]}")
            if len(lines) > 3 * top:
                break
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--size", type=int, default=32 * MiB)
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--profile", type=Path, help="directory for py-spy's raw profiles")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--env", action="append", default=[], help="OFFLOAD_X=V for the gateway")
    args = parser.parse_args()
    payload = os.urandom(args.size)
    extra = dict(item.split("=", 1) for item in args.env)
    http = PoolManager(maxsize=2, timeout=120)
    seaweed = SeaweedFS().start()
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        make_bucket(seaweed, bucket)
        with gateway_process(seaweed, bucket, extra_env=extra) as gw:
            ids: list[str] = []

            def hop() -> None:
                head, tail = encode_upload(len(payload), headers=[("_id", MessageId.new().bytes)])
                r = http.request(
                    "POST",
                    f"{gw.url}/topic/bench/cost+oversized",
                    body=head + payload + tail,
                    headers={"Content-Type": "application/bson"},
                )
                assert r.status == 201, r.data[:300]
                ids.append(r.json()["id"])

            def raw() -> None:
                message_id = str(MessageId.new())
                r = http.request(
                    "PUT",
                    f"{gw.url}/msg/{message_id}?topic=bench/cost",
                    body=payload,
                    headers={"Content-Type": "application/octet-stream"},
                )
                assert r.status == 201, r.data[:300]
                ids.append(message_id)

            def down() -> None:
                r = http.request(
                    "GET", f"{gw.url}/msg/{ids[len(ids) // 2]}/payload", preload_content=False
                )
                got = sum(len(piece) for piece in r.stream(1 * MiB))
                r.release_conn()
                assert r.status == 200 and got == len(payload), (r.status, got)

            if "down" in args.paths and not ids:
                raw()  # something to read
            steps: dict[str, Callable[[], None]] = {"hop": hop, "raw": raw, "down": down}
            meter = CpuMeter(gateway=gw.pid, store=seaweed.proc.pid, client=None)
            gib = args.runs * args.size / 1024**3
            for name in args.paths:
                steps[name]()  # warm: connections, imports
                out = None if args.profile is None else args.profile / f"{name}.txt"
                if out is not None:
                    out.parent.mkdir(parents=True, exist_ok=True)
                with sampled(gw.pid, out):
                    before, t0 = meter.read(), time.perf_counter()
                    for _ in range(args.runs):
                        steps[name]()
                    wall, spent = time.perf_counter() - t0, meter.spent(before, meter.read())
                per_transfer = 1000 * spent["gateway"] / args.runs
                print(
                    f"{name}: {args.runs} x {args.size / MiB:g} MiB, "
                    f"{args.runs * args.size / MiB / wall:.0f} MiB/s wall (indicative); "
                    + cpu_text(spent, gib, "GiB")
                    + f"; gateway {per_transfer:.2f} ms CPU per transfer"
                )
                if out is not None and out.exists():
                    print(summary(out, args.top))
    finally:
        seaweed.close()


if __name__ == "__main__":
    main()
