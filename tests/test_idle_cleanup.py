"""The gateway's memory clean-up runs after transfers, but not after every pause.

A full collection of the gateway's heap costs 35-55 CPU-ms; run after every pause between
short transfers it was 13-16 % of the gateway's CPU (bench/RESULTS.md, issue 15). The real
`Workers` heartbeat runs here with short periods; the full collections it starts are seen
through `gc.callbacks` (automatic collections are switched off meanwhile, so every one
counted is the clean-up's).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
from typing import Any

from gateway._executors import Workers

BEAT = 0.05  # seconds between heartbeats
EVERY = 1.0  # at most one clean-up per this many seconds


async def _scenario(stamps: list[float]) -> float:
    """Short transfers with pauses, then idle until the memory is given back (or 15 s)."""
    workers = Workers.defaults()
    beat = asyncio.create_task(workers._beat(interval=BEAT, cleanup_every=EVERY))
    try:
        start = time.monotonic()
        while time.monotonic() - start < 2.6:  # short transfers, each followed by a pause
            slot = workers.transfers.admit()
            await asyncio.sleep(3 * BEAT)  # seen busy by the heartbeat
            slot.release()
            await asyncio.sleep(4 * BEAT)  # idle for more than two beats
        last_transfer = time.monotonic()
        # Then idle: the memory is still given back, once. Waited for, not timed: a loaded
        # machine may delay the heartbeat and the store thread, never skip them.
        deadline = last_transfer + 15
        while not (stamps and stamps[-1] >= last_transfer) and time.monotonic() < deadline:
            await asyncio.sleep(BEAT)
        return last_transfer
    finally:
        beat.cancel()
        workers.shutdown()


def test_cleanup_runs_at_most_every_period_and_once_transfers_stop() -> None:
    stamps: list[float] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2:
            stamps.append(time.monotonic())

    was_enabled = gc.isenabled()
    gc.disable()
    gc.callbacks.append(seen)
    try:
        transfers_ended = asyncio.run(_scenario(stamps))
    finally:
        gc.callbacks.remove(seen)
        if was_enabled:
            gc.enable()
    # ~8 pauses of 4 beats each: the old heartbeat collected after every one of them.
    assert 1 <= len(stamps) <= 5, stamps
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert all(gap >= EVERY / 2 for gap in gaps), stamps  # the old: every ~0.35 s
    assert stamps[-1] >= transfers_ended, (stamps, transfers_ended)  # given back when idle
