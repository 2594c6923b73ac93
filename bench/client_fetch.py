"""Benchmark: the client's fetch (`HttpTransport.fetch`) against urllib3 reading the same body.

A tiny keep-alive HTTP/1.1 server (this script with `--serve`, `os.sendfile` from a file in
the temp directory: almost no server CPU) answers every GET with the same random body.
Readers, each in its own child process, alternate round by round:

* `urllib3`: `PoolManager().request(...).data`, what the MinIO SDK's get does (no check);
* `fetch`: `HttpTransport.fetch` kept in memory (size and SHA-256 checked);
* `fetch, spooled`: the same written to a temporary file (`spool_threshold=0`);

and, with `--compare NAME=DIR` (repeatable), the same two fetches by another copy of the
`client` package (a `git archive <commit> client` unpacked in DIR), so a change is measured
against its parent in one interleaved run. Printed per reader: median wall ms per body and
CPU-s per GiB of the whole reading process (every thread: the hasher's CPU counts).

    python bench/client_fetch.py                          # 32 MiB, 8 rounds x 3 reads
    python bench/client_fetch.py --compare before=/tmp/before --rounds 12
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


def serve(path: str) -> None:
    """Answer every request on a connection with the file's bytes; print the port first."""
    size = os.path.getsize(path)
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    print(sock.getsockname()[1], flush=True)

    def one(conn: socket.socket) -> None:
        fd = os.open(path, os.O_RDONLY)
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                buf = buf.partition(b"\r\n\r\n")[2]
                conn.sendall(head)
                sent = 0
                while sent < size:
                    sent += os.sendfile(conn.fileno(), fd, sent, size - sent)
        except OSError:
            pass
        finally:
            os.close(fd)
            conn.close()

    while True:
        conn, _ = sock.accept()
        threading.Thread(target=one, args=(conn,), daemon=True).start()


def child(reader: str, url: str, size: int, sha256: str, reps: int) -> None:
    """Read the body `reps` times with `reader`; print [(wall s, process CPU s)] as JSON."""
    import urllib3

    from client.http._transport import HttpTransport

    pool = urllib3.PoolManager()
    transport = HttpTransport()

    def once() -> None:
        if reader == "urllib3":
            assert len(pool.request("GET", url).data) == size
            return
        spool = 0 if reader == "spooled" else size
        got = transport.fetch(
            url, expected_sha256=sha256, expected_size=size, spool_threshold=spool
        )
        assert got.size == size
        got.discard()

    once()  # warm-up: the connection, imports
    out = []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        once()
        out.append((time.perf_counter() - t0, time.process_time() - c0))
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=32 * MiB)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3, help="reads per child per round")
    parser.add_argument(
        "--compare", action="append", default=[], help="NAME=DIR of another `client` package"
    )
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.child:
        reader, url, size, sha256, reps = args.child
        child(reader, url, int(size), sha256, int(reps))
        return

    body = os.urandom(args.size)
    sha256 = hashlib.sha256(body).hexdigest()
    with tempfile.NamedTemporaryFile(prefix="bench-fetch-") as f:
        f.write(body)
        f.flush()
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", f.name], stdout=subprocess.PIPE, text=True
        )
        try:
            assert server.stdout is not None
            url = f"http://127.0.0.1:{int(server.stdout.readline())}/payload"
            impls = {f"{n} ": d for n, _, d in (c.partition("=") for c in args.compare)}
            impls[""] = str(ROOT)
            readers = [("urllib3", "", str(ROOT))] + [
                (reader, label, path)
                for label, path in impls.items()
                for reader in ("fetch", "spooled")
            ]
            results: dict[str, list[tuple[float, float]]] = {}
            for _ in range(args.rounds):
                for reader, label, path in readers:
                    env = dict(os.environ, PYTHONPATH=os.pathsep.join([path, str(ROOT)]))
                    cmd = [sys.executable, __file__, "--child", reader, url]
                    cmd += [str(args.size), sha256, str(args.reps)]
                    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
                    if done.returncode:
                        raise SystemExit(done.stderr)
                    name = f"{label}{reader}"
                    results.setdefault(name, []).extend(map(tuple, json.loads(done.stdout)))
        finally:
            server.kill()
    gib = args.size / (1 << 30)
    floor = statistics.median(w for w, _ in results["urllib3"])
    print(f"{args.size // MiB} MiB, {args.rounds} rounds x {args.reps} reads, interleaved")
    for name, runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs) / gib
        print(
            f"{name:16s} {wall * 1000:6.1f} ms  {cpu:.2f} CPU-s/GiB  "
            f"throughput / urllib3's {floor / wall:.2f}"
        )


if __name__ == "__main__":
    main()
