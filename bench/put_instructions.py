"""Instructions the store side of a proxied upload costs, signed or checksummed (callgrind).

On a loaded machine CPU seconds move from run to run; instruction counts do not. Starts
SeaweedFS, then runs one Python process per case under `valgrind --tool=callgrind`: it
opens `S3Store(..., checksums=...)` (`ensure_bucket`, with the checksum probe) and stores
0 or `--uploads` payloads of `--size` bytes from memory with `put_stream`. The difference
between the two counts of a case, per GiB, is what storing costs the gateway's process:
signing each body with its SHA-256, or sending it `UNSIGNED-PAYLOAD` with its CRC-32C
(issue 31 item 2). The pipe's own digests (the manifest's) are not in it.

    python bench/put_instructions.py                    # 2 x 32 MiB, both cases (~6 min)
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

from _harness import MiB, SeaweedFS, make_bucket

ROOT = Path(__file__).resolve().parents[1]


def child(
    endpoint: str, bucket: str, access: str, secret: str, checks: str, n: int, size: int
) -> None:
    sys.path.insert(0, str(ROOT))
    from gateway.storage import S3Store

    store = S3Store(
        endpoint, bucket, access_key=access, secret_key=secret, checksums=checks == "1", timeout=120
    )
    store.ensure_bucket()
    data = os.urandom(size)
    for i in range(n):
        store.put_stream(f"instructions/{i}", io.BytesIO(data), len(data))
    assert store.checksums == (checks == "1"), "the store did not take checksummed bodies"


def count(seaweed: SeaweedFS, bucket: str, checks: str, n: int, size: int) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         __file__, "--child", seaweed.endpoint, bucket, seaweed.access_key, seaweed.secret_key,
         checks, str(n), str(size)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = re.search(r"Collected : (\d+)", out.stderr)
    assert found, out.stderr[-2000:]
    return int(found[1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        endpoint, bucket, access, secret, checks, n, size = sys.argv[2:9]
        child(endpoint, bucket, access, secret, checks, int(n), int(size))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--uploads", type=int, default=2)
    parser.add_argument("--size", type=int, default=32 * MiB)
    args = parser.parse_args()
    seaweed = SeaweedFS().start()
    try:
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        make_bucket(seaweed, bucket)
        gib = args.uploads * args.size / 1024**3
        for checks, name in (("0", "signed with the SHA-256"), ("1", "unsigned + CRC-32C")):
            idle = count(seaweed, bucket, checks, 0, args.size)
            busy = count(seaweed, bucket, checks, args.uploads, args.size)
            print(
                f"{name}: {idle / 1e6:,.1f} M instructions without uploads, {busy / 1e6:,.1f} M "
                f"with {args.uploads} x {args.size / MiB:g} MiB: "
                f"{(busy - idle) / gib / 1e9:.2f} G instructions per GiB",
                flush=True,
            )
    finally:
        seaweed.close()


if __name__ == "__main__":
    main()
