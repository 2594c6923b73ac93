"""A Spark streaming query in a consumer group (client/spark/_confirm.py): it confirms what
each batch it committed delivered, across a restart from its checkpoint. Real local Spark,
gateway, SeaweedFS; linked messages (one object per payload) read like any other."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _spark_session import local_spark

from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.servers]

pytest.importorskip("pyspark")

from client.protocol import ACKS_PREFIX, Manifest, MessageId, index_key, parse_ack_key  # noqa: E402
from client.spark import register  # noqa: E402
from client.spark.job import follow  # noqa: E402
from gateway.storage import S3Store  # noqa: E402


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = local_spark()
    register(session)
    yield session


def confirmed(store: S3Store, group: str) -> set[str]:
    found = set()
    for info in store.list(ACKS_PREFIX):
        parsed = parse_ack_key(info.key)
        if parsed is not None and parsed.group == group:
            found.add(str(parsed.message_id))
    return found


def sink_ids(spark: Any, out: Path) -> list[str]:
    if not (out / "_spark_metadata").exists():
        return []
    table = spark.read.schema("id string, payload binary, topic string, date date")
    return [r["id"] for r in table.parquet(str(out)).select("id").collect()]


def test_a_stream_confirms_what_it_committed_across_a_restart(
    spark: Any,
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    seaweed: SeaweedFS,
    bucket_name: str,
    tmp_path: Path,
) -> None:
    """Topic `sp/#` waits for `spark` and `ops`. The query confirms for `spark` each message
    of a batch once Spark committed that batch (at the next batch's start), never one it
    could not verify (a payload damaged in the store) and never one it did not deliver;
    stopped and restarted from its checkpoint, it goes on. A message both groups confirmed
    goes; the linked one (a copy of another message's payload) is read and confirmed too."""
    groups = tmp_path / "groups.toml"
    groups.write_text('[topics]\n"sp/#" = ["ops", "spark"]\n')
    gw = gateway_factory(broker, retention_groups_file=groups, sweep_interval=0,
                         confirm_sweep_interval=0.3)  # fmt: skip
    store = S3Store(seaweed.endpoint, bucket_name, access_key=seaweed.access_key,
                    secret_key=seaweed.secret_key)  # fmt: skip
    base = f"sp/{uuid.uuid4().hex[:8]}"

    def publish(payload: bytes) -> str:
        answer = httpx.post(f"{gw.url}/publish/{base}/data", content=payload, timeout=60)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])

    shared = os.urandom(50_000)
    first, linked = publish(shared), publish(shared)  # the second: linked to the first's object
    damaged = publish(os.urandom(20_000))
    raw = store.get_bytes(index_key(MessageId.parse(damaged)))
    assert raw is not None
    store.put_bytes(
        Manifest.from_json(raw).data_key, os.urandom(20_000), "application/octet-stream"
    )
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start() -> Any:
        return follow(
            spark, storage=gw.settings.storage_url, out=str(out), checkpoint=str(checkpoint),
            topic=f"{base}/#", credentials={"accessKey": seaweed.access_key,
            "secretKey": seaweed.secret_key}, max_files_per_trigger=1, trigger_seconds=0.5,
            group="spark",
        )  # fmt: skip

    query = start()
    try:
        wait_until(lambda: len(sink_ids(spark, out)) >= 2, "two rows", 120)
    finally:
        query.stop()
    later = publish(os.urandom(30_000))
    query = start()  # from the checkpoint
    try:
        wait_until(lambda: later in sink_ids(spark, out), "the later message", 120)
        last = publish(os.urandom(10_000))  # a batch after it: the one with `later` commits
        wait_until(lambda: later in confirmed(store, "spark"), "later confirmed", 120)
        assert last in sink_ids(spark, out) or last not in confirmed(store, "spark")
    finally:
        query.stop()
    rows = sink_ids(spark, out)
    assert len(rows) == len(set(rows))  # exactly once, across the restart
    assert {first, linked, later} <= set(rows) and damaged not in rows
    spark_confirmed = confirmed(store, "spark")
    assert {first, linked, later} <= spark_confirmed and damaged not in spark_confirmed
    assert spark_confirmed <= set(rows)
    time.sleep(1.0)  # short sweeps: `ops` has not confirmed, nothing goes
    assert store.get_bytes(index_key(MessageId.parse(first))) is not None
    for message_id in (first, linked):
        httpx.post(f"{gw.url}/msg/{message_id}/confirm", params={"group": "ops"}, timeout=30)
    wait_until(
        lambda: store.get_bytes(index_key(MessageId.parse(linked))) is None, "both groups", 10
    )
    assert store.get_bytes(index_key(MessageId.parse(first))) is None
    assert store.get_bytes(index_key(MessageId.parse(damaged))) is not None
