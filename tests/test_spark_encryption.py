"""The Spark source on payloads a Client encrypted or compressed (real Spark, SeaweedFS)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _spark_session import local_spark

from client import Client
from client.protocol._age_keys import Identity

from _gateway import GatewayServer
from _servers import SeaweedFS

pytestmark = [pytest.mark.spark, pytest.mark.servers]
pyspark = pytest.importorskip("pyspark")

from pyspark.sql import SparkSession  # noqa: E402

from client.spark import register  # noqa: E402


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = local_spark()
    register(session)
    yield session


def _read(spark: SparkSession, url: str, topic: str, **options: str) -> list[Any]:
    reader = spark.read.format("offload").option("storage", url).option("topic", topic)
    reader = reader.option("accessKey", "offload-test").option(
        "secretKey", "offload-test-secret-key"
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load().collect()


def test_spark_decrypts_with_identity_files_and_decompresses(
    spark: SparkSession,
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    seaweed: SeaweedFS,
    bucket_name: str,
    tmp_path: Path,
) -> None:
    topic = unique_topic("spark-enc")
    identity = Identity.generate()
    key = tmp_path / "key.txt"
    key.write_text(f"{identity}\n")
    secret = os.urandom(100_000)
    telemetry = json.dumps([{"t": i, "v": i % 13} for i in range(30_000)]).encode()
    enc = clients(
        encrypt_to={topic + "/enc": [str(identity.recipient)]},
        offload_threshold=1000,
        compress=True,  # off by default
    )
    enc.publish(topic + "/enc", secret, qos=1)
    enc.publish(topic + "/json", telemetry, qos=1)
    url = seaweed.storage_url(bucket_name)

    rows = {r["topic"]: r for r in _read(spark, url, topic + "/#", identity_files=str(key))}
    assert bytes(rows[topic + "/enc"]["payload"]) == secret
    assert bytes(rows[topic + "/json"]["payload"]) == telemetry
    assert rows[topic + "/json"]["size"] * 4 < len(telemetry)  # the stored size

    raw = {r["topic"]: r for r in _read(spark, url, topic + "/#", decode="false")}
    assert bytes(raw[topic + "/enc"]["payload"]).startswith(b"age-encryption.org/v1\n")
    stranger = tmp_path / "stranger.txt"
    stranger.write_text(f"{Identity.generate()}\n")
    # By default a payload no identity opens is skipped and reported, like any bad object
    # (docs/spark.md): the read goes on; onBadObject=fail names the key instead.
    assert _read(spark, url, topic + "/enc", identity_files=str(stranger)) == []
    assert _read(spark, url, topic + "/enc") == []
    with pytest.raises(Exception, match="no identity opens"):
        _read(spark, url, topic + "/enc", identity_files=str(stranger), onBadObject="fail")
    with pytest.raises(Exception, match="identity_files"):
        _read(spark, url, topic + "/enc", onBadObject="fail")


def test_export_job_decrypts_with_identity(
    spark: SparkSession,
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    seaweed: SeaweedFS,
    bucket_name: str,
    tmp_path: Path,
) -> None:
    from client.spark.job import main as job_main

    topic = unique_topic("spark-job")
    identity = Identity.generate()
    key = tmp_path / "key.txt"
    key.write_text(f"{identity}\n")
    secret = os.urandom(70_000)
    pub = clients(encrypt_to={topic: [str(identity.recipient)]})
    pub.publish(topic, secret, qos=1)
    out = tmp_path / "out"
    code = job_main([
        "--storage", seaweed.storage_url(bucket_name), "--topic", topic, "--out", str(out),
        "--access-key", "offload-test", "--secret-key", "offload-test-secret-key",
        "--identity", str(key),
    ])  # fmt: skip
    assert code == 0
    (row,) = spark.read.parquet(str(out)).collect()
    assert bytes(row["payload"]) == secret
