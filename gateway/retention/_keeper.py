"""What a message's deletion does to the retention state, and the repairs a crash needs.

Blocking (a store thread: `OffloadService.forget`'s, or the sweeper's). A message goes
index first, then its sidecar (`gateway.ingest.ManifestRepository.forget`), then here:

1. its confirmations (`acks/<id>.<token>/`);
2. its payload: a message from before records (no `blob`) deletes its object as ever; any
   other leaves its record (`Blobs.unlink`), and the last message of a record makes it
   dying: its bytes are given back to the account under the record's event, its object
   and the record are deleted, then the event is settled (`bury`).

Each step is idempotent and each state a crash can leave is one the sweeper finishes: a
dying record is buried again, a record whose bytes were never counted (`charge` left set)
is counted (`settle_charge`), a journal event whose record is gone is settled.
"""

from __future__ import annotations

import logging
import time

from client.protocol import Manifest, ack_prefix

from ..storage import ObjectStore
from ._accounts import Accounts
from ._blobs import Blobs
from ._ledger import LedgerDoc
from ._records import Record, record_account, ref_of

log = logging.getLogger("gateway.retention")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Keeper:
    """Deletes what a message leaves behind.

    Args:
        store: the bucket.
        blobs: the stored payloads' records.
        accounts: the ledgers; None when no quota is kept (nothing is counted).
    """

    def __init__(self, store: ObjectStore, blobs: Blobs, accounts: Accounts | None) -> None:
        self.store = store
        self.blobs = blobs
        self.accounts = accounts

    @classmethod
    def plain(cls, store: ObjectStore) -> Keeper:
        """A keeper that counts nothing (no ledger): a service or sweeper built alone."""
        return cls(store, Blobs(store), None)

    @classmethod
    def counting(cls, store: ObjectStore) -> Keeper:
        """A keeper that gives bytes back to the accounts' ledgers (a sweeper built alone,
        for a bucket with quotas)."""
        return cls(store, Blobs(store), Accounts(store))

    def release(self, manifest: Manifest) -> None:
        """After the message's index and sidecar are gone: its confirmations and payload."""
        if manifest.groups:
            self.drop_acks(manifest)
        if manifest.blob is None:
            if manifest.filed_at is None:  # its own object, from before records
                self.store.delete(manifest.data_key)
            return
        record = self.blobs.unlink(manifest.blob, ref_of(manifest), now_ms())
        if record is not None and record.state == "dying":
            self.bury(manifest.blob, record)

    def drop_acks(self, manifest: Manifest) -> None:
        for info in self.store.list(ack_prefix(manifest.id, manifest.token)):
            self.store.delete(info.key)

    def bury(self, key: str, record: Record) -> None:
        """A dying record: its bytes given back (once), its object and itself deleted."""
        account = record_account(key)
        event = record.event or "x"
        if self.accounts is not None and account is not None:

            def give_back(doc: LedgerDoc) -> LedgerDoc:
                if record.charge is not None and record.charge in doc.holds:
                    return doc.release(record.charge)  # its bytes were never counted
                return doc.uncharge(event, record.size, key, now_ms())

            self.accounts.apply_now(account, give_back)
        self.blobs.bury(key, record)
        if self.accounts is not None and account is not None:
            self.accounts.apply_now(account, lambda doc: doc.settle(event))

    def settle_charge(self, key: str, record: Record) -> None:
        """A record whose bytes may not be counted yet (a commit stopped in between):
        counted now when its hold is still held (`LedgerDoc.charge` is a no-op when it is
        not: then they were), and the record settled."""
        account = record_account(key)
        charge = record.charge
        if charge is None:
            return
        if self.accounts is not None and account is not None:
            self.accounts.apply_now(account, lambda doc: doc.charge(charge, record.size))
        self.blobs.settle(key)
