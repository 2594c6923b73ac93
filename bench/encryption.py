"""Benchmark: what encryption and compression cost or save end to end (issue 30).

Starts SeaweedFS, a 256 KiB mosquitto and `offload-gateway` as a subprocess. One connected
subscriber Client (with the identity) and one publisher per setting; each run times
`publish` start to the subscriber having the (decrypted, decompressed) message. Runs are
interleaved so load hits both sides of a ratio alike.

* 64 MiB random bytes, encrypted to one recipient vs plain (compression off on both: it
  would not pay): rate ratio encrypted / plain, target >= 0.85;
* 64 MiB JSON telemetry, `compress=True` vs `compress=False` (the default): time ratio compressed /
  uncompressed, target <= 0.5 (the bytes saved must show up as time saved).

    python bench/encryption.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _harness import ROOT, MiB, Mosquitto, SeaweedFS, emit, gateway_process, make_bucket, row

sys.path.insert(0, str(ROOT))

from client import Client, Message
from client.protocol._age_keys import Identity


def telemetry(size: int) -> bytes:
    """JSON readings like a fleet's: compresses several times, not absurdly."""
    out, i = [], 0
    total = 0
    while total < size:
        line = json.dumps(
            {"device": f"dev-{i % 500:04d}", "seq": i, "t": 1_764_000_000_000 + i * 37,
             "temp": round(20 + (i * 7919 % 1000) / 97, 3), "ok": i % 11 != 0},
            separators=(",", ":"),
        )  # fmt: skip
        out.append(line)
        total += len(line) + 1
        i += 1
    return ("[" + ",".join(out) + "]").encode()[:size]


CPU: dict[str, list[float]] = {}


def one(pub: Client, sub: Client, topic: str, payload: bytes, name: str = "") -> float:
    """Seconds from publish to delivery; the clients' CPU seconds are kept under `name`."""
    t0, c0 = time.perf_counter(), time.process_time()
    pub.publish(topic, payload, qos=1)
    item = sub.next_message(120)
    elapsed = time.perf_counter() - t0
    CPU.setdefault(name, []).append(time.process_time() - c0)
    assert isinstance(item, Message) and item.size == len(payload), item
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", type=int, default=64 * MiB)
    args = parser.parse_args()
    identity = Identity.generate()
    key = Path(tempfile.mkdtemp(prefix="bench-enc-")) / "key.txt"
    key.write_text(f"{identity}\n")
    noise = os.urandom(args.size)
    doc = telemetry(args.size)
    seaweed = SeaweedFS().start()
    broker = Mosquitto(max_packet_size=262144).start()
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        make_bucket(seaweed, bucket)
        with (
            gateway_process(seaweed, bucket, broker=broker) as gw,
            Client(broker.url, endpoint=gw.url, identity_files=(str(key),)) as sub,
            Client(broker.url, endpoint=gw.url, compress=False) as plain,
            Client(
                broker.url, endpoint=gw.url, encrypt_to={"enc/#": [str(identity.recipient)]}
            ) as enc,
            Client(broker.url, endpoint=gw.url, compress=True) as squeezed,
        ):
            for topic_filter in ("plain/#", "enc/#", "json/#"):
                sub.subscribe(topic_filter, qos=1)
            one(plain, sub, "plain/warm", noise)  # warm-up: volume growth, page cache
            times: dict[str, list[float]] = {"plain": [], "enc": [], "json": [], "zstd": []}
            for _ in range(args.runs):
                times["plain"].append(one(plain, sub, "plain/x", noise, "plain"))
                times["enc"].append(one(enc, sub, "enc/x", noise, "enc"))
                times["json"].append(one(plain, sub, "json/x", doc, "json"))
                times["zstd"].append(one(squeezed, sub, "json/x", doc, "zstd"))
            med = {k: statistics.median(v) for k, v in times.items()}
    finally:
        broker.close()
        seaweed.close()
        shutil.rmtree(key.parent, ignore_errors=True)  # the age identity
    mib = args.size / MiB
    rate = {k: mib / v for k, v in med.items()}
    enc_ratio, zstd_ratio = rate["enc"] / rate["plain"], med["zstd"] / med["json"]
    cpu = {k: statistics.median(v) for k, v in CPU.items() if k}
    print("clients' CPU seconds per run (median): "
          + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()))  # fmt: skip
    print(f"{mib:.0f} MiB random: plain {rate['plain']:.0f} MiB/s, encrypted "
          f"{rate['enc']:.0f} MiB/s, ratio {enc_ratio:.2f} (target >= 0.85)")  # fmt: skip
    print(f"{mib:.0f} MiB JSON: uncompressed {med['json'] * 1e3:.0f} ms, compressed "
          f"{med['zstd'] * 1e3:.0f} ms, ratio {zstd_ratio:.2f} (target <= 0.5)")  # fmt: skip
    emit([
        row("encryption", f"{mib:.0f} MiB random, encrypted / plain", rate["plain"],
            rate["enc"], "MiB/s", ">= 0.85", higher_is_better=True, limit=0.85),
        row("encryption", f"{mib:.0f} MiB JSON, compressed / uncompressed", med["json"] * 1e3,
            med["zstd"] * 1e3, "ms", "<= 0.5", higher_is_better=False, limit=0.5),
    ])  # fmt: skip


if __name__ == "__main__":
    main()
