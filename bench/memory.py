"""Benchmark 5: memory of the gateway, the producer and the consumer with 1 GiB payloads.

Starts SeaweedFS, mosquitto (256 KiB limit) and `offload-gateway` as a subprocess.

* Gateway: one 1 GiB message is stored first; then the gateway's peak RSS (VmHWM, reset
  with /proc/<pid>/clear_refs after the preload, and psutil samples every 50 ms) is taken
  while a 1 GiB BSON upload (`POST /topic/<t>+oversized`, generated, never held whole) and
  the 1 GiB download (`GET /msg/<id>/payload`, discarded as it arrives) run at once.
  Target: < 150 MiB.
* Producer: a child process publishes a 1 GiB file from disk with `Client.publish(path)`.
  Consumer: a child process receives it with `Client.next_message` (spooled to disk,
  SHA-256 verified). Each reports its own peak RSS (ru_maxrss); the baseline is the same
  child connecting and exiting without a message. Target: bounded, < 150 MiB.

`--encrypted` (issue 30) measures only the two clients, the producer encrypting the file to
a fresh age key (sealed while it is uploaded, a few MiB ahead, never whole in memory) and
the consumer decrypting it into its spool file as it arrives: same target.

    python bench/memory.py                 # 1 GiB
    python bench/memory.py --size 268435456
    python bench/memory.py --encrypted
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
from _harness import (
    ROOT,
    MiB,
    Mosquitto,
    SeaweedFS,
    absolute_row,
    emit,
    gateway_process,
    make_bucket,
    reset_hwm,
    vm_hwm_kib,
)

LIMIT_MIB = 150


def generated(size: int, piece: int = MiB) -> Iterator[bytes]:
    block = bytearray(os.urandom(piece))
    sent = 0
    while sent < size:
        block[:8] = sent.to_bytes(8, "big")  # distinct pieces, no os.urandom per piece
        n = min(piece, size - sent)
        yield bytes(block[:n])
        sent += n


def envelope_body(size: int) -> tuple[Iterator[bytes], int, str]:
    sys.path.insert(0, str(ROOT))
    from client.protocol import MessageId, encode_upload

    message_id = MessageId.new()
    head, tail = encode_upload(size, headers=[("_id", message_id.bytes)])

    def body() -> Iterator[bytes]:
        yield head
        yield from generated(size)
        yield tail

    return body(), len(head) + size + len(tail), str(message_id)


def upload(url: str, size: int) -> str:
    body, length, message_id = envelope_body(size)
    r = httpx.post(
        f"{url}/topic/bench/memory+oversized",
        content=body,
        headers={"Content-Type": "application/bson", "Content-Length": str(length)},
        timeout=600,
    )
    assert r.status_code == 201, r.text
    return message_id


def download(url: str, message_id: str, size: int) -> None:
    got = 0
    with httpx.stream("GET", f"{url}/msg/{message_id}/payload", timeout=600) as r:
        assert r.status_code == 200
        for piece in r.iter_raw():
            got += len(piece)
    assert got == size, got


def gateway_peak(url: str, pid: int, size: int) -> tuple[float, float, float]:
    """(RSS before, sampled peak, VmHWM) in MiB during a concurrent upload + download."""
    stored = upload(url, size)
    proc = psutil.Process(pid)
    reset_ok = reset_hwm(pid)
    before = proc.memory_info().rss
    peak = before
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    errors: list[BaseException] = []

    def guarded(fn: object, *args: object) -> None:
        try:
            fn(*args)  # type: ignore[operator]
        except BaseException as exc:  # reported below, the benchmark fails loudly
            errors.append(exc)

    t0 = time.perf_counter()
    threads = [
        threading.Thread(target=guarded, args=(upload, url, size)),
        threading.Thread(target=guarded, args=(download, url, stored, size)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    stop.set()
    sampler.join()
    if errors:
        raise errors[0]
    hwm = vm_hwm_kib(pid) / 1024 if reset_ok else float("nan")
    print(f"gateway: upload + download of {size / MiB:.0f} MiB each at once took {elapsed:.1f} s")
    return before / MiB, peak / MiB, hwm


def child(role: str, broker_url: str, endpoint: str, topic: str, path: str) -> None:
    """Child process: producer, consumer or idle; prints its peak RSS in KiB."""
    sys.path.insert(0, str(ROOT))
    from client import Client, Message

    crypt: dict[str, object] = {}
    key = os.environ.get("BENCH_IDENTITY_FILE")
    if key and role == "producer":
        recipient = Path(key).read_text().split("public key: ")[1].split()[0]
        crypt["encrypt_to"] = {topic: [recipient]}
    elif key and role == "consumer":
        crypt["identity_files"] = (key,)
    with Client(broker_url, endpoint=endpoint, discovery_wait=0.0, **crypt) as c:  # type: ignore[arg-type]
        if role == "producer":
            c.publish(topic, Path(path), qos=1)
        elif role == "consumer":
            c.subscribe(topic, 1)
            print("SUBSCRIBED", flush=True)
            msg = c.next_message(600)
            assert isinstance(msg, Message) and msg.size == os.path.getsize(path), msg
            msg.body.discard()
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across exec.
    print(f"MAXRSS {vm_hwm_kib(os.getpid())}", flush=True)


def _maxrss_mib(out: str) -> float:
    line = [x for x in out.splitlines() if x.startswith("MAXRSS")]
    assert line, out
    return int(line[0].split()[1]) / 1024


def clients_peak(broker: Mosquitto, endpoint: str, path: Path) -> tuple[float, float, float]:
    """(idle, producer, consumer) peak RSS in MiB."""
    topic = f"bench/memory/{uuid.uuid4().hex[:8]}"

    def spawn(role: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, __file__, "--child", role, broker.url, endpoint, topic, str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    idle_out, _ = spawn("idle").communicate(timeout=120)
    consumer = spawn("consumer")
    assert consumer.stdout is not None
    assert consumer.stdout.readline().startswith("SUBSCRIBED")
    producer_out, _ = spawn("producer").communicate(timeout=900)
    consumer_out, _ = consumer.communicate(timeout=900)
    return _maxrss_mib(idle_out), _maxrss_mib(producer_out), _maxrss_mib(consumer_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=1024 * MiB)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--encrypted", action="store_true", help="clients only, encrypted")
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return

    workdir = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    path = workdir / "payload.bin"
    with path.open("wb") as f:
        for piece in generated(args.size):
            f.write(piece)
    if args.encrypted:
        sys.path.insert(0, str(ROOT))
        from client.config._keys import keygen

        keygen(workdir / "key.txt")
        os.environ["BENCH_IDENTITY_FILE"] = str(workdir / "key.txt")
    seaweed = SeaweedFS().start()
    broker = Mosquitto(max_packet_size=262144, extra_config="set_tcp_nodelay true").start()
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    rows = []
    try:
        make_bucket(seaweed, bucket)
        with gateway_process(seaweed, bucket, broker=broker) as gw:
            if args.encrypted:
                idle, producer, consumer = clients_peak(broker, gw.url, path)
                print(
                    f"encrypted: client peak RSS: idle {idle:.0f} MiB, producer {producer:.0f} "
                    f"MiB, consumer {consumer:.0f} MiB for a {args.size / MiB:.0f} MiB file"
                )
                for name, value in (("producer", producer), ("consumer", consumer)):
                    rows.append(absolute_row(
                        "5 memory", f"encrypted {name} peak, {args.size // MiB} MiB file "
                        f"(idle {idle:.0f})", value, "MiB", f"< {LIMIT_MIB}", value < LIMIT_MIB,
                    ))  # fmt: skip
                emit(rows)
                return
            before, peak, hwm = gateway_peak(gw.url, gw.pid, args.size)
            print(
                f"gateway RSS: before {before:.0f} MiB, sampled peak {peak:.0f} MiB, "
                f"VmHWM {hwm:.0f} MiB (target < {LIMIT_MIB})"
            )
            worst = max(peak, hwm) if hwm == hwm else peak
            rows.append(
                absolute_row(
                    "5 memory",
                    f"gateway peak, {args.size // MiB} MiB up + down at once",
                    worst,
                    "MiB",
                    f"< {LIMIT_MIB}",
                    worst < LIMIT_MIB,
                )
            )
            idle, producer, consumer = clients_peak(broker, gw.url, path)
            print(
                f"client peak RSS: idle {idle:.0f} MiB, producer {producer:.0f} MiB, "
                f"consumer {consumer:.0f} MiB for a {args.size / MiB:.0f} MiB file"
            )
            for name, value in (("producer", producer), ("consumer", consumer)):
                rows.append(
                    absolute_row(
                        "5 memory",
                        f"{name} peak, {args.size // MiB} MiB file (idle {idle:.0f})",
                        value,
                        "MiB",
                        f"< {LIMIT_MIB}",
                        value < LIMIT_MIB,
                    )
                )
    finally:
        broker.close()
        seaweed.close()
        shutil.rmtree(workdir, ignore_errors=True)
    emit(rows)


if __name__ == "__main__":
    main()
