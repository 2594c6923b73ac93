"""One bad object never stops a Spark read: it is skipped, reported by key, and the rest flows.

The good messages are published through the gateway's HTTP API. The bad ones are made the way
an attacker would: a direct upload through the gateway's public API whose claimed whole-payload
SHA-256 is false (the gateway records the publisher's word), and entries written straight into
the store in the gateway's layout by someone holding the store's credentials (a header name
that is a lone surrogate, sidecars that are not manifests, a truncated payload).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from _spark_session import local_spark
from minio import Minio

from client.protocol import Manifest, MessageId, Topic, data_key, index_key, meta_key

from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS

pytestmark = [pytest.mark.spark, pytest.mark.servers]

pytest.importorskip("pyspark")

from client.spark import register  # noqa: E402
from client.spark._source import OffloadReader  # noqa: E402
from client.spark.job import follow  # noqa: E402

MiB = 1024 * 1024
WAIT_S = 120


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield local_spark()


def _hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Fixture:
    gateway: GatewayServer
    store: Minio
    bucket: str
    credentials: dict[str, str]

    def publish(self, topic: str, payload: bytes) -> str:
        """A good message, through the gateway's HTTP API; its id."""
        r = httpx.post(f"{self.gateway.url}/publish/{topic}", content=payload, timeout=60)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def key_of(self, message_id: str) -> str:
        raw = self.store.get_object(self.bucket, index_key(MessageId.parse(message_id)))
        try:
            return Manifest.from_json(raw.read()).data_key
        finally:
            raw.close()
            raw.release_conn()

    def lying_direct_upload(self, topic: str) -> str:
        """A multipart direct upload, parts true to their hashes, the whole SHA-256 false.

        Returns its payload key. The gateway answers 201: it records the publisher's claim.
        """
        a, b = os.urandom(5 * MiB), os.urandom(1000)
        body = {"size": len(a + b), "sha256": _hex(b"not these bytes"), "part_size": 5 * MiB}
        url = self.gateway.url
        r = httpx.post(f"{url}/direct/grant/{topic}", json={**body, "parts": [_hex(a), _hex(b)]})
        assert r.status_code == 201, r.text
        etags = [
            httpx.put(u, content=d).headers["ETag"]
            for u, d in zip(r.json()["urls"], (a, b), strict=True)
        ]
        done = httpx.post(f"{url}/direct/commit", json={"grant": r.json()["grant"], "etags": etags})
        assert done.status_code == 201, done.text
        return self.key_of(done.json()["id"])

    def put(self, key: str, data: bytes) -> None:
        self.store.put_object(self.bucket, key, io.BytesIO(data), len(data))

    def hostile(self, topic: str, sidecar: bytes | None, payload: bytes = b"x") -> str:
        """Payload, sidecar and index entry written straight into the store; the payload key.

        `sidecar` None writes a valid manifest whose only header name is a lone surrogate,
        as JSON escapes allow (`"\\ud800x"`), to both the sidecar and the index entry.
        """
        now = int(time.time() * 1000)
        key = data_key(Topic(topic), now, uuid.uuid4().hex)
        message_id = MessageId.new()
        manifest = Manifest(message_id, Topic(topic), now, len(payload), _hex(payload), key)
        if sidecar is None:
            sidecar = manifest.to_json().replace(b'"headers":[]', b'"headers":[["\\ud800x",""]]')
            assert b"ud800" in sidecar
        self.put(key, payload)
        self.put(meta_key(key), sidecar)
        self.put(index_key(message_id), sidecar if sidecar.startswith(b"{") else manifest.to_json())
        return key

    def resized(self, topic: str, stored: int) -> str:
        """A committed message of 1000 bytes whose stored payload has `stored` bytes."""
        key = self.hostile(topic, b"{}")  # replaced below
        payload = os.urandom(max(1000, stored))
        manifest = Manifest(MessageId.new(), Topic(topic), int(time.time() * 1000), 1000,
                            _hex(payload[:1000]), key)  # fmt: skip
        self.put(key, payload[:stored])
        self.put(meta_key(key), manifest.to_json())
        self.put(index_key(manifest.id), manifest.to_json())
        return key


@pytest.fixture
def env(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    seaweed: SeaweedFS,
    bucket_name: str,
) -> Fixture:
    gateway = gateway_factory(broker, s3_public_url=f"http://{seaweed.endpoint}")
    store = Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)
    credentials = {"accessKey": seaweed.access_key, "secretKey": seaweed.secret_key}
    return Fixture(gateway, store, bucket_name, credentials)


def _bad_objects(env: Fixture, topic: str) -> dict[str, str]:
    """One object per way a message can be undeliverable: payload key -> kind reported."""
    return {
        env.lying_direct_upload(topic): "checksum",
        env.hostile(topic, None): "malformed",  # header name: a lone surrogate
        env.hostile(topic, b"not json"): "malformed",
        env.hostile(topic, b"[]"): "malformed",  # JSON, not an object
        env.hostile(topic, b"[" * 100_000): "malformed",  # nested beyond the parser's depth
        env.hostile(topic, b'{"v":1,"id":"x"}'): "malformed",  # fields missing
        env.resized(topic, 600): "checksum",  # truncated
        env.resized(topic, 1500): "checksum",  # longer than its manifest: refused unread
    }


def _wrong_types(env: Fixture, topic: str) -> dict[str, str]:
    """Sidecars that parse as manifests but whose values no row column can hold."""
    keys = {}
    for field, value in (
        ("size", '"big"'),
        ("content_type", "5"),
        ("timestamp", "1e300"),
        ("timestamp", "253402300800000"),  # 10000-01-01: no Python datetime holds it
    ):
        key = env.hostile(topic, b"{}")
        manifest = Manifest(MessageId.new(), Topic(topic), 1, 1, _hex(b"x"), key)
        doc = manifest.to_json().decode()
        old = f'"{field}":' + ("null" if field == "content_type" else "1")
        assert old in doc
        env.put(meta_key(key), doc.replace(old, f'"{field}":{value}', 1).encode())
        keys[key] = "malformed"
    return keys


def read(spark: Any, env: Fixture, topic: str, **options: str) -> Any:
    reader = spark.read.format("offload").option("storage", env.gateway.settings.storage_url)
    for name, value in {**env.credentials, "topic": topic, **options}.items():
        reader = reader.option(name, value)
    return reader.load()


def test_a_batch_read_skips_and_reports_each_bad_object_and_returns_the_rest(
    spark: Any, env: Fixture
) -> None:
    topic = f"bad-{uuid.uuid4().hex[:8]}/x"
    good = {env.publish(topic, f"good {i}".encode() * 100): f"good {i}".encode() * 100
            for i in range(4)}  # fmt: skip
    bad = {**_bad_objects(env, topic), **_wrong_types(env, topic)}
    skipped = register(spark)
    skipped.reset()

    rows = read(spark, env, topic).collect()
    assert {r["id"]: bytes(r["payload"]) for r in rows} == good
    assert skipped.count == len(bad)
    assert {key: kind for key, kind, _ in skipped.examples} == bad
    reasons = [reason for _, _, reason in skipped.examples]
    assert [r for r in reasons if "header name '\\ud800x' is not UTF-8 text" in r]

    # Metadata only, nothing verified: still no row for an undecodable entry; the payload
    # checks are off, so the lying upload and the resized payloads are rows now.
    skipped = register(spark)
    skipped.reset()
    rows = read(spark, env, topic, payload="false", verify="false").collect()
    delivered = {r["id"] for r in rows}
    assert set(good) <= delivered and len(delivered) == len(good) + 3
    assert {k for k, _, _ in skipped.examples} == {k for k, v in bad.items() if v != "checksum"}

    # Asked for by name: the first bad object fails the read, naming it.
    with pytest.raises(Exception, match=r"(checksum mismatch|\(malformed\))"):
        read(spark, env, topic, onBadObject="fail").collect()


def test_objects_deleted_after_planning_are_reported_by_key(
    env: Fixture, caplog: pytest.LogCaptureFixture
) -> None:
    """Expiry or the sweeper between planning and reading: the rest is read, both are named."""
    from client.spark import parse_options

    topic = f"swept-{uuid.uuid4().hex[:8]}/x"
    ids = [env.publish(topic, f"m{i}".encode()) for i in range(4)]
    keys = [env.key_of(i) for i in ids]
    options = parse_options(
        {"storage": env.gateway.settings.storage_url, "topic": topic, **env.credentials}
    )
    reader = OffloadReader(options)
    partitions = reader.partitions()
    env.store.remove_object(env.bucket, meta_key(keys[0]))  # sidecar swept
    env.store.remove_object(env.bucket, keys[1])  # payload swept
    with caplog.at_level(logging.WARNING, logger="client.spark"):
        read_ids = {
            i for p in partitions for b in reader.read(p) for i in b.column("id").to_pylist()
        }
    assert read_ids == set(ids[2:])
    lines = [r.getMessage() for r in caplog.records if r.name == "client.spark"]
    for key, what in ((keys[0], "sidecar"), (keys[1], "payload")):
        assert [line for line in lines if key in line and f"(gone): {what} deleted" in line]


def _sink(spark: Any, out: Path) -> dict[str, bytes]:
    if not (out / "_spark_metadata").exists():
        return {}
    table = spark.read.schema("id string, payload binary, topic string, date date")
    return {r["id"]: bytes(r["payload"]) for r in table.parquet(str(out)).collect()}


def _wait(spark: Any, out: Path, expected: dict[str, bytes], query: Any) -> dict[str, bytes]:
    deadline = time.monotonic() + WAIT_S
    while (rows := _sink(spark, out)) != expected and time.monotonic() < deadline:
        assert query.exception() is None, f"query failed: {query.exception()}"
        time.sleep(0.5)
    return rows


def test_a_stream_skips_and_reports_bad_objects_and_goes_on_across_a_restart(
    spark: Any, env: Fixture, tmp_path: Path
) -> None:
    topic = f"badstream-{uuid.uuid4().hex[:8]}"
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    good: dict[str, bytes] = {}

    def send(tag: str, n: int) -> None:
        for i in range(n):
            payload = f"{tag} {i}".encode() * 50
            good[env.publish(f"{topic}/{tag}", payload)] = payload

    def start() -> Any:
        return follow(
            spark,
            storage=env.gateway.settings.storage_url,
            out=str(out),
            checkpoint=str(checkpoint),
            topic=f"{topic}/#",
            credentials=env.credentials,
            max_files_per_trigger=3,
            trigger_seconds=0.5,
        )

    send("before", 2)
    bad = _bad_objects(env, f"{topic}/bad")
    send("after", 2)
    skipped = register(spark)
    skipped.reset()
    query = start()
    try:
        assert _wait(spark, out, good, query) == good
        assert query.isActive
    finally:
        query.stop()
    assert {key: kind for key, kind, _ in skipped.examples} == bad

    # While stopped: more good messages, and one more lying upload among them.
    send("stopped", 2)
    late_bad = env.lying_direct_upload(f"{topic}/bad")
    skipped.reset()
    query = start()  # the same checkpoint: goes on after the last committed batch
    try:
        assert _wait(spark, out, good, query) == good
        time.sleep(2)  # a few more triggers: nothing arrives twice, nothing is re-reported
        assert _sink(spark, out) == good
        assert query.isActive
    finally:
        query.stop()
    assert [(k, kind) for k, kind, _ in skipped.examples] == [(late_bad, "checksum")]


def test_the_export_job_writes_the_good_rows_and_names_what_it_skipped(
    spark: Any, env: Fixture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from client.spark.job import main as job_main

    topic = f"badjob-{uuid.uuid4().hex[:8]}/x"
    good = {env.publish(topic, f"job {i}".encode()): f"job {i}".encode() for i in range(3)}
    lie = env.lying_direct_upload(topic)
    surrogate = env.hostile(topic, None)
    out = tmp_path / "export"
    args = ["--storage", env.gateway.settings.storage_url, "--topic", topic, "--out", str(out)]
    args += ["--access-key", env.credentials["accessKey"]]
    args += ["--secret-key", env.credentials["secretKey"]]
    assert job_main(args) == 0
    printed = capsys.readouterr()
    rows = spark.read.parquet(str(out)).collect()
    assert {r["id"]: bytes(r["payload"]) for r in rows} == good
    assert "skipped 2 message(s) that could not be delivered (1 checksum, 1 malformed)" in (
        printed.err
    )
    assert f"{lie} (checksum): expected sha256 " in printed.err
    assert f"{surrogate} (malformed): sidecar: header name" in printed.err
    assert f"{topic}  " in printed.out and "TOTAL" in printed.out  # the inventory: 3 rows
    with pytest.raises(Exception, match=r"checksum mismatch|\(malformed\)"):
        job_main([*args, "--on-bad-object", "fail"])
