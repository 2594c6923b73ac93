"""A streaming query's confirmations for its consumer group, made when Spark commits a batch.

With the `group` option, each task of a micro-batch writes the list of the messages it read
and verified (`acks-pending/<group>/<batch>/<task>.<ms>.json`, client/protocol/_retention.py)
once it has handed every row to Spark. When Spark has committed the batch to its sink it
tells the source (`commit(end)`): the driver then turns every listed message into the
group's confirmation (`acks/<id>.<token>/<group>`, what the gateway's confirm route writes)
and removes the lists; the gateway deletes a message once every group its topic waits for
has confirmed it. So a message is confirmed only when it was verified and the batch that
delivered it is in the sink: an undeliverable one (a bad object, skipped or failing the
task) never is, and a batch replayed after a restart from the checkpoint writes its lists
again and is confirmed at its commit.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence

from ..core._exceptions import ConfigError
from ..protocol import MessageId, ProtocolError, ack_key, check_group, pending_key, pending_prefix
from ._store import Oversize, ReadStore

#: Largest verified list read back (a batch of 10,000 messages lists about 700 KB).
MAX_LIST_BYTES = 64 * 1024 * 1024


def group_option(value: str | None) -> str | None:
    """The `group` option, checked (ConfigError naming the rule)."""
    if value is None:
        return None
    try:
        return check_group(value)
    except ProtocolError as exc:
        raise ConfigError(f"group: {exc}") from exc


def batch_id(keys: Sequence[str]) -> str:
    """A micro-batch's name: the same keys (a replay) make the same name."""
    return hashlib.sha256("\n".join(sorted(keys)).encode("utf-8")).hexdigest()[:32]


def note_verified(store: ReadStore, group: str, batch: str, task: int, refs: list[str]) -> None:
    """One task's verified messages (`<id>.<token>`), kept until the batch commits."""
    now = time.time_ns() // 1_000_000
    store.put(pending_key(group, batch, task, now), json.dumps(refs).encode("utf-8"))


def confirm_batch(store: ReadStore, group: str, batch: str) -> int:
    """Confirm for `group` every message the batch's tasks verified; how many."""
    confirmed = 0
    body = json.dumps({"at": time.time_ns() // 1_000_000, "by": "spark"}).encode("utf-8")
    for key, _size in list(store.list_all(pending_prefix(group, batch))):
        raw = store.get(key, MAX_LIST_BYTES)
        if raw is None or isinstance(raw, Oversize):
            continue
        try:
            refs = json.loads(raw)
        except ValueError:
            refs = []
        for ref in refs if isinstance(refs, list) else []:
            raw_id, _, token = str(ref).partition(".")
            try:
                target = ack_key(MessageId.parse(raw_id), token, group)
            except ProtocolError:
                continue
            store.put(target, body)
            confirmed += 1
        store.delete(key)
    return confirmed
