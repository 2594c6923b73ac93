"""What the gateway relies on of a store's conditional writes, probed at start-up.

The id index is created with `If-None-Match: *` (`create_bytes`, the commit point) and the
retention state replaced with `If-Match` (`write_versioned`); a store that ignores either
still answers 200, so `S3Store.ensure_bucket` writes a probe object both ways and logs an
error naming the consequence when the store did not refuse what it should have.
"""

from __future__ import annotations

import contextlib
import logging
import uuid

from ._base import ObjectStore, StoreError

log = logging.getLogger("gateway.storage")

_PROBE_PREFIX = "probes/conditional-create-"


def conditional_create(store: ObjectStore, bucket: str) -> None:
    """Log an error when the store ignores `If-None-Match: *` (ids become last-writer-wins)."""
    key = f"{_PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        first = store.create_bytes(key, b"1")
        second = store.create_bytes(key, b"2")
    except StoreError as exc:
        log.warning("could not probe conditional writes on %r: %s", bucket, exc)
        return
    finally:
        with contextlib.suppress(StoreError):
            store.delete(key)
    if first and second:
        log.error(
            "the object store ignores If-None-Match: * on PUT: two uploads racing for one "
            "message id cannot be told apart (the last one wins); use a store that "
            "supports conditional writes (AWS S3, MinIO, Ceph RGW, SeaweedFS)"
        )


def conditional_replace(store: ObjectStore, bucket: str) -> None:
    """Log an error when the store ignores `If-Match` on PUT: the retention state
    (gateway/retention) then loses writes that race."""
    key = f"{_PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        first = store.write_versioned(key, b"1", version=None)
        stale = store.write_versioned(key, b"2", version="0" * 32)
        current = store.write_versioned(key, b"3", version=first) if first else None
    except StoreError as exc:
        log.warning("could not probe conditional replaces on %r: %s", bucket, exc)
        return
    finally:
        with contextlib.suppress(StoreError):
            store.delete(key)
    if stale is not None or current is None:
        log.error(
            "the object store does not honour If-Match on PUT: replicas updating one "
            "account's ledger or a payload's record at once can lose each other's "
            "changes; use a store that supports conditional writes (AWS S3, MinIO, "
            "Ceph RGW, SeaweedFS)"
        )
