"""The request path's view of retention: holds before bytes, records at commit, links,
confirmations, usage (see the package docstring)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import ParamSpec, TypeVar

from client.protocol import QUOTA_HEADER, Manifest, ack_key, ack_prefix, parse_ack_key

from ..core import Forbidden, PayloadTooLarge, StorageUnavailable, WorkerPool
from ..storage import ObjectStore, StoreError
from ._accounts import Accounts, account_of
from ._blobs import Adopted, Blobs
from ._groups import Groups
from ._keeper import Keeper, now_ms
from ._ledger import LedgerDoc, Refused
from ._metrics import DEDUP, QUOTA_REFUSALS
from ._records import ref_of

log = logging.getLogger("gateway.retention")

P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class Hold:
    """One upload's reservation on its account's ledger (a no-op without a quota).

    `reserve` before bytes are written; `cover` as bytes of an upload of unknown length
    arrive (a part at a time: at most one part past the cap); the commit turns it into
    stored bytes (`Retention.adopt`), anything else `release`s it.
    """

    retention: Retention
    user: str | None
    ident: str
    reserved: int = 0
    ended: bool = False
    until: int = 0  # ms: when the ledger lets it lapse, as this request last set it

    @property
    def counted(self) -> bool:
        return self.retention.accounts is not None

    async def reserve(self, size: int, *, until: int | None = None, slack: int = 0) -> None:
        """`size` more bytes, refused with 413 naming the quota when they do not fit.

        Args:
            size: bytes to add to the hold.
            until: when the hold lapses (ms); default: the retention's hold time from now.
            slack: how far past the cap they may go (`LedgerDoc.reserve`).
        """
        accounts = self.retention.accounts
        if accounts is None or size <= 0:
            return
        deadline = until if until is not None else self.retention.hold_until()
        cap = self.retention.cap
        result = await accounts.apply(
            self.user, lambda doc: doc.reserve(self.ident, size, deadline, cap, slack)
        )
        if isinstance(result, Refused):
            QUOTA_REFUSALS.inc()
            raise PayloadTooLarge(
                result.reason(), {QUOTA_HEADER: "OFFLOAD_MAX_STORED_BYTES_PER_USER"}
            )
        self.reserved += size
        self.until = deadline

    async def cover(self, total: int) -> None:
        """Bytes received so far: reserve the next part when they pass what is held (an
        upload of unknown length), and keep the hold from lapsing under a slow one."""
        if not self.counted:
            return
        if total > self.reserved:
            part = self.retention.part
            await self.reserve(max(part, total - self.reserved), slack=part)
        elif self.reserved and now_ms() > self.until - self.retention.hold_seconds * 500:
            self.until = self.retention.hold_until()
            await self.refresh(self.until)

    async def refresh(self, until: int) -> None:
        accounts = self.retention.accounts
        if accounts is not None and self.reserved:
            await accounts.apply(self.user, lambda doc: doc.refresh(self.ident, until))

    async def release(self) -> None:
        """The upload ended without a commit: its bytes count no more. Never raises (a
        hold left behind lapses)."""
        accounts = self.retention.accounts
        if accounts is None or self.ended or not self.reserved:
            return
        self.ended = True
        try:
            await accounts.apply(self.user, lambda doc: doc.release(self.ident))
        except StorageUnavailable as exc:
            log.warning("could not release hold %s: %s", self.ident, exc)


@dataclass(frozen=True, slots=True)
class Adoption:
    """A message as it is committed, and the object of its own that is now redundant
    (its bytes were already stored for the account: delete them once committed)."""

    manifest: Manifest
    redundant: str | None = None


@dataclass(frozen=True, slots=True)
class Confirmation:
    """What a confirmation did."""

    counted: bool  # this group's confirmation is recorded (now or before)
    remaining: tuple[str, ...]  # the groups that have not confirmed yet
    complete: bool  # every group confirmed: the message is to be deleted
    reason: str = ""
    new: bool = False  # recorded by this call (not a member's repeat)


@dataclass(frozen=True, slots=True)
class Usage:
    """An account's bytes, as its ledger says."""

    stored: int
    held: int
    limit: int


class Retention:
    """Holds, records, links, confirmations and usage for the request path.

    Args:
        store: the bucket.
        calls: the pool store calls run in (`Workers.store`).
        groups: the groups file in force.
        dedup: keep one object per payload per account (records; links).
        cap: `OFFLOAD_MAX_STORED_BYTES_PER_USER` (0: no quota, no ledger).
        part: bytes an upload of unknown length reserves at a time.
        hold_seconds: how long a hold lasts without news of its upload.
    """

    def __init__(
        self,
        store: ObjectStore,
        calls: WorkerPool,
        *,
        groups: Groups,
        dedup: bool = True,
        cap: int = 0,
        part: int = 8 * 1024 * 1024,
        hold_seconds: float = 900.0,
    ) -> None:
        if cap and not dedup:
            raise ValueError(
                "OFFLOAD_MAX_STORED_BYTES_PER_USER counts the stored payloads' records: it "
                "needs OFFLOAD_DEDUP=true"
            )
        self.store = store
        self.calls = calls
        self.groups = groups
        self.dedup = dedup
        self.cap = cap
        self.part = part
        self.hold_seconds = hold_seconds
        self.blobs = Blobs(store)
        self.accounts = Accounts(store, calls) if cap else None
        self.keeper = Keeper(store, self.blobs, self.accounts)

    def hold_until(self) -> int:
        return now_ms() + int(self.hold_seconds * 1000)

    def hold(self, user: str | None, ident: str | None = None, reserved: int = 0) -> Hold:
        """A new upload's hold; for an upload that spans requests (tus, direct) its stable
        name `ident` and what an earlier request `reserved`."""
        return Hold(self, user, ident or f"u-{uuid.uuid4().hex}", reserved, until=now_ms())

    @asynccontextmanager
    async def holding(self, user: str | None) -> AsyncIterator[Hold]:
        """A hold released when the block fails (a commit has consumed it otherwise)."""
        hold = self.hold(user)
        try:
            yield hold
        except BaseException:
            await hold.release()
            raise

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await self.calls.run(fn, *args, **kwargs)
        except StoreError as exc:
            raise StorageUnavailable(f"object store unavailable: {exc}") from exc

    # -- commit -------------------------------------------------------------------------

    async def adopt(
        self, manifest: Manifest, user: str | None, hold: Hold | None, *, verified: bool = True
    ) -> Adoption:
        """The message as committed: its groups, and its payload counted once.

        With records kept, the account's existing copy of this content takes the message
        (its own object becomes redundant, its hold is released); else its object becomes
        the copy and its hold the stored bytes. A payload whose SHA-256 is the uploader's
        word alone (`verified` False) keeps a record of its own (`Record.verified`).
        """
        manifest = replace(manifest, groups=self.groups.rules.groups_for(manifest.topic))
        if not self.dedup:
            return Adoption(manifest)
        hold = hold or self.hold(user)
        if hold.counted and hold.reserved < manifest.size:  # written already: no refusal
            await self._top_up(hold, manifest.size - hold.reserved)
        charge = hold.ident if hold.counted and hold.reserved else None
        adopted = await self._run(
            self.blobs.adopt,
            account_of(user),
            manifest.sha256,
            manifest.size,
            data_key=manifest.data_key,
            ref=ref_of(manifest),
            charge=charge,
            at=now_ms(),
            crc32c=manifest.crc32c,
            verified=verified,
        )
        if not adopted.new:
            DEDUP.labels("commit").inc()
            await hold.release()
            linked = _linked(manifest, adopted)
            return Adoption(linked, redundant=manifest.data_key)
        if charge is not None and self.accounts is not None:
            size = manifest.size
            await self.accounts.apply(user, lambda doc: doc.charge(charge, size))
            hold.ended = True
            await self._run(self.blobs.settle, adopted.key, adopted.known)
        return Adoption(replace(manifest, blob=adopted.key))

    async def _top_up(self, hold: Hold, size: int) -> None:
        accounts = self.accounts
        assert accounts is not None
        until = self.hold_until()
        await accounts.apply(hold.user, lambda doc: doc.reserve(hold.ident, size, until, 0))
        hold.reserved += size

    async def link(self, manifest: Manifest, user: str | None) -> Manifest | None:
        """`manifest` (its own key in `data_key`, no object there) linked to the account's
        stored copy of its content; None when the account stores none (or records are
        off). Never looks outside the caller's account."""
        if not self.dedup:
            return None
        adopted = await self._run(
            self.blobs.link,
            account_of(user),
            manifest.sha256,
            manifest.size,
            ref_of(manifest),
            now_ms(),
        )
        if adopted is None:
            return None
        DEDUP.labels("link").inc()
        groups = self.groups.rules.groups_for(manifest.topic)
        return _linked(replace(manifest, groups=groups), adopted)

    async def unadopt(self, manifest: Manifest) -> None:
        """Undo `adopt` for a message that was not committed after all (its id was taken)."""
        if manifest.blob is not None:
            await self._run(self.keeper.release, manifest)

    # -- confirmations ------------------------------------------------------------------

    async def confirm(self, manifest: Manifest, group: str, user: str | None) -> Confirmation:
        """Record `group`'s confirmation of `manifest` (created only where none exists:
        members of one group count once) and say whether every group has now confirmed.

        Raises:
            Forbidden: the group lists its members and `user` is not one.
        """
        if group not in manifest.groups:
            reason = (
                "not a group this message waits for: nothing recorded"
                if manifest.groups
                else "this message waits for no group (its topic has none): it stays until "
                "it expires"
            )
            return Confirmation(False, manifest.groups, False, reason)
        if not self.groups.rules.may_confirm(group, user):
            raise Forbidden(f"not a member of group {group!r}: only its members may confirm")
        key = ack_key(manifest.id, manifest.token, group)
        body = f'{{"at":{now_ms()}}}'.encode()
        new = await self._run(self.store.create_bytes, key, body)
        confirmed = await self._run(self._confirmed, manifest)
        remaining = tuple(g for g in manifest.groups if g not in confirmed)
        return Confirmation(True, remaining, not remaining, new=new)

    def _confirmed(self, manifest: Manifest) -> set[str]:
        groups = set()
        for info in self.store.list(ack_prefix(manifest.id, manifest.token)):
            parsed = parse_ack_key(info.key)
            if parsed is not None:
                groups.add(parsed.group)
        return groups

    # -- usage --------------------------------------------------------------------------

    async def usage(self, user: str | None) -> Usage | None:
        """The account's stored and held bytes; None without a quota (nothing counted)."""
        if self.accounts is None:
            return None
        doc: LedgerDoc = await self._run(self.accounts.read, account_of(user))
        return Usage(doc.stored, doc.held, self.cap)


def _linked(manifest: Manifest, adopted: Adopted) -> Manifest:
    """`manifest` served from the account's copy: filed at its own key, reading the
    record's object (with the CRC-32C the record keeps, for readers that check it)."""
    return replace(
        manifest,
        blob=adopted.key,
        data_key=adopted.record.key,
        filed_at=manifest.home,
        crc32c=manifest.crc32c or adopted.record.crc32c,
    )
