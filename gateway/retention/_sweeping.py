"""The sweeper's passes over the retention state (blocking: the sweeper's thread).

* `confirmations` (every `OFFLOAD_CONFIRM_SWEEP_INTERVAL`, and in each full sweep): a
  message every group of which confirmed is deleted (the replica that took the last
  confirmation deletes it at once; this finishes what one that died in between left);
  confirmations whose message is gone are removed.
* `records` (each full sweep): a record's messages that no longer exist (a crash between a
  commit's link and its index, or a deletion stopped before it left its record) are taken
  out once older than the grace period, and a record left dying or uncounted is finished.
  Returns the objects live records hold, which the orphan pass must leave alone.
* `ledgers` (each full sweep): holds whose upload never ended lapse after their `until`
  plus the grace period; journal events whose record is gone are settled; the accounts'
  totals are published as metrics, without a label per account beyond the few largest.
"""

from __future__ import annotations

import heapq
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from client.protocol import (
    ACKS_PREFIX,
    PENDING_PREFIX,
    Manifest,
    ProtocolError,
    index_key,
    parse_ack_key,
    pending_at,
)

from ..storage import ObjectStore, StoreError
from ._accounts import LEDGER_PREFIX, read_ledger
from ._accounts import parse_ledger_key as ledger_account
from ._blobs import Blobs
from ._keeper import Keeper
from ._ledger import LedgerDoc
from ._metrics import ACCOUNTS, DELETED, STORED_BYTES, TOP_ACCOUNTS
from ._records import BLOBS_PREFIX, Record, record_account

log = logging.getLogger("gateway.sweeper")

#: Age at which a Spark stream's verified list is taken for abandoned.
PENDING_TTL_MS = 24 * 3600 * 1000
#: Usage bands of `offload_accounts`, as shares of the quota.
BANDS = (("under_50", 0.5), ("50_to_80", 0.8), ("80_to_100", 1.0))


@dataclass
class Tally:
    """What the retention passes did (added to the sweeper's report)."""

    confirmed: int = 0  # messages deleted: every group confirmed
    stale: int = 0  # messages taken out of records they had left
    buried: int = 0  # records finished (dying, or their object gone with them)
    lapsed: int = 0  # holds of uploads that never ended
    errors: int = 0


class RetentionSweep:
    """The passes, over one bucket.

    Args:
        store: the bucket.
        keeper: deletes what a message leaves, counts bytes back (the gateway's).
        read: a manifest at a key (None: absent; raises ProtocolError when unreadable).
        forget: deletes a message, index first (`ManifestRepository.forget`).
        grace_ms: how old a half-done state must be before it counts as abandoned.
        cap: the quota (for the usage bands; 0: none).
        top: how many of the largest accounts are named in the metrics.
    """

    def __init__(
        self,
        store: ObjectStore,
        keeper: Keeper,
        *,
        read: Callable[[str], Manifest | None],
        forget: Callable[[Manifest], None],
        grace_ms: int,
        cap: int = 0,
        top: int = 10,
    ) -> None:
        self.store = store
        self.keeper = keeper
        self.blobs: Blobs = keeper.blobs
        self.read = read
        self.forget = forget
        self.grace_ms = grace_ms
        self.cap = cap
        self.top = top

    # -- confirmations ----------------------------------------------------------------------

    def confirmations(self, tally: Tally) -> None:
        """Delete what every group confirmed; drop confirmations of messages gone."""
        folders: dict[str, set[str]] = defaultdict(set)
        ids = {}
        for info in self.store.list(ACKS_PREFIX):
            parsed = parse_ack_key(info.key)
            if parsed is not None:
                folders[parsed.prefix].add(parsed.group)
                ids[parsed.prefix] = (parsed.message_id, parsed.token)
        for prefix, groups in folders.items():
            message_id, token = ids[prefix]
            try:
                manifest = self.read(index_key(message_id))
                if manifest is None or manifest.token != token:
                    self._drop(prefix)  # its message is gone (or the id is another's now)
                elif manifest.groups and set(manifest.groups) <= groups:
                    self.forget(manifest)
                    DELETED.labels("confirmed").inc()
                    tally.confirmed += 1
            except (StoreError, ProtocolError) as exc:
                tally.errors += 1
                log.warning("sweep: confirmations %s skipped: %s", prefix, exc)

    def stale_lists(self, now: int) -> None:
        """Delete a Spark stream's verified lists a day old (client/spark/_confirm.py: a
        batch never committed; replayed, it writes them again)."""
        for info in self.store.list(PENDING_PREFIX):
            written = pending_at(info.key)
            if written is not None and written < now - PENDING_TTL_MS:
                self.store.delete(info.key)

    def _drop(self, prefix: str) -> None:
        for info in self.store.list(prefix):
            self.store.delete(info.key)

    # -- records --------------------------------------------------------------------------

    def records(self, now: int, live: set[str] | None, tally: Tally) -> set[str]:
        """Finish records a crash left; the objects of live records.

        Args:
            now: the sweep's time, ms.
            live: `<id>.<token>` of every message the index names (`_records.ref_of`),
                listed before this pass began: a younger message is not in it, and refs
                younger than the grace period are never judged. None: the index could not
                be read whole, and no record loses a message.
            tally: what was done is counted here.
        """
        held: set[str] = set()
        for info in self.store.list(BLOBS_PREFIX):
            if record_account(info.key) is None:
                continue
            try:
                record = self.blobs.read(info.key)
                if record is not None:
                    key = self._record(info.key, record, now, live, tally)
                    if key is not None:
                        held.add(key)
            except StoreError as exc:
                tally.errors += 1
                log.warning("sweep: record %s skipped: %s", info.key, exc)
        return held

    def _record(
        self, key: str, record: Record, now: int, live: set[str] | None, tally: Tally
    ) -> str | None:
        old = now - self.grace_ms
        if record.state == "dying":
            if record.at < old:  # its deletion stopped half-way
                self.keeper.bury(key, record)
                tally.buried += 1
            return None
        if record.charge is not None and record.at < old:  # its commit stopped half-way
            self.keeper.settle_charge(key, record)
        if live is None:
            return record.key
        for ref, at in record.refs.items():
            if at < old and ref not in live:
                after = self.blobs.unlink(key, ref, now)
                tally.stale += 1
                if after is not None and after.state == "dying":
                    self.keeper.bury(key, after)
                    tally.buried += 1
                    return None
        return record.key

    # -- ledgers --------------------------------------------------------------------------

    def ledgers(self, now: int, tally: Tally) -> None:
        """Lapse abandoned holds, settle finished deletions, publish the totals."""
        accounts = self.keeper.accounts
        if accounts is None:
            return
        total = 0
        bands = dict.fromkeys([*(name for name, _ in BANDS), "full"], 0)
        largest: list[tuple[int, str]] = []
        for info in self.store.list(LEDGER_PREFIX):
            account = ledger_account(info.key)
            if account is None:
                continue
            try:
                found = self.store.read_versioned(info.key)
                doc = read_ledger(None if found is None else found.data)
                if self._stale(doc, now):
                    doc = self._tidy(account, doc, now, tally)
            except StoreError as exc:
                tally.errors += 1
                log.warning("sweep: ledger %s skipped: %s", info.key, exc)
                continue
            total += doc.stored
            bands[_band(doc.used, self.cap)] += 1
            heapq.heappush(largest, (doc.stored, doc.user or account))
            if len(largest) > self.top:
                heapq.heappop(largest)
        STORED_BYTES.set(total)
        for band, count in bands.items():
            ACCOUNTS.labels(band).set(count)
        TOP_ACCOUNTS.clear()
        for stored, name in largest:
            TOP_ACCOUNTS.labels(name).set(stored)

    def _stale(self, doc: LedgerDoc, now: int) -> bool:
        old = now - self.grace_ms
        return any(until < old for _, until in doc.holds.values()) or any(
            at < old for _, _, at in doc.journal.values()
        )

    def _tidy(self, account: str, doc: LedgerDoc, now: int, tally: Tally) -> LedgerDoc:
        old = now - self.grace_ms
        accounts = self.keeper.accounts
        assert accounts is not None
        gone = {
            event
            for event, (_, record, at) in doc.journal.items()
            if at < old and self.blobs.read(record) is None
        }
        tally.lapsed += sum(1 for _, until in doc.holds.values() if until < old)

        def tidy(current: LedgerDoc) -> LedgerDoc:
            for event in gone:
                current = current.settle(event)
            return current.lapse(before=old)

        result = accounts.apply_now(account, tidy)
        assert isinstance(result, LedgerDoc)
        return result


def _band(used: int, cap: int) -> str:
    if not cap:
        return "under_50"
    for name, share in BANDS:
        if used < cap * share:
            return name
    return "full"
