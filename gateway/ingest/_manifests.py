"""The manifest repository: where a message's index and sidecar live, and how it goes.

Shared by the request path (`OffloadService.forget`, run in a store worker) and the
`Sweeper` (its own sweep thread), so "delete the index first" is written once.
"""

from __future__ import annotations

from client.protocol import Manifest, ProtocolError, index_key, meta_key

from ..retention import Keeper
from ..storage import ObjectStore


class ManifestRepository:
    """Blocking reads and deletes of manifests in an object store (call from a worker).

    Args:
        store: where the messages live.
        keeper: what a deletion does to the retention state (confirmations, the payload's
            record and the account's bytes); default: a message's payload is deleted with
            it unless it names a record, which is left (`Keeper.plain`).
    """

    def __init__(self, store: ObjectStore, keeper: Keeper | None = None) -> None:
        self.store = store
        self.keeper = keeper or Keeper.plain(store)

    def read(self, key: str) -> Manifest | None:
        """The manifest stored at `key` (an index or a sidecar); None when absent.

        Raises:
            ProtocolError: the object is not a manifest.
        """
        raw = self.store.get_bytes(key)
        return None if raw is None else Manifest.from_json(raw)

    def read_lenient(self, key: str) -> Manifest | None:
        """As `read`, but None for an unreadable object too."""
        try:
            return self.read(key)
        except ProtocolError:
            return None

    def forget(self, manifest: Manifest) -> None:
        """Delete a message: index first, so it is never visible half-deleted, then its
        sidecar, then what it holds of the retention state (`Keeper.release`: its
        confirmations, and its payload, or its place in the payload's record).

        Idempotent (a missing object is no error), so replicas and sweepers may race.
        The index is only removed while it still names this message (or is unreadable:
        removing it is the safe side): a later upload that reused the id keeps its own.
        """
        current = self.read_lenient(index_key(manifest.id))
        if current is None or current.home == manifest.home:
            self.store.delete(index_key(manifest.id))
        self.store.delete(meta_key(manifest.home))
        self.keeper.release(manifest)
