"""`spark.readStream.format("offload")` on a real local Spark, fed by the real gateway.

Messages are published over HTTP (`POST /publish/<topic>`) to a gateway on SeaweedFS while
the export job's `follow` query runs; the Parquet sink must end up holding each of them
exactly once, across a stop and a restart from the checkpoint.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _spark_session import local_spark
from minio import Minio

from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS

pytestmark = [pytest.mark.spark, pytest.mark.servers]

pytest.importorskip("pyspark")

from client.core._exceptions import ConfigError  # noqa: E402
from client.protocol import Manifest, MessageId, Topic, data_key, index_key, meta_key  # noqa: E402
from client.spark import register  # noqa: E402
from client.spark.job import follow  # noqa: E402
from client.spark.job import main as job_main  # noqa: E402

WAIT_S = 120
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = local_spark()
    register(session)
    yield session


def publish(gateway: GatewayServer, topic: str, payload: bytes) -> str:
    """Publish through the gateway's HTTP API; the message id it answers."""
    response = httpx.post(f"{gateway.url}/publish/{topic}", content=payload, timeout=60)
    assert response.status_code == 201, response.text
    answer = response.json()
    assert answer["sha256"] == hashlib.sha256(payload).hexdigest()
    return str(answer["id"])


def sink_rows(spark: Any, out: Path) -> list[tuple[str, str, bytes]]:
    """(id, topic, payload) of every row the sink has committed (its _spark_metadata log)."""
    if not (out / "_spark_metadata").exists():
        return []
    # A declared schema: before the first batch the sink holds no file to infer one from.
    table = spark.read.schema("id string, payload binary, topic string, date date")
    rows = table.parquet(str(out)).select("id", "topic", "payload").collect()
    return [(r["id"], r["topic"], bytes(r["payload"])) for r in rows]


def wait_for_rows(spark: Any, out: Path, count: int, query: Any) -> list[tuple[str, str, bytes]]:
    deadline = time.monotonic() + WAIT_S
    while True:
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        rows = sink_rows(spark, out)
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def test_stream_delivers_live_messages_exactly_once_across_a_restart(
    spark: Any,
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    seaweed: SeaweedFS,
    tmp_path: Path,
) -> None:
    gateway = gateway_factory(broker)
    base = f"stream-{uuid.uuid4().hex[:8]}"
    credentials = {"accessKey": seaweed.access_key, "secretKey": seaweed.secret_key}
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    sent: dict[str, tuple[str, bytes]] = {}

    def send(topic: str, payload: bytes) -> None:
        sent[publish(gateway, topic, payload)] = (topic, payload)

    def start() -> Any:
        return follow(
            spark,
            storage=gateway.settings.storage_url,
            out=str(out),
            checkpoint=str(checkpoint),
            topic=f"{base}/+/data",
            credentials=credentials,
            max_files_per_trigger=2,
            trigger_seconds=0.5,
        )

    # Committed before the query starts: delivered by its first batches.
    send(f"{base}/a/data", os.urandom(300_000))
    send(f"{base}/b/data", b"")
    # Outside the filter: never delivered.
    publish(gateway, f"{base}/a/other", b"not selected")
    publish(gateway, f"other-{base}/a/data", b"not selected")

    query = start()
    try:
        first = wait_for_rows(spark, out, 2, query)
        assert len(first) == 2
        for i in range(3):  # published while the query runs
            send(f"{base}/{'ab'[i % 2]}/data", f"live {i}".encode() * 1000)
        wait_for_rows(spark, out, 5, query)
        progress = [p["numInputRows"] for p in query.recentProgress]
    finally:
        query.stop()
    assert progress and max(progress) <= 2  # maxFilesPerTrigger bounds every batch

    for i in range(3):  # published while no query runs
        send(f"{base}/a/data", f"while stopped {i}".encode())

    query = start()  # same checkpoint: continues after the last committed batch
    try:
        rows = wait_for_rows(spark, out, len(sent), query)
        time.sleep(2)  # a few more triggers: nothing may arrive twice
        rows = sink_rows(spark, out)
    finally:
        query.stop()

    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)), "a message was delivered twice"
    assert {i: (t, p) for i, t, p in rows} == sent


def test_follow_cli_killed_and_restarted_delivers_each_message_once(
    spark: Any,
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    seaweed: SeaweedFS,
    tmp_path: Path,
) -> None:
    """`python -m client.spark --follow`, killed with SIGKILL mid-stream, then restarted."""
    gateway = gateway_factory(broker)
    base = f"follow-{uuid.uuid4().hex[:8]}"
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    env = dict(
        os.environ,
        OFFLOAD_S3_ACCESS_KEY=seaweed.access_key,
        OFFLOAD_S3_SECRET_KEY=seaweed.secret_key,
        SPARK_LOCAL_IP="127.0.0.1",  # loopback only
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    command = [
        sys.executable, "-m", "client.spark", "--storage", gateway.settings.storage_url,
        "--topic", f"{base}/#", "--out", str(out), "--follow", "--checkpoint", str(checkpoint),
        "--trigger-seconds", "0.5", "--max-files-per-trigger", "3", "--master", "local[1]",
    ]  # fmt: skip
    sent: dict[str, tuple[str, bytes]] = {}

    def send(n: int, tag: str) -> None:
        for i in range(n):
            topic, payload = f"{base}/{tag}", f"{tag} {i}".encode() * 100
            sent[publish(gateway, topic, payload)] = (topic, payload)

    log = tmp_path / "job.log"

    def start() -> subprocess.Popen[bytes]:
        # To a file, not a pipe: nobody reads a pipe while the job runs, and a full one
        # would stall the job's logging.
        with log.open("ab") as sink:
            return subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)

    def wait(job: subprocess.Popen[bytes], count: int) -> list[tuple[str, str, bytes]]:
        deadline = time.monotonic() + WAIT_S
        while len(rows := sink_rows(spark, out)) < count and time.monotonic() < deadline:
            assert job.poll() is None, log.read_text(errors="replace")[-2000:]
            time.sleep(0.5)
        return rows

    send(4, "before")
    job = start()
    try:
        assert len(wait(job, 4)) == 4
        send(2, "live")  # published while the job runs
        assert len(wait(job, 6)) == 6
    finally:
        job.kill()  # a crash, not a clean stop: recovery is the checkpoint's job
        job.wait()
    send(4, "while-down")
    job = start()
    try:
        wait(job, len(sent))
        time.sleep(2)  # a few more triggers: nothing may arrive twice
        rows = sink_rows(spark, out)
    finally:
        job.kill()
        job.wait()
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)), "a message was delivered twice"
    assert {i: (t, p) for i, t, p in rows} == sent


def test_stream_replays_an_unfinished_batch_from_its_offsets(
    spark: Any,
    seaweed: SeaweedFS,
    bucket_name: str,
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
) -> None:
    """The offset alone names a batch's messages: re-planning it reads exactly the same rows."""
    from client.spark._stream import OffloadStreamReader, parse_stream_options

    gateway = gateway_factory(broker)
    topic = f"replay-{uuid.uuid4().hex[:8]}/x"
    ids = {publish(gateway, topic, f"m{i}".encode()) for i in range(3)}
    # Not committed: a sidecar without its id index (a commit in progress), and one whose
    # id's index names another payload (a loser of a race for the id). Neither is delivered.
    client = Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)
    now = int(time.time() * 1000)
    for message_id in (MessageId.new(), MessageId.parse(next(iter(ids)))):
        key = data_key(Topic(topic), now, uuid.uuid4().hex)
        manifest = Manifest(message_id, Topic(topic), now, 1, hashlib.sha256(b"u").hexdigest(), key)
        for name, body in ((key, b"u"), (meta_key(key), manifest.to_json())):
            client.put_object(bucket_name, name, io.BytesIO(body), len(body))
    options = {
        "storage": gateway.settings.storage_url,
        "accessKey": seaweed.access_key,
        "secretKey": seaweed.secret_key,
        "topic": topic,
        "parallelism": "2",
    }
    first = OffloadStreamReader(parse_stream_options(options))
    start = first.initialOffset()
    end = first.latestOffset(start, first.getDefaultReadLimit())
    assert len(end["batch"]) == 3
    # A new reader (a restarted driver) plans the same batch from the stored offsets.
    again = OffloadStreamReader(parse_stream_options(options))
    keys = [k for p in again.partitions(start, end) for k in p.keys]
    assert sorted(keys) == sorted(end["batch"])
    assert again.latestOffset(end, again.getDefaultReadLimit()) == end  # nothing new
    read_ids = set()
    for partition in again.partitions(start, end):
        for batch in again.read(partition):
            read_ids.update(batch.column("id").to_pylist())
    assert read_ids == ids


def test_refused_credentials_name_the_options_and_variables(
    spark: Any, gateway_factory: Callable[..., GatewayServer], broker: Mosquitto
) -> None:
    gateway = gateway_factory(broker)
    publish(gateway, f"creds-{uuid.uuid4().hex[:8]}", b"x")
    reader = spark.read.format("offload").option("storage", gateway.settings.storage_url)
    reader = reader.option("accessKey", "offload-test").option("secretKey", "wrong-secret")
    with pytest.raises(Exception) as caught:
        reader.load().count()
    message = str(caught.value)
    assert "refused the credentials" in message
    for name in ("accessKey", "secretKey", "OFFLOAD_S3_ACCESS_KEY", "OFFLOAD_S3_SECRET_KEY"):
        assert name in message


def test_register_names_pyspark_python_when_workers_cannot_import_pyarrow(
    spark: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A real interpreter without pyarrow, as a bare `python3` on PATH often is.
    bare = tmp_path / "venv"
    import venv

    venv.EnvBuilder().create(bare)
    monkeypatch.setenv("PYSPARK_PYTHON", str(bare / "bin" / "python"))
    with pytest.raises(ConfigError, match="PYSPARK_PYTHON") as caught:
        register(spark)
    assert "pyarrow" in str(caught.value)
    monkeypatch.setenv("PYSPARK_PYTHON", str(tmp_path / "no-such-python"))
    with pytest.raises(ConfigError, match="cannot run it"):
        register(spark)


def test_follow_needs_a_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    assert job_main(["--storage", "file:///tmp/x", "--out", "/tmp/y", "--follow"]) == 2
    assert "--checkpoint" in capsys.readouterr().err


def test_a_direct_upload_keyed_at_its_grant_and_stamped_at_its_commit_is_delivered(
    seaweed: SeaweedFS,
) -> None:
    """The gateway keys a direct upload (its hour partition) at the grant, stamps it at commit.

    Committed 40 minutes after its grant, in the next hour, with newer messages delivered
    and a lateness of 60 s: the driver lists `grantTtl` below its floor and finds it.
    """
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from client.spark._stream import OffloadStreamReader, parse_stream_options

    client, bucket = _bucket(seaweed)

    def put(keyed: str, stamped: str, payload: bytes) -> str:
        return _put(client, bucket, keyed, stamped, payload)

    options = {
        "storage": seaweed.storage_url(bucket),
        "accessKey": seaweed.access_key,
        "secretKey": seaweed.secret_key,
        "topic": "g/#",
        "since": "2026-11-22T10:00:00Z",
        "lateness": "60",
    }
    reader = OffloadStreamReader(parse_stream_options(options))
    first_key = put("2026-11-22T11:30:00", "2026-11-22T11:30:00", b"proxied")
    first = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert first["batch"] == [first_key] and first["floor"] == _ms("2026-11-22T11:29:00")
    direct = put("2026-11-22T10:50:00", "2026-11-22T11:30:30", b"direct")
    second = reader.latestOffset(first, ReadAllAvailable())
    assert second["batch"] == [direct]
    assert reader.latestOffset(second, ReadAllAvailable()) == second  # once
    # Listing from the floor's hour only (grantTtl 0) misses it for good.
    blind = OffloadStreamReader(parse_stream_options({**options, "grantTtl": "0"}))
    assert blind.latestOffset(first, ReadAllAvailable()) == first


def _ms(text: str) -> int:
    from datetime import UTC, datetime

    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def _bucket(seaweed: SeaweedFS) -> tuple[Minio, str]:
    client = Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)
    bucket = f"stamps-{uuid.uuid4().hex[:16]}"
    client.make_bucket(bucket)
    return client, bucket


def _put(client: Minio, bucket: str, keyed: str, stamped: str, payload: bytes) -> str:
    """A committed message of topic g/x keyed at `keyed`, stamped `stamped`; its key."""
    topic = Topic("g/x")
    key = data_key(topic, _ms(keyed), uuid.uuid4().hex)
    digest = hashlib.sha256(payload).hexdigest()
    manifest = Manifest(MessageId.new(), topic, _ms(stamped), len(payload), digest, key)
    body = manifest.to_json()
    for name, data in ((key, payload), (meta_key(key), body), (index_key(manifest.id), body)):
        client.put_object(bucket, name, io.BytesIO(data), len(data))
    return key


def test_a_message_stamped_in_the_future_waits_and_does_not_lift_the_floor(
    seaweed: SeaweedFS,
) -> None:
    """Written straight into the store (or by a gateway whose clock is off) for the year 2100."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from client.spark._stream import OffloadStreamReader, parse_stream_options

    client, bucket = _bucket(seaweed)
    options = {
        "storage": seaweed.storage_url(bucket),
        "accessKey": seaweed.access_key,
        "secretKey": seaweed.secret_key,
        "since": "2026-11-22T10:00:00Z",
        "lateness": "60",
    }
    reader = OffloadStreamReader(parse_stream_options(options))
    _put(client, bucket, "2100-01-01T00:00:00", "2100-01-01T00:00:00", b"future")
    first_key = _put(client, bucket, "2026-11-22T11:30:00", "2026-11-22T11:30:00", b"now")
    first = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert first["batch"] == [first_key] and first["max"] == _ms("2026-11-22T11:30:00")
    later = _put(client, bucket, "2026-11-22T11:31:00", "2026-11-22T11:31:00", b"later")
    second = reader.latestOffset(first, ReadAllAvailable())
    assert second["batch"] == [later]


def test_a_batch_read_from_since_finds_a_direct_upload_keyed_in_the_hour_before(
    seaweed: SeaweedFS,
) -> None:
    """`since` 11:00 selects by stamp: keyed 10:50 and stamped 11:30 is in, stamped 10:55 out."""
    from client.spark import parse_options
    from client.spark._source import OffloadReader

    client, bucket = _bucket(seaweed)
    _put(client, bucket, "2026-11-22T10:50:00", "2026-11-22T11:30:00", b"in")
    _put(client, bucket, "2026-11-22T10:50:00", "2026-11-22T10:55:00", b"before since")
    _put(client, bucket, "2026-11-22T11:10:00", "2026-11-22T11:10:00", b"in too")
    _put(client, bucket, "2026-11-22T11:59:00", "2026-11-22T12:00:00", b"at until: out")
    options = {
        "storage": seaweed.storage_url(bucket),
        "accessKey": seaweed.access_key,
        "secretKey": seaweed.secret_key,
        "since": "2026-11-22T11:00:00Z",
        "until": "2026-11-22T12:00:00Z",
    }

    def read(**extra: str) -> set[bytes]:
        reader = OffloadReader(parse_options({**options, **extra}))
        return {
            p
            for part in reader.partitions()
            for batch in reader.read(part)
            for p in batch.column("payload").to_pylist()
        }

    assert read() == {b"in", b"in too"}
    assert read(grantTtl="0") == {b"in too"}  # listing from since's hour only misses it
