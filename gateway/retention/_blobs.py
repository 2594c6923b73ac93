"""The records of stored payloads in the store: link, adopt, unlink, bury (see `_records`).

Blocking: call from a store thread. Every change is a conditional write (`_docs.update`),
so two replicas linking, unlinking or adopting one content at once each see the other's
change; a dying record is never revived (a copy arriving meanwhile gets the next record).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace

from ..storage import ObjectStore, Versioned
from ._docs import Change, update
from ._records import Record, record_account, record_key

log = logging.getLogger("gateway.retention")


@dataclass(frozen=True, slots=True)
class Adopted:
    """The record a committed payload is counted in."""

    key: str  # the record's key
    record: Record
    new: bool  # True: the payload's own object became the account's copy
    version: str | None = None  # the record's version as this adoption wrote it

    @property
    def known(self) -> Versioned | None:
        """The record as written (for a next change without a read), when known."""
        return None if self.version is None else Versioned(self.record.to_json(), self.version)


def _read(raw: bytes | None) -> Record | None:
    """A record from its bytes; None when absent or unreadable (never linked to)."""
    if raw is None:
        return None
    try:
        return Record.from_json(raw)
    except ValueError:
        return None


class Blobs:
    """The account's stored-payload records in `store`."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def _candidates(self, account: str, sha256: str, size: int) -> Iterator[str]:
        """Record keys of this content, the first generation first (the only one, nearly
        always: the others are listed only when it cannot take another message)."""
        first = record_key(account, sha256, size)
        yield first
        prefix = first.removesuffix(".json")
        for info in self.store.list(prefix):
            if info.key != first and info.key.startswith(prefix + ".") and record_account(info.key):
                yield info.key

    def link(self, account: str, sha256: str, size: int, ref: str, at: int) -> Adopted | None:
        """Add `ref` to a live record of this content; None when the account stores none."""
        for number, key in enumerate(self._candidates(account, sha256, size)):
            seen: list[Record | None] = []

            def add(raw: bytes | None, seen: list[Record | None] = seen) -> Change[Record | None]:
                record = _read(raw)
                seen.append(record)
                if record is None or not record.linkable:
                    return Change(None, None)
                if ref in record.refs:
                    return Change(None, record)
                linked = record.with_ref(ref, at)
                return Change(linked.to_json(), linked)

            record, _ = update(self.store, key, add)
            if record is not None:
                return Adopted(key, record, new=False)
            if number == 0 and seen[-1] is None:
                return None  # no first record: no later one was made either (nearly always)
        return None

    def adopt(
        self,
        account: str,
        sha256: str,
        size: int,
        *,
        data_key: str,
        ref: str,
        charge: str | None,
        at: int,
        crc32c: str | None = None,
        verified: bool = True,
    ) -> Adopted:
        """Link `ref` to the account's copy of this content, or make `data_key` that copy.

        Args:
            account: the account's digest.
            sha256: the payload's SHA-256.
            size: its size.
            data_key: the object just written, which becomes the copy when none is there.
            ref: the message (`_records.ref_of`).
            charge: the hold the object's bytes are counted under (None: no ledger).
            at: now, in ms.
            crc32c: the object's, kept for the messages linked to it later.
            verified: whether `sha256` was checked against the bytes (`Record.verified`):
                an unverified payload gets a record of its own, never linked either way.
        """
        made = Record(
            data_key, size, sha256, {ref: at},
            charge=charge, at=at, crc32c=crc32c, verified=verified,
        )  # fmt: skip
        if verified:
            # Nearly every payload is new to its account: one conditional create makes its
            # record (no read first); one that exists is read and linked to below.
            first = record_key(account, sha256, size)
            version = self.store.write_versioned(first, made.to_json(), version=None)
            if version is not None:
                return Adopted(first, made, new=True, version=version)
            linked = self.link(account, sha256, size, ref, at)
            if linked is not None:
                return linked
        generation = 0
        while True:
            key = record_key(account, sha256, size, generation)

            def create(
                raw: bytes | None, made: Record = made, key: str = key
            ) -> Change[Adopted | None]:
                record = _read(raw)
                if raw is None:
                    return Change(made.to_json(), Adopted(key, made, new=True))
                if record is not None and record.linkable and verified:
                    linked = record.with_ref(ref, at)  # another upload made it meanwhile
                    return Change(linked.to_json(), Adopted(key, linked, new=False))
                return Change(None, None)  # dying, full or unreadable: the next one

            adopted, written = update(self.store, key, create)
            if adopted is not None:
                return replace(adopted, version=written.version if written else None)
            generation += 1

    def settle(self, key: str, known: Versioned | None = None) -> None:
        """The record's bytes are counted in the ledger: clear its `charge` (`known`: the
        record as its adoption wrote it, tried first instead of a read)."""

        def clear(raw: bytes | None) -> Change[None]:
            record = _read(raw)
            if record is None or record.charge is None:
                return Change(None, None)
            return Change(record.settled().to_json(), None)

        update(self.store, key, clear, known=known)

    def unlink(self, key: str, ref: str, at: int) -> Record | None:
        """Remove `ref`; the record after it (dying when it was the last), None when this
        call removed nothing (the record is gone or unreadable, or `ref` was not in it):
        only the call that made a record dying buries it."""

        def drop(raw: bytes | None) -> Change[Record | None]:
            record = _read(raw)
            if record is None or ref not in record.refs:
                return Change(None, None)
            after = record.without_ref(ref, at)
            return Change(after.to_json(), after)

        record, _ = update(self.store, key, drop)
        return record

    def read(self, key: str) -> Record | None:
        found = self.store.read_versioned(key)
        return None if found is None else _read(found.data)

    def bury(self, key: str, record: Record) -> None:
        """A dying record's end: its object, then the record (idempotent)."""
        self.store.delete(record.key)
        self.store.delete(key)
