"""Micro-benchmark: the sans-I/O BSON envelope parser, no network, one core.

Two workloads, each repeated and reported as the best of the runs (the machine is shared,
so the best run is the least disturbed one):

* payload: one upload document with a SIZE-byte payload (default 256 MiB), fed to
  :class:`EnvelopeParser` in PIECE-byte slices (default 64 KiB), the way the gateway receives
  a hop-client upload; reported in MB/s of document bytes. This is the upload hot path.
* bytewise: the same kind of small document fed one byte per call, the worst slicing a
  peer can choose; every byte then goes through the incremental state machine.
* fields: many small documents (8 headers and a key around a 1 KiB payload) each fed in
  one piece, then read with ``upload_fields``; reported in documents/s. This is the path
  where the state machine's per-field steps dominate.

    python bench/envelope_parse.py
    python bench/envelope_parse.py --size 1GiB --piece 1MiB --runs 5

Prints human-readable lines and, last, one machine-readable ``RESULT`` JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from client.protocol import EnvelopeParser, encode_upload, upload_fields

MB = 1_000_000


def parse_size(text: str) -> int:
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "B": 1}
    upper = text.strip().upper()
    for suffix, factor in units.items():
        if upper.endswith(suffix):
            return int(float(upper[: -len(suffix)]) * factor)
    return int(upper)


def payload_run(size: int, piece: int) -> float:
    """Seconds to parse one `size`-byte payload document fed in `piece`-byte slices."""
    head, tail = encode_upload(size, headers=[("_id", b"x" * 16)], key=b"k")
    block = bytes(range(256)) * (piece // 256 + 1)
    block = block[:piece]
    parser = EnvelopeParser(max_document=1 << 31)
    seen = 0
    start = time.perf_counter()
    parser.feed(head)
    left = size
    while left:
        take = min(piece, left)
        for event in parser.feed(block if take == piece else block[:take]):
            data = getattr(event, "data", None)
            if data is not None:
                seen += len(data)
        left -= take
    parser.feed(tail)
    parser.end()
    elapsed = time.perf_counter() - start
    if seen != size:
        raise SystemExit(f"payload bytes seen {seen} != {size}")
    return elapsed


def fields_run(count: int) -> float:
    """Seconds to parse `count` small documents with headers and read their fields."""
    headers = [(f"header-{i}", b"v" * 32) for i in range(8)]
    head, tail = encode_upload(1024, headers=headers, key=b"key")
    document = head + b"p" * 1024 + tail
    start = time.perf_counter()
    for _ in range(count):
        parser = EnvelopeParser(max_document=1 << 20)
        events = parser.feed(document)
        parser.end()
        upload_fields(events[-1].fields)  # type: ignore[union-attr]
    return time.perf_counter() - start


def bytewise_run(count: int) -> float:
    """Seconds to parse `count` small documents fed one byte at a time (worst-case slicing)."""
    headers = [(f"header-{i}", b"v" * 32) for i in range(8)]
    head, tail = encode_upload(16, headers=headers, key=b"key")
    pieces = [bytes([b]) for b in head + b"p" * 16 + tail]
    start = time.perf_counter()
    for _ in range(count):
        parser = EnvelopeParser(max_document=1 << 20)
        for piece in pieces:
            parser.feed(piece)
        parser.end()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256MiB", help="payload size (default 256MiB)")
    parser.add_argument("--piece", default="64KiB", help="feed slice size (default 64KiB)")
    parser.add_argument("--docs", type=int, default=20_000, help="small documents per run")
    parser.add_argument("--runs", type=int, default=5, help="repetitions (best is kept)")
    args = parser.parse_args()
    size, piece = parse_size(args.size), parse_size(args.piece)

    payload = min(payload_run(size, piece) for _ in range(args.runs))
    doc_bytes = size + 64
    mbps = doc_bytes / payload / MB
    per_feed = payload / -(-size // piece) * 1e6
    print(
        f"payload: {size} bytes in {piece}-byte pieces: best {payload * 1e3:.1f} ms, "
        f"{mbps:.0f} MB/s, {per_feed:.2f} us per feed"
    )
    fields = min(fields_run(args.docs) for _ in range(args.runs))
    rate = args.docs / fields
    print(f"fields: {args.docs} documents, 8 headers: best {fields * 1e3:.1f} ms, {rate:.0f}/s")
    small = max(1, args.docs // 20)
    bytewise = min(bytewise_run(small) for _ in range(args.runs))
    byte_rate = small / bytewise
    print(f"bytewise: {small} docs, 1-byte feeds: best {bytewise * 1e3:.1f} ms, {byte_rate:.0f}/s")
    rows = [
        {"bench": "envelope parse", "metric": "payload", "value": round(mbps), "unit": "MB/s"},
        {"bench": "envelope parse", "metric": "feed", "value": round(per_feed, 2), "unit": "us"},
        {"bench": "envelope parse", "metric": "fields", "value": round(rate), "unit": "docs/s"},
        {
            "bench": "envelope parse",
            "metric": "bytewise",
            "value": round(byte_rate),
            "unit": "docs/s",
        },
    ]
    print("RESULT " + json.dumps(rows))


if __name__ == "__main__":
    main()
