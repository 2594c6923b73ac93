"""The `offload` Spark data source and export job on a real local Spark against SeaweedFS.

Objects are written exactly as the gateway lays them out (payload, then sidecar, then the id
index) by `LayoutWriter`, because the tests need messages stamped at chosen times; the
gateway stamps with its own clock. Verification is also shown on what the running gateway
itself wrote.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import google_crc32c
import httpx
import pytest
from _spark_session import local_spark
from hop import bson as hop_bson
from minio import Minio

from client.protocol import Manifest, MessageId, Topic, data_key, index_key, meta_key

from _gateway import GatewayServer
from _servers import SeaweedFS

pytestmark = [pytest.mark.spark, pytest.mark.servers]

pyspark = pytest.importorskip("pyspark")

from pyspark.sql import SparkSession  # noqa: E402

from client.spark import register  # noqa: E402
from client.spark.job import main as job_main  # noqa: E402


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


@dataclass
class LayoutWriter:
    """Writes messages the way the gateway does, to S3 (MinIO SDK) or a directory."""

    client: Minio | None = None
    bucket: str = ""
    root: Path | None = None
    written: list[Manifest] = field(default_factory=list)

    def put(self, key: str, data: bytes) -> None:
        if self.client is not None:
            self.client.put_object(self.bucket, key, io.BytesIO(data), len(data))
        else:
            assert self.root is not None
            path = self.root / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

    def message(
        self,
        topic: str,
        payload: bytes,
        when: int,
        *,
        headers: tuple[tuple[str, bytes], ...] = (),
        key: bytes | None = None,
        content_type: str | None = None,
        sidecar: bool = True,
        sha256: str | None = None,
        crc32c: str | None = None,
        legacy: bool = False,
    ) -> Manifest:
        """Store one message; sidecar=False leaves it "in flight" (payload only).

        The manifest records the payload's SHA-256 and CRC-32C unless told otherwise;
        legacy=True leaves the CRC-32C out, as manifests written before it existed.
        """
        t = Topic(topic)
        manifest = Manifest(
            id=MessageId.new(),
            topic=t,
            timestamp=when,
            size=len(payload),
            sha256=sha256 or hashlib.sha256(payload).hexdigest(),
            crc32c=None if legacy else crc32c or f"{google_crc32c.value(payload):08x}",
            data_key=data_key(t, when, uuid.uuid4().hex),
            headers=headers,
            key=key,
            content_type=content_type,
        )
        self.put(manifest.data_key, payload)
        if sidecar:
            self.put(meta_key(manifest.data_key), manifest.to_json())
            self.put(index_key(manifest.id), manifest.to_json())
            self.written.append(manifest)
        return manifest


def s3_writer(seaweed: SeaweedFS) -> tuple[LayoutWriter, str]:
    client = Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)
    bucket = f"spark-{uuid.uuid4().hex[:16]}"
    client.make_bucket(bucket)
    return LayoutWriter(client=client, bucket=bucket), seaweed.storage_url(bucket)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = local_spark()
    register(session)
    yield session


PAYLOADS = {
    "a/x": bytes(range(256)) * 300 + b"\x00end",  # > 64 KiB, every byte value
    "a/y": b"",  # empty payloads are messages too
    "b/z": "ünïcødé ✓".encode() * 10,
}
STAMPS = {
    "a/x": ms("2026-11-21T23:30:00"),
    "a/y": ms("2026-11-22T10:15:00"),
    "b/z": ms("2026-11-23T05:00:00"),
}


@dataclass
class Store:
    writer: LayoutWriter
    url: str
    manifests: dict[str, Manifest]


@pytest.fixture(scope="module")
def store(seaweed: SeaweedFS) -> Store:
    writer, url = s3_writer(seaweed)
    manifests = {
        topic: writer.message(
            topic,
            payload,
            STAMPS[topic],
            headers=(("_id", b"raw"), ("trace", topic.encode())),
            key=topic.encode() + b"-key",
            content_type="application/octet-stream" if topic == "a/x" else None,
            legacy=topic == "b/z",  # written before manifests had a CRC-32C: SHA-256 checks it
        )
        for topic, payload in PAYLOADS.items()
    }
    # An upload in flight: the payload exists, the sidecar does not yet.
    writer.message("a/x", b"not yet committed", STAMPS["a/x"], sidecar=False)
    return Store(writer, url, manifests)


def read(spark: SparkSession, url: str, **options: str) -> Any:
    reader = spark.read.format("offload").option("storage", url)
    reader = reader.option("accessKey", "offload-test").option(
        "secretKey", "offload-test-secret-key"
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_returns_exactly_the_stored_messages(spark: SparkSession, store: Store) -> None:
    rows = {r["id"]: r for r in read(spark, store.url).collect()}

    assert set(rows) == {str(m.id) for m in store.manifests.values()}
    for topic, manifest in store.manifests.items():
        row = rows[str(manifest.id)]
        assert row["topic"] == topic
        assert bytes(row["payload"]) == PAYLOADS[topic]
        assert row["size"] == len(PAYLOADS[topic])
        assert row["sha256"] == hashlib.sha256(PAYLOADS[topic]).hexdigest()
        assert row["timestamp"] == datetime.fromtimestamp(STAMPS[topic] / 1000, UTC).replace(
            tzinfo=None
        )
        assert bytes(row["key"]) == topic.encode() + b"-key"
        assert {k: bytes(v) for k, v in row["headers"].items()} == {
            "_id": b"raw",
            "trace": topic.encode(),
        }
        assert row["content_type"] == manifest.content_type


def test_schema(spark: SparkSession, store: Store) -> None:
    fields = {f.name: f.dataType.simpleString() for f in read(spark, store.url).schema.fields}
    assert fields == {
        "id": "string",
        "topic": "string",
        "timestamp": "timestamp",
        "size": "bigint",
        "sha256": "string",
        "content_type": "string",
        "key": "binary",
        "headers": "map<string,binary>",
        "trace_id": "string",
        "payload": "binary",
    }


def test_the_trace_id_of_what_the_running_gateway_stored(
    spark: SparkSession, gateway_factory: Callable[..., GatewayServer], tmp_path: Path
) -> None:
    """The gateway records the upload's W3C trace in the manifest (without OpenTelemetry:
    the caller's context, carried on); the source reads it into `trace_id`."""
    gw = gateway_factory(None, storage_url=f"file://{tmp_path}")
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    traced, untraced, hostile = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for msg_id, headers in (
        (traced, {"traceparent": caller}),
        (untraced, {}),
        (hostile, {"traceparent": "00-" + "f" * 10_000}),
    ):
        r = httpx.put(
            f"{gw.url}/msg/{msg_id}", params={"topic": "tr/x"}, content=b"p", headers=headers
        )
        assert r.status_code == 201, r.text
    rows = {r["id"]: r["trace_id"] for r in read(spark, tmp_path.as_uri()).collect()}
    assert rows == {
        str(traced): "0af7651916cd43dd8448eb211c80319c",
        str(untraced): None,
        str(hostile): None,
    }


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [
        ("a/#", {"a/x", "a/y"}),
        ("a/+", {"a/x", "a/y"}),
        ("+/z", {"b/z"}),
        ("a/x", {"a/x"}),
        ("a", set()),
        ("#", {"a/x", "a/y", "b/z"}),
        ("c/#", set()),
    ],
)
def test_topic_filter(
    spark: SparkSession, store: Store, topic_filter: str, expected: set[str]
) -> None:
    rows = read(spark, store.url, topic=topic_filter).select("id", "topic").collect()
    assert {r["topic"] for r in rows} == expected
    assert {r["id"] for r in rows} == {str(store.manifests[t].id) for t in expected}


@pytest.mark.parametrize(
    ("since", "until", "expected"),
    [
        ("2026-11-22", "2026-11-23", {"a/y"}),  # whole day
        ("2026-11-21T23:30:00Z", "2026-11-22T10:15:00Z", {"a/x"}),  # until is exclusive
        ("2026-11-21T23:30:00.001Z", None, {"a/y", "b/z"}),  # exact, finer than the hour
        (None, str(ms("2026-11-22T10:15:00") + 1), {"a/x", "a/y"}),  # epoch milliseconds
        ("2026-11-22T11:15:00+01:00", "2026-11-22T11:16:00+01:00", {"a/y"}),  # zoned
        ("2027-01-01", None, set()),
    ],
)
def test_time_range(
    spark: SparkSession, store: Store, since: str | None, until: str | None, expected: set[str]
) -> None:
    options = {k: v for k, v in (("since", since), ("until", until)) if v is not None}
    rows = read(spark, store.url, **options).select("topic").collect()
    assert sorted(r["topic"] for r in rows) == sorted(expected)


def test_metadata_only_scan_has_null_payloads(spark: SparkSession, store: Store) -> None:
    rows = read(spark, store.url, payload="false").collect()
    assert len(rows) == 3
    assert all(r["payload"] is None for r in rows)
    assert {r["size"] for r in rows} == {len(p) for p in PAYLOADS.values()}


def test_credentials_from_environment_at_register(
    spark: SparkSession, store: Store, s3_env: SeaweedFS, monkeypatch: pytest.MonkeyPatch
) -> None:
    register(spark)  # s3_env has set OFFLOAD_S3_* in this process
    try:
        df = spark.read.format("offload").option("storage", store.url).load()
        assert df.count() == 3
    finally:
        monkeypatch.delenv("OFFLOAD_S3_ACCESS_KEY")
        monkeypatch.delenv("OFFLOAD_S3_SECRET_KEY")
        register(spark)
    with pytest.raises(Exception, match=r"(?i)access denied|forbidden|signature|credentials"):
        spark.read.format("offload").option("storage", store.url).load().count()


def test_checksum_mismatch_skips_the_message_or_fails_the_read_unless_verify_is_off(
    spark: SparkSession, seaweed: SeaweedFS
) -> None:
    writer, url = s3_writer(seaweed)
    writer.message("c/d", b"tampered bytes", ms("2026-11-22T00:00:00"), crc32c="0" * 8)
    skipped = register(spark)
    skipped.reset()
    assert read(spark, url).collect() == []  # skipped, and reported:
    assert [(kind, reason) for _, kind, reason in skipped.examples] == [
        ("checksum", "expected crc32c 00000000 (14 bytes), got crc32c fe0ae681 (14 bytes)")
    ]
    with pytest.raises(Exception, match="checksum mismatch: expected crc32c 00000000"):
        read(spark, url, onBadObject="fail").collect()
    rows = read(spark, url, verify="false").collect()
    assert [bytes(r["payload"]) for r in rows] == [b"tampered bytes"]


def test_verify_sha256_checks_the_sha256_the_default_does_not(
    spark: SparkSession, seaweed: SeaweedFS
) -> None:
    """By default a manifest's CRC-32C stands for the payload; `sha256` asks for the hash."""
    writer, url = s3_writer(seaweed)
    writer.message("c/e", b"payload", ms("2026-11-22T00:00:00"), sha256="0" * 64)
    assert [bytes(r["payload"]) for r in read(spark, url).collect()] == [b"payload"]
    assert read(spark, url, verify="sha256").collect() == []
    with pytest.raises(Exception, match=r"checksum mismatch: expected sha256 0{64}"):
        read(spark, url, verify="sha256", onBadObject="fail").collect()


@pytest.mark.parametrize("size", [13, 2 * 1024 * 1024 + 5])  # read whole; mapped, sliced
def test_corruption_of_what_the_gateway_wrote_is_caught(
    spark: SparkSession,
    gateway_factory: Callable[..., GatewayServer],
    tmp_path: Path,
    size: int,
) -> None:
    """A payload file damaged on disk after the gateway stored it (same length)."""
    gw = gateway_factory(None, storage_url=f"file://{tmp_path}")
    payload = os.urandom(size)
    msg_id = uuid.uuid4()
    body = hop_bson.dumps({"message": payload, "headers": [("_id", msg_id.bytes)]})
    r = httpx.post(f"{gw.url}/topic/crc/{size}+oversized", content=body, timeout=30)
    assert r.status_code == 201, r.text
    manifest = Manifest.from_json((tmp_path / index_key(MessageId(msg_id))).read_bytes())
    assert manifest.crc32c is not None
    url = tmp_path.as_uri()
    assert [bytes(r["payload"]) for r in read(spark, url).collect()] == [payload]

    damaged = bytearray(payload)
    damaged[size // 2] ^= 0x01  # one bit
    (tmp_path / manifest.data_key).write_bytes(damaged)
    assert read(spark, url).collect() == []  # skipped (and reported)
    with pytest.raises(Exception, match=f"checksum mismatch: expected crc32c {manifest.crc32c}"):
        read(spark, url, onBadObject="fail").collect()
    with pytest.raises(Exception, match=f"checksum mismatch: expected sha256 {manifest.sha256}"):
        read(spark, url, verify="sha256", onBadObject="fail").collect()
    assert [bytes(r["payload"]) for r in read(spark, url, verify="false").collect()] == [damaged]

    # The same manifest as written before manifests had a CRC-32C: SHA-256 catches it.
    legacy = dataclasses.replace(manifest, crc32c=None).to_json()
    (tmp_path / meta_key(manifest.data_key)).write_bytes(legacy)
    with pytest.raises(Exception, match=f"checksum mismatch: expected sha256 {manifest.sha256}"):
        read(spark, url, onBadObject="fail").collect()


def test_many_objects_are_spread_over_tasks_by_bytes(
    spark: SparkSession, seaweed: SeaweedFS
) -> None:
    writer, url = s3_writer(seaweed)
    sizes = [200_000] * 2 + [1000] * 10
    for i, size in enumerate(sizes):
        writer.message(f"m/{i % 3}", os.urandom(size), ms("2026-11-22T00:00:00") + i)
    df = read(spark, url, parallelism="2")
    assert df.rdd.getNumPartitions() == 6  # 3 tasks per slot
    per_task = df.select("size").rdd.glom().map(lambda rows: sum(r[0] for r in rows)).collect()
    # Each object weighs its size + 1 MiB (its request cost): the large ones start a task each,
    # the small ones fill the other four two by two, the last two join the large ones.
    assert sorted(per_task) == [2000] * 4 + [201_000] * 2


@pytest.fixture(scope="module")
def file_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    root = tmp_path_factory.mktemp("filestore")
    writer = LayoutWriter(root=root)
    manifests = {t: writer.message(t, p, STAMPS[t]) for t, p in PAYLOADS.items()}
    writer.message("a/x", b"in flight", STAMPS["a/x"], sidecar=False)
    # The gateway's FileStore writes a dot-file and renames it into place.
    (root / "data/a/x/date=2026-11-21/hour=23/.abc.123.part").write_bytes(b"partial")
    return Store(writer, root.as_uri(), manifests)


def test_file_store(spark: SparkSession, file_store: Store) -> None:
    rows = read(spark, file_store.url).collect()
    assert {r["id"]: bytes(r["payload"]) for r in rows} == {
        str(m.id): PAYLOADS[t] for t, m in file_store.manifests.items()
    }
    assert {r["topic"] for r in read(spark, file_store.url, topic="a/#").collect()} == {
        "a/x",
        "a/y",
    }
    ranged = read(spark, file_store.url, since="2026-11-22", until="2026-11-23").collect()
    assert [r["topic"] for r in ranged] == ["a/y"]


def test_binary_file_source_over_the_file_store(spark: SparkSession, file_store: Store) -> None:
    """The raw-object recipe from client.spark's docstring, on the embedded store."""
    assert file_store.writer.root is not None
    topic_dir = (file_store.writer.root / "data/a/x").as_uri() + "/"
    payloads = (
        spark.read.format("binaryFile")
        .load(topic_dir)
        .where("date = '2026-11-21'")
        .where("NOT path LIKE '%.meta.json'")
        .collect()
    )
    # Spark's reader sees the in-flight payload too: it has no notion of sidecars.
    assert sorted(bytes(r["content"]) for r in payloads) == sorted([PAYLOADS["a/x"], b"in flight"])
    assert {(str(r["date"]), r["hour"]) for r in payloads} == {("2026-11-21", 23)}
    manifests = spark.read.json(topic_dir + "date=*/hour=*/*.meta.json").collect()
    assert [m["id"] for m in manifests] == [str(file_store.manifests["a/x"].id)]
    joined = [p for p in payloads if p["path"].endswith(manifests[0]["data_key"])]
    assert [bytes(p["content"]) for p in joined] == [PAYLOADS["a/x"]]


def _parquet_files(out: Path) -> list[str]:
    return sorted(
        str(p.relative_to(out).parent) for p in out.rglob("*.parquet") if p.stat().st_size
    )


def test_export_job_is_partitioned_idempotent_and_prints_an_inventory(
    spark: SparkSession, store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "export"
    args = [
        "--storage",
        store.url,
        "--out",
        str(out),
        "--access-key",
        "offload-test",
        "--secret-key",
        "offload-test-secret-key",
    ]
    assert (
        job_main([*args, "--topic", "a/#", "--since", "2026-11-21", "--until", "2026-11-23"]) == 0
    )
    first = capsys.readouterr().out
    assert _parquet_files(out) == [
        "topic=a%2Fx/date=2026-11-21",
        "topic=a%2Fy/date=2026-11-22",
    ]
    exported = spark.read.parquet(str(out))
    rows = {r["id"]: r for r in exported.collect()}
    assert {rows[str(store.manifests[t].id)]["topic"] for t in ("a/x", "a/y")} == {"a/x", "a/y"}
    assert bytes(rows[str(store.manifests["a/x"].id)]["payload"]) == PAYLOADS["a/x"]
    assert len(rows) == 2
    assert "a/x" in first and "2026-11-21" in first and str(len(PAYLOADS["a/x"])) in first

    # Same range again: the same partitions are replaced, not appended to.
    assert (
        job_main([*args, "--topic", "a/#", "--since", "2026-11-21", "--until", "2026-11-23"]) == 0
    )
    second = capsys.readouterr().out
    assert spark.read.parquet(str(out)).count() == 2
    assert second.splitlines()[-4:] == first.splitlines()[-4:]

    # Another topic, metadata only: added next to the existing partitions, which stay.
    assert job_main([*args, "--topic", "b/#", "--no-payload"]) == 0
    capsys.readouterr()
    assert spark.read.parquet(str(out)).count() == 3
    b_rows = spark.read.parquet(str(out)).where("topic = 'b/z'").collect()
    assert [r["payload"] for r in b_rows] == [None]
    assert [str(r["date"]) for r in b_rows] == ["2026-11-23"]
