"""Soak: bench/soak.py's chaos soak at a smaller scale, the shortened run of issue 29.

Every publish that returned must reach every persistent-session consumer intact (its SHA-256
verified), none as an error, while the broker, each gateway replica and the store restart.
It replaced an older soak of this file (two producers, one gateway SIGKILLed and the store
restarted twice each), whose every guarantee it checks too, with the broker restarted and
persistent sessions besides; the 5-minute run is `python -u bench/soak.py --duration 300`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.servers, pytest.mark.slow]


def test_chaos_soak_short() -> None:
    """bench/soak.py at a smaller scale: one restart of each kind (broker gracefully with
    persistence, each gateway replica SIGKILLed, the store SIGKILLed), 4 producers and 4
    persistent-session consumers (two slow, so the broker holds a backlog for them when it
    restarts), sizes 1 KiB to 4 MiB across the 256 KiB broker. Every publish that returned
    reaches every consumer intact; duplicates are only reported. With the broker's
    persistence off, the slow consumers lose about 90 of 200 and partial chunked messages
    time out: the test fails."""
    # Loaded by path: bench/ on sys.path would shadow packages (bench/proxy.py is not proxy/).
    path = Path(__file__).resolve().parents[1] / "bench" / "soak.py"
    spec = importlib.util.spec_from_file_location("bench_soak", path)
    assert spec is not None and spec.loader is not None
    bench_soak = importlib.util.module_from_spec(spec)
    sys.modules["bench_soak"] = bench_soak  # its dataclasses look their module up
    spec.loader.exec_module(bench_soak)
    soak = bench_soak.Soak(seed=7, pause=0.5, slow=0.25)
    try:
        soak.start()
        figures = soak.run(0, rounds=1, gap=1.0, drain=60)
    finally:
        soak.close()
    print("\n".join(figures.lines()))
    assert all(figures.restarts[k] == 1 for k in ("broker", "gateway-a", "gateway-b", "store"))
    assert len(figures.published) >= 20, "the producers hardly published: the soak showed nothing"
    assert {"offloaded", "chunked"} <= set(figures.routes), figures.routes
    assert figures.backlog[0] > 0, "nothing was waiting at the broker when it restarted"
    assert figures.corrupt == []
    assert figures.errors == []
    for consumer in figures.delivered:
        assert figures.missing(consumer) == set(), (consumer, sorted(figures.missing(consumer)))
