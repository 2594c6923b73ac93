"""Coverage-guided fuzzing of the BSON envelope parser with atheris (libFuzzer).

Run from the repository root (atheris is not a test dependency: ``pip install atheris``)::

    python tests/fuzz/fuzz_envelope.py tests/fuzz/corpus_envelope -max_total_time=60

The first input byte picks how the rest is sliced into feeds, so split states are explored
too. Any exception other than MalformedEnvelope, or a parse pymongo disagrees with, is a
crash. ``python tests/fuzz/fuzz_envelope.py --replay`` runs the committed corpus without
atheris (the unit tests do the same).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import bson
from bson import Binary, CodecOptions
from bson.timestamp import Timestamp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from client.core._exceptions import MalformedEnvelope
from client.protocol._envelope import Complete, EnvelopeParser, PayloadData

CORPUS = Path(__file__).parent / "corpus_envelope"
_TZ_AWARE: CodecOptions[Any] = CodecOptions(tz_aware=True)


def _pymongo_view(value: Any) -> Any:
    # We read 0x11 as hop.bson does (uint64); pymongo reads it as a Timestamp.
    if isinstance(value, Timestamp):
        return (value.time << 32) | value.inc
    if isinstance(value, dict):
        return {k: _pymongo_view(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_pymongo_view(v) for v in value]
    return value


def check(data: bytes) -> None:
    """Parse `data` (its first byte is the feed size); fail loudly on any wrong outcome."""
    if not data:
        return
    step, body = data[0] + 1, data[1:]
    parser = EnvelopeParser(max_document=1 << 20, max_fields=1 << 14)
    events = []
    try:
        for start in range(0, len(body), step):
            events += parser.feed(body[start : start + step])
        parser.end()
    except MalformedEnvelope:
        return
    payload = b"".join(bytes(e.data) for e in events if isinstance(e, PayloadData))
    last = events[-1]
    assert isinstance(last, Complete)
    decoded = bson.decode(body, codec_options=_TZ_AWARE)  # must not raise: we accepted it
    assert decoded.pop("message") in (payload, Binary(payload, 2))
    assert _pymongo_view(decoded) == dict(last.fields)


def replay() -> int:
    """Run every committed corpus file through `check`; returns how many ran."""
    files = sorted(CORPUS.iterdir())
    for path in files:
        check(path.read_bytes())
    return len(files)


def main() -> None:
    if sys.argv[1:] == ["--replay"]:
        print(f"replayed {replay()} inputs")
        return
    import atheris  # type: ignore[import-untyped]  # optional, no stubs

    atheris.instrument_all()  # coverage feedback for the already imported parser
    atheris.Setup(sys.argv, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
