"""Read-modify-write of one small document with a conditional write, retried on conflict.

The loop every piece of retention state goes through: read the document and its version,
compute the next one, write it only while the version still holds
(`ObjectStore.write_versioned`); another replica that wrote in between makes the write
fail, and the change is computed again from what it wrote. Blocking: call from a store
thread.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..storage import ObjectStore, StoreError, Versioned

T = TypeVar("T")

#: Conflicts one change may meet before it gives up (each a write another replica won).
ATTEMPTS = 32


@dataclass(frozen=True, slots=True)
class Change(Generic[T]):
    """What a change makes of a document: its next bytes (None: leave it as it is) and
    the result handed back to the caller."""

    data: bytes | None
    result: T


def update(
    store: ObjectStore,
    key: str,
    change: Callable[[bytes | None], Change[T]],
    *,
    known: Versioned | None = None,
) -> tuple[T, Versioned | None]:
    """Apply `change` to the document at `key` (None: absent) until a write holds.

    Args:
        store: where the document lives.
        key: its key.
        change: from the current bytes to the next; called again after each conflict,
            so it must not act on the world, only compute.
        known: the document as last seen (a cache): tried first instead of a read.

    Returns:
        The change's result, and the document as written (or as read, when unchanged;
        None when absent) for the next call's `known`.

    Raises:
        StoreError: the store failed, or ATTEMPTS writes in a row lost to others.
    """
    current = known
    fresh = known is None
    for attempt in range(ATTEMPTS):
        if fresh:
            current = store.read_versioned(key)
        outcome = change(None if current is None else current.data)
        if outcome.data is None:
            if fresh:
                return outcome.result, current
            fresh = True  # an unchanged cached copy proves nothing: read it to be sure
            continue
        version = store.write_versioned(
            key, outcome.data, version=None if current is None else current.version
        )
        if version is not None:
            return outcome.result, Versioned(outcome.data, version)
        fresh = True
        time.sleep(random.uniform(0.001, 0.004) * min(attempt + 1, 10))
    raise StoreError(f"{key}: {ATTEMPTS} writes in a row lost to concurrent ones")
