"""Session fixtures: real mosquitto and SeaweedFS on free loopback ports."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from _servers import Mosquitto, SeaweedFS


@pytest.fixture(scope="session")
def seaweed() -> Iterator[SeaweedFS]:
    server = SeaweedFS().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket_name() -> str:
    return f"t-{uuid.uuid4().hex[:20]}"


@pytest.fixture
def storage_url(seaweed: SeaweedFS, bucket_name: str) -> str:
    return seaweed.storage_url(bucket_name)


@pytest.fixture
def s3_env(seaweed: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> SeaweedFS:
    monkeypatch.setenv("OFFLOAD_S3_ACCESS_KEY", seaweed.access_key)
    monkeypatch.setenv("OFFLOAD_S3_SECRET_KEY", seaweed.secret_key)
    return seaweed


@pytest.fixture
def mosquitto_factory() -> Iterator[Callable[..., Mosquitto]]:
    started: list[Mosquitto] = []

    def start(max_packet_size: int | None = None, extra_config: str = "") -> Mosquitto:
        broker = Mosquitto(max_packet_size=max_packet_size, extra_config=extra_config).start()
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.stop()


@pytest.fixture
def broker(mosquitto_factory: Callable[..., Mosquitto]) -> Mosquitto:
    """A broker that only takes 256 KiB packets, as cloud brokers do."""
    return mosquitto_factory(max_packet_size=262144)


@pytest.fixture
def unique_topic() -> Callable[[str], str]:
    def make(prefix: str = "t") -> str:
        return f"{prefix}/{uuid.uuid4().hex[:12]}"

    return make
