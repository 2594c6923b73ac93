"""Retention: delete expired messages and abandoned payloads from the object store.

One sweep walks the id index (`ids/`), then the payloads and sidecars (`data/`):

* a manifest whose `expires` has passed is deleted index first, then sidecar, then payload,
  so a reader never finds an index naming a payload that is already gone (and the gateway
  refuses expired manifests anyway, sweeper or not);
* a payload or sidecar that no index names is what a crash between the payload write and
  the index write leaves behind. It is deleted once its key's hour partition is older than
  the grace period *and* an earlier sweep of this process already saw it unreferenced: an
  upload that ran for longer than the grace period writes its index milliseconds after its
  payload appears, never a whole sweep interval later.

Then it removes abandoned resumable uploads (`uploads/`): an upload whose `Upload-Expires` has
passed, with its staged segments, and segments whose upload state is gone. An expired upload
can no longer be continued on any replica (it answers 410), so removing it races nothing.
Last, the claims direct-upload commits leave (`grants/`) once their grant is long expired,
and the records of open uploads (`quota/`, `gateway.ingest._quotas`) once theirs expired, aborting
the multipart upload of a direct-upload grant that was never committed or abandoned.

Every delete is idempotent, so several gateway replicas may sweep the same bucket; the
interval is jittered so they do not all list at once. Keys outside the layout are left alone.

Each full sweep is counted (`offload_sweeper_runs_total{result="ok|failed"}`) and the end of
the last one that went well is kept (`offload_sweeper_last_success_timestamp_seconds`): the
alert on a sweeper that keeps failing reads them (docs/operations.md, "Alerts").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from client.protocol import (
    DATA_PREFIX,
    INDEX_PREFIX,
    META_SUFFIX,
    Manifest,
    ProtocolError,
    index_key,
    meta_key,
    parse_data_key,
)

from .core import WorkerPool
from .direct import GRANTS_PREFIX, claim_expiry
from .ingest import QUOTA_PREFIX, ManifestRepository, abandoned_grant, parse_record
from .retention import DELETED, SWEEP_FAILED, SWEEP_OK, SWEEP_SUCCESS, Keeper, RetentionSweep, Tally
from .storage import DirectStore, ObjectStore, StoreError
from .tus import cleanup_expired_uploads

log = logging.getLogger("gateway.sweeper")

HOUR_MS = 3600 * 1000


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What one sweep did."""

    expired: int = 0  # messages deleted because their expiry passed
    orphans: int = 0  # unreferenced payloads or sidecars deleted
    kept: int = 0  # live messages seen
    suspects: int = 0  # unreferenced objects seen for the first time (deleted next sweep)
    errors: int = 0  # objects skipped: unreadable manifest or a store error
    uploads: int = 0  # abandoned resumable uploads removed, with their segments
    confirmed: int = 0  # messages deleted because every group confirmed them
    records: int = 0  # payload records finished or left stale messages (gateway/retention)


def partition_end_ms(payload_key: str) -> int | None:
    """The end of the hour partition a payload key was written in (ms), None off-layout."""
    parsed = parse_data_key(payload_key)
    if parsed is None:
        return None
    try:
        start = datetime.strptime(f"{parsed.date} {parsed.hour}", "%Y-%m-%d %H")
    except ValueError:
        return None
    return int(start.replace(tzinfo=UTC).timestamp() * 1000) + HOUR_MS


class Sweeper:
    """Deletes expired and abandoned objects; run it in the gateway's lifespan.

    Args:
        store: the bucket to sweep.
        interval: mean seconds between sweeps (jittered by +-20 %).
        grace: seconds an unreferenced payload may exist before it counts as abandoned.
        direct: aborts the multipart uploads of direct-upload grants never committed.
        keeper: what deleting a message does to the retention state (the gateway's);
            default: nothing is counted (`Keeper.plain`).
        confirm_interval: mean seconds between the short passes over group confirmations
            (`RetentionSweep.confirmations`; jittered); 0: only within full sweeps.
        cap: the stored-bytes quota, for the usage metrics' bands (0: none).
        top_accounts: accounts named in `offload_account_stored_bytes`.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        interval: float = 600.0,
        grace: float = 3600.0,
        direct: DirectStore | None = None,
        keeper: Keeper | None = None,
        confirm_interval: float = 0.0,
        cap: int = 0,
        top_accounts: int = 10,
    ):
        self.store = store
        self.direct = direct
        self.repository = ManifestRepository(store, keeper)
        self.interval = interval
        self.confirm_interval = confirm_interval
        self.grace_ms = int(grace * 1000)
        self.retention = RetentionSweep(
            store,
            self.repository.keeper,
            read=self.repository.read,
            forget=self._forget,
            grace_ms=self.grace_ms,
            cap=cap,
            top=top_accounts,
        )
        self._suspects: set[str] = set()
        self._stopping = threading.Event()
        self._task: asyncio.Task[None] | None = None

    # -- one sweep (blocking: call from a worker thread) ---------------------------------

    def sweep_once(self, now_ms: int | None = None) -> SweepReport:
        """Run one full sweep and report what it did.

        Args:
            now_ms: the time to judge expiry by (ms since the epoch); defaults to now.

        Raises:
            StoreError: the store could not be listed at all.
        """
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        live, refs, expired, kept, errors = self._sweep_index(now)
        tally = Tally()
        if not self._stopping.is_set():
            # A manifest the index pass could not read is a message it cannot vouch for:
            # then no record loses a message this sweep (`refs` would be short of it).
            live_refs = refs if errors == 0 else None
            for key in self.retention.records(now, live_refs, tally):
                live.setdefault(key, "record")  # a record's object: never an orphan
        data_expired, orphans, suspects, data_errors = self._sweep_data(live, now)
        uploads, upload_errors = self._sweep_uploads(now)
        if not self._stopping.is_set():
            self.retention.ledgers(now, tally)
            self.retention.confirmations(tally)
            self.retention.stale_lists(now)
        report = SweepReport(
            expired + data_expired,
            orphans,
            kept,
            suspects,
            errors + data_errors + upload_errors + tally.errors,
            uploads,
            tally.confirmed,
            tally.stale + tally.buried,
        )
        if report.expired or orphans or report.errors or uploads or report.records:
            log.info("sweep: %s", report)
        return report

    def confirm_once(self) -> int:
        """The short pass: delete what every group confirmed; how many messages went.

        Raises:
            StoreError: the confirmations could not be listed.
        """
        tally = Tally()
        self.retention.confirmations(tally)
        return tally.confirmed

    def _sweep_index(self, now: int) -> tuple[dict[str, str], set[str], int, int, int]:
        """The id index: expired messages deleted. The live payloads and messages' own
        keys (key -> message id), the live messages as their records name them
        (`<id>.<token>`), and how many were expired, kept and skipped."""
        expired = kept = errors = 0
        live: dict[str, str] = {}
        refs: set[str] = set()
        for info in self.store.list(INDEX_PREFIX):
            if self._stopping.is_set():
                break
            try:
                manifest = self._read(info.key)
                if manifest is None:
                    continue
                if manifest.expires is not None and manifest.expires <= now:
                    self._forget(manifest)
                    DELETED.labels("expired").inc()
                    expired += 1
                else:
                    live[manifest.data_key] = live[manifest.home] = str(manifest.id)
                    refs.add(f"{manifest.id}.{manifest.token}")
                    kept += 1
            except (StoreError, ProtocolError) as exc:
                errors += 1
                log.warning("sweep: skipping %s: %s", info.key, exc)
        return live, refs, expired, kept, errors

    def _sweep_data(self, live: dict[str, str], now: int) -> tuple[int, int, int, int]:
        """Payloads and sidecars no index names: expired ones deleted, orphans deleted at
        their second sighting. How many were expired, orphans, new suspects and skipped."""
        payloads: set[str] = set()
        sidecars: set[str] = set()
        for info in self.store.list(DATA_PREFIX):
            if info.key.endswith(META_SUFFIX):
                sidecars.add(info.key[: -len(META_SUFFIX)])
            else:
                payloads.add(info.key)
        expired = orphans = errors = 0
        suspects: set[str] = set()
        for key in sorted(payloads | sidecars):
            if self._stopping.is_set():
                break
            if key in live:
                continue
            try:
                verdict = self._judge(key, has_sidecar=key in sidecars, now=now)
            except (StoreError, ProtocolError) as exc:
                errors += 1
                log.warning("sweep: skipping %s: %s", key, exc)
                continue
            if verdict == "expired":
                expired += 1
            elif verdict == "orphan":
                if key in self._suspects:
                    self._delete(meta_key(key), key)
                    orphans += 1
                else:
                    suspects.add(key)
        self._suspects = suspects
        return expired, orphans, len(suspects), errors

    def _sweep_uploads(self, now: int) -> tuple[int, int]:
        """Abandoned resumable uploads, grant claims and open-upload records: how many
        uploads were removed, and how many parts were skipped."""
        uploads = errors = 0
        if not self._stopping.is_set():
            try:
                uploads = cleanup_expired_uploads(self.store, now / 1000)
            except StoreError as exc:
                errors += 1
                log.warning("sweep: abandoned uploads skipped: %s", exc)
        if not self._stopping.is_set():
            try:
                self._sweep_claims(now)
                uploads += self._sweep_open_uploads(now)
            except StoreError as exc:
                errors += 1
                log.warning("sweep: grant claims or open-upload records skipped: %s", exc)
        return uploads, errors

    def _sweep_claims(self, now: int) -> None:
        """Delete direct-upload grant claims (`gateway.direct._transfers`) long past expiry.

        A grant past its expiry commits no more (its commit answers the message it made, or
        403), so its claim is only kept for the grace period, against clocks that disagree.
        """
        for info in self.store.list(GRANTS_PREFIX):
            if self._stopping.is_set():
                return
            expires = claim_expiry(info.key)
            if expires is not None and expires * 1000 + self.grace_ms < now:
                self.store.delete(info.key)

    def _sweep_open_uploads(self, now: int) -> int:
        """Delete expired open-upload records (`gateway.ingest._quotas`); abort abandoned grants'.

        A grant's record outlives its grant by the grace period before its multipart upload
        is aborted, so a commit that began just before the expiry is never cut off.
        Returns how many multipart uploads were aborted.
        """
        aborted = 0
        for info in self.store.list(QUOTA_PREFIX):
            if self._stopping.is_set():
                break
            record = parse_record(info.key)
            if record is None or record.expires * 1000 + self.grace_ms >= now:
                continue
            grant = abandoned_grant(self.store.get_bytes(info.key))
            if grant is not None and self.direct is not None:
                self.direct.abort_multipart(*grant)  # no error when it was completed
                aborted += 1
                log.info("sweep: aborted the multipart upload of abandoned grant %s", grant[0])
            self.store.delete(info.key)
        return aborted

    def _judge(self, key: str, *, has_sidecar: bool, now: int) -> str:
        """'expired' (and deleted), 'orphan', or 'keep' for a payload key no index named."""
        if has_sidecar:
            manifest = self._read(meta_key(key))
            if manifest is not None and manifest.expires is not None and manifest.expires <= now:
                self._forget(manifest)
                return "expired"
            # Committed after our index listing? Then its index names it now.
            if manifest is not None and self._indexed(manifest):
                return "keep"
        end = partition_end_ms(key)
        if end is None or now - end < self.grace_ms:
            return "keep"  # off-layout keys are not ours; young ones may be mid-commit
        if self._referenced_later(key):
            return "keep"
        return "orphan"

    def _indexed(self, manifest: Manifest) -> bool:
        current = self._read(index_key(manifest.id))
        return current is not None and current.home == manifest.home

    def _referenced_later(self, key: str) -> bool:
        """A point read of the sidecar, in case the listing raced a commit."""
        manifest = self._read(meta_key(key))
        return manifest is not None and self._indexed(manifest)

    def _read(self, key: str) -> Manifest | None:
        return self.repository.read(key)

    def _forget(self, manifest: Manifest) -> None:
        # Index first: once it is gone nothing serves the message, whatever fails next.
        self.repository.forget(manifest)

    def _read_lenient(self, key: str) -> Manifest | None:
        return self.repository.read_lenient(key)  # unreadable: treat as ours to delete

    def _delete(self, *keys: str) -> None:
        for key in keys:
            self.store.delete(key)

    # -- the background task -------------------------------------------------------------

    def next_delay(self) -> float:
        """Seconds to the next sweep: the interval with +-20 % jitter."""
        return self.interval * random.uniform(0.8, 1.2)

    def start(self, pool: WorkerPool) -> None:
        """Start sweeping in the running event loop (no-op when both intervals are 0).

        Args:
            pool: where each sweep runs (the gateway's `Workers.store`, seen by /healthz).
        """
        if (self.interval > 0 or self.confirm_interval > 0) and self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self._run(pool), name="offload-sweeper")

    async def stop(self) -> None:
        """Stop sweeping; a sweep in progress stops at its next object."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self, pool: WorkerPool) -> None:
        # A random first delay spreads replicas that started together.
        loop = asyncio.get_running_loop()
        first = self.interval or self.confirm_interval
        next_full = loop.time() + random.uniform(0.1, 1.0) * first if self.interval else math.inf
        while not self._stopping.is_set():
            short = self.confirm_interval * random.uniform(0.8, 1.2) or math.inf
            await asyncio.sleep(max(0.0, min(next_full - loop.time(), short)))
            if loop.time() >= next_full:
                await self._attempt(pool, self.sweep_once, counted=True)
                next_full = loop.time() + self.next_delay()
            else:
                await self._attempt(pool, self.confirm_once, counted=False)

    async def _attempt(
        self, pool: WorkerPool, sweep: Callable[[], object], *, counted: bool
    ) -> None:
        """One pass. A full sweep is counted by outcome, and the time of the last one that
        went well is kept: `offload_sweeper_runs_total{result}` and
        `offload_sweeper_last_success_timestamp_seconds`, what the alerts watch."""
        try:
            report = await pool.run(sweep)
        except StoreError as exc:
            failed = True
            log.warning("sweep skipped: object store unavailable: %s", exc)
        except Exception:  # a bug must not kill retention for the process's lifetime
            failed = True
            log.exception("sweep failed")
        else:
            failed = isinstance(report, SweepReport) and report.errors > 0
        if counted:
            (SWEEP_FAILED if failed else SWEEP_OK).inc()
            if not failed:
                SWEEP_SUCCESS.set(time.time())
