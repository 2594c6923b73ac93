"""The accounts' ledgers in the store (`_ledger`), changed with conditional writes.

On the request path the changes of one account that arrive while one is being written wait
and go together in the next write (`Accounts.apply`): one conditional write for a burst of
holds and commits, however many uploads of the account run on this replica. Across
replicas the store's conditional write is what orders them: a replica whose write lost
reads the ledger again and applies its changes to what won, so a hold is checked against
every other replica's holds and commits, with no overshoot at all. The sweeper changes a
ledger by its key alone (`apply_now`), from its own thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable

from ..core import StorageUnavailable, WorkerPool
from ..storage import ObjectStore, StoreError, Versioned
from ._docs import Change, update
from ._ledger import LedgerDoc, Refused

LEDGER_PREFIX = "accounts/"
#: Ledgers whose last written copy this replica keeps, to write without reading first.
KNOWN = 1024

Op = Callable[[LedgerDoc], LedgerDoc | Refused]


def account_of(user: str | None) -> str:
    """An account's digest: how its ledger, records and quota records are named (user
    names are not key-safe; anonymous callers are one account)."""
    name = b"\x00anonymous" if user is None else user.encode("utf-8")
    return hashlib.sha256(name).hexdigest()[:32]


def ledger_key(account: str) -> str:
    return f"{LEDGER_PREFIX}{account}.json"


def parse_ledger_key(key: str) -> str | None:
    """The account digest a ledger key names; None for any other key."""
    name = key.removeprefix(LEDGER_PREFIX)
    if name == key or not name.endswith(".json"):
        return None
    account = name.removesuffix(".json")
    return account if len(account) == 32 and all(c in "0123456789abcdef" for c in account) else None


def read_ledger(raw: bytes | None) -> LedgerDoc:
    """A ledger from its bytes (absent: empty).

    Raises:
        StoreError: the object is not a ledger (never overwritten: an operator looks).
    """
    if raw is None:
        return LedgerDoc()
    try:
        return LedgerDoc.from_json(raw)
    except ValueError as exc:
        raise StoreError(str(exc)) from exc


class Accounts:
    """Every account's ledger, changed in batches per account.

    Args:
        store: where the ledgers live.
        calls: the pool store calls run in (`Workers.store`); None: only `apply_now` and
            `read` (a sweeper's or a tool's, on their own thread).
    """

    def __init__(self, store: ObjectStore, calls: WorkerPool | None = None) -> None:
        self.store = store
        self.calls = calls
        self._pending: dict[str, list[tuple[Op, asyncio.Future[LedgerDoc | Refused]]]] = {}
        self._names: dict[str, str | None] = {}
        self._known: OrderedDict[str, Versioned | None] = OrderedDict()
        self._lock = threading.Lock()

    async def apply(self, user: str | None, op: Op) -> LedgerDoc | Refused:
        """Apply `op` to `user`'s ledger, with whatever else of that account is waiting.

        Raises:
            StorageUnavailable: the store failed (nothing of this change was written).
        """
        account = account_of(user)
        future: asyncio.Future[LedgerDoc | Refused] = asyncio.get_running_loop().create_future()
        waiting = self._pending.get(account)
        self._pending.setdefault(account, []).append((op, future))
        self._names[account] = user
        if waiting is None:  # nobody is writing this account's ledger: this call does
            asyncio.get_running_loop().create_task(self._drain(account))
        return await future

    async def _drain(self, account: str) -> None:
        while batch := self._pending.get(account):
            self._pending[account] = []
            ops = [op for op, _ in batch]
            assert self.calls is not None, "Accounts.apply needs a worker pool"
            try:
                results = await self.calls.run(self._write, account, self._names.get(account), ops)
            except Exception as exc:
                error = StorageUnavailable(f"object store unavailable: {exc}")
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
            else:
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        self._pending.pop(account, None)
        self._names.pop(account, None)

    def _write(self, account: str, user: str | None, ops: list[Op]) -> list[LedgerDoc | Refused]:
        def change(raw: bytes | None) -> Change[list[LedgerDoc | Refused]]:
            before = read_ledger(raw)
            doc = before.named(user)
            results: list[LedgerDoc | Refused] = []
            for op in ops:
                result = op(doc)
                results.append(result)
                if isinstance(result, LedgerDoc):
                    doc = result
            return Change(None if doc == before else doc.to_json(), results)

        key = ledger_key(account)
        with self._lock:
            known = self._known.get(key)
        results, written = update(self.store, key, change, known=known)
        with self._lock:
            self._known[key] = written
            self._known.move_to_end(key)
            while len(self._known) > KNOWN:
                self._known.popitem(last=False)
        return results

    def apply_now(self, account: str, op: Op) -> LedgerDoc | Refused:
        """`op` on the ledger of `account` (a digest), now, on this thread (the sweeper's,
        or a store thread deleting a message)."""
        return self._write(account, None, [op])[0]

    def read(self, account: str) -> LedgerDoc:
        """The ledger as stored now (blocking)."""
        found = self.store.read_versioned(ledger_key(account))
        return read_ledger(None if found is None else found.data)
