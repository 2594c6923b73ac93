"""The gateway's store probe (`offload_store_up`, gateway/core/_health.py) against a store
that accepts connections and never answers: it says "down" within its 5 s bound, and keeps
one check in flight, not one per probe (tests/test_prometheus.py has it against a store
that stops)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest


@pytest.fixture
def silent_store() -> Iterator[tuple[int, list[socket.socket]]]:
    """A listener that accepts every connection and never sends a byte."""
    accepted: list[socket.socket] = []
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    server.close()


def test_a_store_that_never_answers_is_down_within_the_bound_with_one_check_in_flight(
    silent_store: tuple[int, list[socket.socket]],
) -> None:
    from gateway.core import StoreProbe, WorkerPool
    from gateway.core._health import PROBE_TIMEOUT
    from gateway.storage import open_store

    port, accepted = silent_store
    # The store client's own timeout far beyond the probe's: the probe's bound must hold.
    store = open_store(
        f"s3://127.0.0.1:{port}/bucket?secure=false", access_key="a", secret_key="b", timeout=60
    )
    pool = WorkerPool("store", 4)
    probe = StoreProbe(store, pool, interval=0.05)

    async def run() -> float:
        start = time.monotonic()
        probe.start()
        while probe.up is not False:
            await asyncio.sleep(0.02)
        took = time.monotonic() - start
        await asyncio.sleep(1.0)  # twenty more probes meanwhile
        await probe.stop()
        return took

    try:
        took = asyncio.run(run())
    finally:
        pool.shutdown()  # the thread still in the check ends with the test's listener
    assert PROBE_TIMEOUT - 0.1 <= took < PROBE_TIMEOUT + 1.0
    assert probe.up is False
    assert len(accepted) == 1  # one check, waited for by every probe since
