"""What a replica killed mid-way leaves in the retention state, and the sweeper finishing it
(gateway/retention/_sweeping.py), against real SeaweedFS: each state is made as the crash
leaves it, then one sweep runs past the grace period."""

from __future__ import annotations

import hashlib
import os
import time
import uuid

import pytest

from client.protocol import Manifest, MessageId, Topic, data_key, index_key, meta_key
from gateway._sweeper import Sweeper
from gateway.retention import Accounts, Keeper, account_of
from gateway.retention._blobs import Blobs
from gateway.retention._ledger import LedgerDoc
from gateway.retention._records import Record, record_key, ref_of
from gateway.storage import S3Store

pytestmark = pytest.mark.servers

HOUR = 3_600_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def committed(
    store: S3Store, body: bytes, blob: str | None = None, key: str | None = None
) -> Manifest:
    """A message as a commit leaves it: payload (unless `key` names another's), sidecar, index."""
    stamp = now_ms()
    home = data_key(Topic("r/x"), stamp, uuid.uuid4().hex)
    manifest = Manifest(
        MessageId.new(), Topic("r/x"), stamp, len(body), hashlib.sha256(body).hexdigest(),
        key or home, filed_at=home if key else None, blob=blob, expires=stamp + 24 * HOUR,
    )  # fmt: skip
    if key is None:
        store.put_bytes(home, body, "application/octet-stream")
    store.put_bytes(meta_key(home), manifest.to_json())
    assert store.create_bytes(index_key(manifest.id), manifest.to_json())
    return manifest


def sweep(store: S3Store) -> None:
    Sweeper(store, interval=0, keeper=Keeper.counting(store)).sweep_once(now_ms() + 2 * HOUR)


def ledger(store: S3Store) -> LedgerDoc:
    return Accounts(store).read(account_of(None))


def test_a_record_keeps_its_live_messages_and_loses_the_ones_that_never_committed(
    store: S3Store,
) -> None:
    """A link made and the replica killed before the index: the record names a message
    that never was. Past the grace period it goes from the record; the live one stays."""
    body = os.urandom(1000)
    key = record_key(account_of(None), hashlib.sha256(body).hexdigest(), len(body))
    live = committed(store, body, blob=key)
    ghost = f"{MessageId.new()}.{uuid.uuid4().hex}"
    record = Record(
        live.data_key, len(body), live.sha256, {ref_of(live): now_ms(), ghost: now_ms()}
    )
    store.put_bytes(key, record.to_json())
    sweep(store)
    after = Blobs(store).read(key)
    assert after is not None and set(after.refs) == {ref_of(live)}
    assert store.get_bytes(live.data_key) == body


def test_a_record_whose_only_message_never_committed_is_buried_and_its_bytes_given_back(
    store: S3Store,
) -> None:
    body = os.urandom(2000)
    account = account_of(None)
    key = record_key(account, hashlib.sha256(body).hexdigest(), len(body))
    obj = data_key(Topic("r/x"), now_ms(), uuid.uuid4().hex)
    store.put_bytes(obj, body, "application/octet-stream")
    store.put_bytes(key, Record(obj, len(body), "ab" * 32, {"m.t": now_ms()}).to_json())
    Accounts(store).apply_now(account, lambda d: LedgerDoc(stored=5000))
    sweep(store)
    assert store.get_bytes(key) is None and store.get_bytes(obj) is None
    assert ledger(store).stored == 3000 and ledger(store).journal == {}


def test_a_deletion_stopped_half_way_is_finished_once(store: S3Store) -> None:
    """Dying record, bytes already given back under its event, object not yet deleted: the
    sweep deletes object and record and does not give the bytes back again."""
    body = os.urandom(1500)
    account = account_of(None)
    key = record_key(account, hashlib.sha256(body).hexdigest(), len(body))
    obj = data_key(Topic("r/x"), now_ms(), uuid.uuid4().hex)
    store.put_bytes(obj, body, "application/octet-stream")
    dying = Record(obj, len(body), "ab" * 32, {}, state="dying", event="e1", at=now_ms())
    store.put_bytes(key, dying.to_json())
    accounts = Accounts(store)
    accounts.apply_now(
        account, lambda d: LedgerDoc(stored=10_000).uncharge("e1", 1500, key, now_ms())
    )
    sweep(store)
    assert store.get_bytes(key) is None and store.get_bytes(obj) is None
    assert ledger(store).stored == 8500 and ledger(store).journal == {}


def test_a_commit_stopped_before_it_counted_its_bytes_is_counted_once(store: S3Store) -> None:
    """A record made with its hold still in the ledger (killed before the charge): the
    hold becomes stored bytes; a hold nobody ended lapses."""
    body = os.urandom(700)
    account = account_of(None)
    key = record_key(account, hashlib.sha256(body).hexdigest(), len(body))
    live = committed(store, body, blob=key)
    store.put_bytes(key, Record(live.data_key, 700, live.sha256, {ref_of(live): now_ms()},
                                charge="u-1", at=now_ms()).to_json())  # fmt: skip
    accounts = Accounts(store)
    accounts.apply_now(account, lambda d: LedgerDoc(holds={"u-1": (700, now_ms()), "u-2": (9, 1)}))
    sweep(store)
    assert (ledger(store).stored, ledger(store).holds) == (700, {})
    assert Blobs(store).read(key).charge is None  # type: ignore[union-attr]
    sweep(store)
    assert ledger(store).stored == 700


def test_no_record_loses_a_message_when_the_index_could_not_be_read_whole(store: S3Store) -> None:
    body = os.urandom(500)
    key = record_key(account_of(None), hashlib.sha256(body).hexdigest(), len(body))
    live = committed(store, body, blob=key)
    ghost = f"{MessageId.new()}.{uuid.uuid4().hex}"
    store.put_bytes(key, Record(live.data_key, 500, live.sha256, {ghost: 1}).to_json())
    store.put_bytes(f"ids/{MessageId.new()}.json", b"not a manifest")  # one unreadable entry
    sweep(store)
    assert set(Blobs(store).read(key).refs) == {ghost}  # type: ignore[union-attr]
    assert store.get_bytes(live.data_key) == body
