"""Per-user caps on open uploads: direct-upload grants and resumable (tus) uploads.

Without them one user could open thousands of uploads of the largest size in a minute,
each leaving an incomplete multipart upload or a staged upload in the store. Each open
upload is a small record in the store, so every replica counts the same ones:

    quota/<user digest>/<kind>-<id>.<expires>.<size>    body: what the sweeper needs

* before a grant or a tus creation, the user's records that have not expired are listed:
  at `OFFLOAD_MAX_OPEN_UPLOADS` of them, or when the new upload's size would take their
  sum past `OFFLOAD_MAX_RESERVED_BYTES`, the request is refused with 429 and `Retry-After`
  (a refusal, not a fault: it passes when the user's uploads finish or expire);
* the record goes when the upload ends (commit, refusal or abandon; tus completion or
  termination); one that never ends stops counting at its expiry and the sweeper deletes
  it, aborting a grant's multipart upload on the way.

Approximate under concurrency across replicas, by design: requests of one user that check
at the same instant at two replicas may each pass (no lock across replicas; on one replica a
grant's check and record are serialised per user). The caps bound what one user can take;
they are not an exact ledger. Anonymous callers (when allowed) share one record set.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from ..core import StorageUnavailable, TooManyRequests, WorkerPool
from ..storage import ObjectStore, StoreError

log = logging.getLogger("gateway")

QUOTA_PREFIX = "quota/"
#: Longest Retry-After answered: uploads usually finish well before they expire.
MAX_RETRY_AFTER = 60


@dataclass(frozen=True, slots=True)
class Record:
    """One open upload, as its record's key names it."""

    key: str
    ident: str  # `<kind>-<id>`
    expires: int  # Unix seconds
    size: int


def user_prefix(user: str | None) -> str:
    """The folder of a user's records (a digest: user names are not key-safe)."""
    name = b"\x00anonymous" if user is None else user.encode("utf-8")
    return f"{QUOTA_PREFIX}{hashlib.sha256(name).hexdigest()[:32]}/"


def parse_record(key: str) -> Record | None:
    """The record a key names; None for any other key."""
    if not key.startswith(QUOTA_PREFIX):
        return None
    name = key.rsplit("/", 1)[-1]
    ident, _, rest = name.partition(".")
    expires, _, size = rest.partition(".")
    if not (ident and expires.isascii() and expires.isdigit() and size.isascii()):
        return None
    if not size.isdigit():
        return None
    return Record(key, ident, int(expires), int(size))


class Quotas:
    """The caps, checked and recorded in the store (any replica sees every record).

    Args:
        store: the gateway's object store.
        calls: the pool short store calls run in (`Workers.store`).
        max_open: open uploads per user; 0: no cap (records are kept all the same).
        max_bytes: bytes those may reserve together; 0: no cap.
    """

    def __init__(
        self, store: ObjectStore, calls: WorkerPool, *, max_open: int, max_bytes: int
    ) -> None:
        self.store = store
        self.calls = calls
        self.max_open = max_open
        self.max_bytes = max_bytes
        # One admission per user at a time on this replica (kept while anyone holds one).
        self._locks: weakref.WeakValueDictionary[str | None, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    @asynccontextmanager
    async def admitting(self, user: str | None, size: int) -> AsyncIterator[None]:
        """`check`, then the block (which `record`s the upload) before the user's next check.

        So concurrent requests of one user at one replica cannot all pass the check before
        any of them is recorded; across replicas the caps stay approximate.
        """
        lock = self._locks.get(user)
        if lock is None:
            lock = self._locks[user] = asyncio.Lock()
        async with lock:
            await self.check(user, size)
            yield

    async def check(self, user: str | None, size: int) -> None:
        """Refuse (429) when one more upload of `size` bytes would pass a cap of `user`'s."""
        if self.max_open or self.max_bytes:
            await self._run(self._check, user, size, time.time())

    async def record(
        self, user: str | None, ident: str, *, expires: int, size: int, body: bytes = b"{}"
    ) -> None:
        """Count an upload that `check` admitted, until `release` or its expiry.

        Kept with the caps off too: the sweeper finds abandoned grants by their records.
        """
        key = f"{user_prefix(user)}{ident}.{expires}.{size}"
        await self._run(self.store.put_bytes, key, body)

    async def release(self, user: str | None, ident: str) -> None:
        """The upload ended: it counts no more. Never raises: the upload's outcome stands,
        and a record left behind stops counting at its expiry (the sweeper deletes it)."""
        try:
            await self.calls.run(self._release, user, ident)
        except StoreError as exc:
            log.warning("could not release the open-upload record %s: %s", ident, exc)

    async def _run(self, fn: Callable[..., None], *args: object) -> None:
        try:
            await self.calls.run(fn, *args)
        except StoreError as exc:
            raise StorageUnavailable(f"object store unavailable: {exc}") from exc

    def _records(self, user: str | None) -> Iterator[Record]:
        for info in self.store.list(user_prefix(user)):
            record = parse_record(info.key)
            if record is not None:
                yield record

    def _check(self, user: str | None, size: int, now: float) -> None:
        live = [r for r in self._records(user) if r.expires > now]
        who = "anonymous callers" if user is None else f"user {user!r}"
        soonest = min((r.expires for r in live), default=now + 1)
        retry = {"Retry-After": str(min(MAX_RETRY_AFTER, max(1, math.ceil(soonest - now))))}
        if self.max_open and len(live) >= self.max_open:
            raise TooManyRequests(
                f"{who} already has {len(live)} open uploads (OFFLOAD_MAX_OPEN_UPLOADS="
                f"{self.max_open}): finish or abandon some first",
                retry,
            )
        reserved = sum(r.size for r in live)
        if self.max_bytes and reserved + size > self.max_bytes:
            raise TooManyRequests(
                f"{who} has {reserved} bytes in open uploads; {size} more would pass "
                f"OFFLOAD_MAX_RESERVED_BYTES={self.max_bytes}: finish or abandon some first",
                retry,
            )

    def _release(self, user: str | None, ident: str) -> None:
        for record in list(self._records(user)):
            if record.ident == ident:
                self.store.delete(record.key)


def grant_record_body(key: str, upload_id: str) -> bytes:
    """What the sweeper needs to abort an abandoned grant's multipart upload."""
    return json.dumps({"key": key, "upload_id": upload_id}).encode("utf-8")


def abandoned_grant(raw: bytes | None) -> tuple[str, str] | None:
    """`(key, upload_id)` of an expired grant's record body; None when it has none."""
    try:
        doc = json.loads(raw or b"")
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    key, upload_id = doc.get("key"), doc.get("upload_id")
    if isinstance(key, str) and isinstance(upload_id, str) and key and upload_id:
        return key, upload_id
    return None
