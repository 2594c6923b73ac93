"""Worker threads, sized on purpose and kept apart where one kind would wait on another.

The store SDK and PBKDF2 block, so they run in threads. Before this module everything used
asyncio's default executor (`min(32, cores + 4)` threads): a streaming upload held one of
those threads for its whole life while feeding it, reading manifests and checking
passwords needed threads from the same pool, so a handful of concurrent uploads wedged
the gateway for good. Now:

* `Transfers`: one thread per streaming upload or download, and exactly as many threads
  as transfers may run (`OFFLOAD_MAX_TRANSFERS`). A transfer is admitted before it starts
  (`Transfers.admit`) or refused at once with 503 and `Retry-After`; an admitted transfer
  never waits for a thread, and nothing else runs in this pool. The event loop feeds an
  upload without a thread hop (`gateway.ingest._pipe`), so no transfer needs a second thread, and
  reads a download from S3 itself (`gateway.storage._async_http`), as it stores a small
  upload (`gateway.ingest._small`): those take a slot and leave its thread idle.
* `WorkerPool("store")`: short object-store calls (manifest reads, deletes, pings,
  resumable-upload state), each bounded by the store client's own timeouts; it never waits
  on a transfer. A retention sweep also runs here (one thread while it lasts). An S3
  store's manifest and index writes go from the event loop instead, once it can sign them
  there (`S3Store.writes_now`), each bounded by the same timeouts.
* `WorkerPool("hash")`: password hashing (HTTP Basic's PBKDF2; SCRAM and tokens are
  decided on the event loop); it can queue only so much (`max_waiting`) before it answers
  503, so a login flood cannot grow memory.

Each pool remembers when its queued jobs were submitted, so `/healthz` can tell a pool that
makes progress from one that does not (`Workers.health`) without waiting on it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import ctypes
import ctypes.util
import gc
import itertools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from starlette.types import Message, Receive

from ._errors import GatewayError
from ._settings import Settings

P = ParamSpec("P")
T = TypeVar("T")

RETRY_AFTER = "2"  # seconds; a transfer slot usually frees within a few


class Saturated(GatewayError):
    """Every slot of a bounded resource is taken: 503 with `Retry-After`, at once."""

    status = 503

    def __init__(self, reason: str) -> None:
        super().__init__(reason, {"Retry-After": RETRY_AFTER})


class WorkerPool:
    """A named thread pool that knows how long its queued jobs have waited.

    Args:
        name: shown in thread names and in `/healthz`.
        size: threads.
        max_waiting: jobs that may wait for a thread before `submit` raises `Saturated`
            (0: no bound).
    """

    def __init__(self, name: str, size: int, *, max_waiting: int = 0) -> None:
        self.name = name
        self.size = size
        self.max_waiting = max_waiting
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=size, thread_name_prefix=f"offload-{name}"
        )
        self._lock = threading.Lock()
        self._queued: dict[int, float] = {}  # job -> when it was submitted (monotonic)
        self._running = 0
        self._tokens = itertools.count()
        self._probe: concurrent.futures.Future[None] | None = None

    def submit(
        self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> concurrent.futures.Future[T]:
        """Queue `fn` (with the caller's context variables, as `asyncio.to_thread` does)."""
        token = next(self._tokens)
        context = contextvars.copy_context()
        with self._lock:
            if self.max_waiting and len(self._queued) >= self.max_waiting:
                raise Saturated(f"the {self.name} workers are saturated, retry later")
            self._queued[token] = time.monotonic()

        def job() -> T:
            with self._lock:
                self._queued.pop(token, None)
                self._running += 1
            try:
                return context.run(fn, *args, **kwargs)
            finally:
                with self._lock:
                    self._running -= 1

        future = self._executor.submit(job)
        # A job cancelled before it started never runs `job`: forget it here too.
        future.add_done_callback(lambda _: self._forget(token))
        return future

    def _forget(self, token: int) -> None:
        with self._lock:
            self._queued.pop(token, None)

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` in this pool, awaited from the event loop."""
        return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))

    def oldest_wait(self) -> float:
        """Seconds the longest-queued job has waited for a thread (0: none waiting)."""
        with self._lock:
            oldest = min(self._queued.values(), default=None)
        return 0.0 if oldest is None else time.monotonic() - oldest

    def probe(self) -> None:
        """Queue a no-op unless one is pending: a pool whose threads are all stuck then
        has a waiting job, and `oldest_wait` grows until `/healthz` reports it."""
        if self._probe is None or self._probe.done():
            # A full queue already has waiting jobs to measure.
            with contextlib.suppress(Saturated):
                self._probe = self.submit(_nothing)

    def stats(self) -> dict[str, float]:
        with self._lock:
            waiting, running = len(self._queued), self._running
        return {"threads": self.size, "running": running, "waiting": waiting}

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _nothing() -> None:
    return None


class Slot:
    """One admitted transfer: its right to one thread of the transfer pool.

    Released exactly once (`release` is idempotent), from any thread. `touch` records that
    bytes moved, which is what `/healthz` calls progress.
    """

    def __init__(self, owner: Transfers) -> None:
        self._owner = owner
        self.last_progress = time.monotonic()
        self.released = False

    def touch(self) -> None:
        self.last_progress = time.monotonic()

    def submit(
        self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> concurrent.futures.Future[T]:
        """Run `fn` on the transfer pool; a slot has at most one job at a time."""
        return self._owner.pool.submit(fn, *args, **kwargs)

    def release(self) -> None:
        self._owner._release(self)


class Transfers:
    """Admission control for streaming uploads and downloads, one thread per transfer.

    Args:
        limit: transfers at once; the pool has exactly this many threads.
        idle_timeout: seconds a request body may stall (the transfer thread waits a
            little longer than this for the next piece, then gives up).
        store_timeout: seconds a transfer waits for the store to take a piece or finish.
    """

    def __init__(self, limit: int, *, idle_timeout: float, store_timeout: float) -> None:
        self.limit = limit
        self.idle_timeout = idle_timeout
        self.store_timeout = store_timeout
        self.pool = WorkerPool("transfer", limit)
        self._lock = threading.Lock()
        self._active: set[Slot] = set()
        self.refused = 0
        self.admitted = 0  # transfers ever admitted
        # Transfers ever ended: the clean-up's "anything to clean?". Not `admitted`: a
        # transfer still running at a clean-up leaves its garbage when it ends, after it.
        self.finished = 0

    def admit(self) -> Slot:
        """A slot for one transfer, or `Saturated` (503, Retry-After) when all are taken."""
        with self._lock:
            if len(self._active) >= self.limit:
                self.refused += 1
                raise Saturated(f"too many transfers in progress (limit {self.limit}), retry later")
            slot = Slot(self)
            self._active.add(slot)
            self.admitted += 1
            return slot

    def _release(self, slot: Slot) -> None:
        with self._lock:
            if not slot.released:
                slot.released = True
                self._active.discard(slot)
                self.finished += 1

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._active)

    def stalled(self, bound: float) -> int:
        """Slots that moved no byte for `bound` seconds."""
        now = time.monotonic()
        with self._lock:
            return sum(1 for s in self._active if now - s.last_progress > bound)


def _find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None elsewhere (musl, macOS)."""
    if sys.platform != "linux":
        return None
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    return trim


_malloc_trim = _find_malloc_trim()


def _give_back_memory() -> None:
    """Free what abandoned transfers left in reference cycles, then return it to the OS.

    A response abandoned half way (client gone, send timed out) leaves its last pieces
    in cycles through the task group's error handling (4 MiB each, measured: 20 dropped
    downloads kept 80 MiB until a collection), and glibc keeps freed heap in per-thread
    arenas (50 aborted uploads left 400 MiB resident that a trim gave back). Run when
    transfers have run, at most every 30 s: once they go idle, or while they are not.
    """
    gc.collect()
    if _malloc_trim is not None:
        _malloc_trim(0)


class RequestEnd:
    """What the current request leaves to its end: closers to run, and whether its client
    is known to have gone (an `http.disconnect` came out of its `receive`)."""

    __slots__ = ("closers", "gone")

    def __init__(self) -> None:
        self.closers: list[Callable[[], None]] = []
        self.gone = False

    def watch(self, receive: Receive) -> Receive:
        """`receive`, noting the disconnect: Starlette's streaming responses listen for it
        in a task of their own, so a stream learns of it by reading `gone`, not awaiting."""

        async def watched() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone = True
            return message

        return watched


_request: contextvars.ContextVar[RequestEnd | None] = contextvars.ContextVar(
    "offload_request_end", default=None
)


@contextlib.contextmanager
def request_scope() -> Iterator[RequestEnd]:
    """Run what `close_at_request_end` registered when the request ends, however it ends.

    A response stream abandoned half way (client gone, send timed out) is otherwise only
    closed when the garbage collector finds it, which holds its transfer slot and store
    connection for an unbounded time.
    """
    end = RequestEnd()
    token = _request.set(end)
    try:
        yield end
    finally:
        _request.reset(token)
        for closer in end.closers:
            closer()


def close_at_request_end(closer: Callable[[], None]) -> None:
    """Register `closer` (idempotent, never raising) with the current request, if any."""
    end = _request.get()
    if end is not None:
        end.closers.append(closer)


def current_request() -> RequestEnd | None:
    """The current request's `RequestEnd` (None outside `request_scope`)."""
    return _request.get()


@dataclass
class Health:
    ok: bool
    detail: dict[str, Any] = field(default_factory=dict)


class Workers:
    """The gateway's three pools, built once in the lifespan.

    Args:
        max_transfers: streaming uploads and downloads at once.
        store_threads: threads for short object-store calls.
        hash_threads: threads for password hashing.
        idle_timeout: seconds a request body may stall.
        store_timeout: seconds a transfer waits for the store.
    """

    def __init__(
        self,
        *,
        max_transfers: int,
        store_threads: int,
        hash_threads: int,
        idle_timeout: float,
        store_timeout: float,
    ) -> None:
        self.transfers = Transfers(
            max_transfers, idle_timeout=idle_timeout, store_timeout=store_timeout
        )
        self.store = WorkerPool("store", store_threads)
        self.hashing = WorkerPool("hash", hash_threads, max_waiting=32 * hash_threads)
        self._heartbeat: asyncio.Task[None] | None = None
        self.loop_lag = 0.0

    @classmethod
    def defaults(cls) -> Workers:
        """The pools with the settings' default sizes and timeouts (environment ignored)."""
        return cls.from_settings(Settings.model_construct())

    @classmethod
    def from_settings(cls, settings: Settings) -> Workers:
        return cls(
            max_transfers=settings.max_transfers,
            store_threads=settings.store_threads,
            hash_threads=settings.hash_threads,
            idle_timeout=settings.body_idle_timeout,
            store_timeout=settings.store_stall_timeout,
        )

    def start(self) -> None:
        """Start measuring the event loop's lag (call on the loop)."""
        self._heartbeat = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self, interval: float = 0.5, cleanup_every: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        seen = self.transfers.finished  # transfers ended by the last clean-up
        idle = 0  # beats in a row without a transfer
        cleaned = loop.time()
        while True:
            before = loop.time()
            await asyncio.sleep(interval)
            now = loop.time()
            self.loop_lag = max(0.0, now - before - interval)
            active = self.transfers.active
            dirty = self.transfers.finished != seen  # one ended since: it left garbage
            idle = 0 if active else idle + 1
            # At most every `cleanup_every`, once idle for a second or while busy: a full
            # collection of the gateway's heap costs 35-50 CPU-ms, and doing one each time
            # transfers paused (every transfer of a sequential client) was 16 % of the
            # gateway's CPU in bench/gateway_vs_s3.py (bench/RESULTS.md, issue 15).
            if dirty and now - cleaned > cleanup_every and (idle >= 2 or active):
                cleaned, seen = now, self.transfers.finished
                with contextlib.suppress(Saturated, RuntimeError):
                    self.store.submit(_give_back_memory)

    def health(self, *, bound: float, transfer_bound: float) -> Health:
        """Whether every pool makes progress; never waits.

        Args:
            bound: seconds a queued job may wait for a store or hash thread.
            transfer_bound: seconds every transfer may go without moving a byte while all
                slots are taken (longer than any timeout that should have ended them).
        """
        detail: dict[str, Any] = {"event_loop_lag": round(self.loop_lag, 3)}
        ok = self.loop_lag <= bound
        for pool in (self.store, self.hashing):
            pool.probe()
            waited = pool.oldest_wait()
            stats = pool.stats()
            stats["oldest_wait"] = round(waited, 3)
            detail[pool.name] = stats
            ok = ok and waited <= bound
        active = self.transfers.active
        stalled = self.transfers.stalled(transfer_bound)
        detail["transfers"] = {"active": active, "limit": self.transfers.limit, "stalled": stalled}
        # Full and nobody moving for longer than every timeout allows: nothing will free.
        ok = ok and not (active >= self.transfers.limit and stalled >= active)
        return Health(ok, detail)

    def shutdown(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        for pool in (self.transfers.pool, self.store, self.hashing):
            pool.shutdown()
