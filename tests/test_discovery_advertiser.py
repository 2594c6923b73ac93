"""The gateway's discovery record on a real broker: retained, expiring, replica-safe."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable

import pytest

from discovery import Advertiser, DiscoveryRecord

from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers


def read_retained(broker: Mosquitto, topic: str = "sys/metadata", wait: float = 3) -> dict | None:  # type: ignore[type-arg]
    out = subprocess.run(
        [
            "mosquitto_sub",
            "-V",
            "5",
            "-p",
            str(broker.port),
            "-t",
            topic,
            "-C",
            "1",
            "-W",
            str(int(wait)),
            "-F",
            "%j",
        ],
        capture_output=True,
        text=True,
        timeout=wait + 10,
    )
    line = out.stdout.strip()
    return json.loads(line) if line else None


def test_record_is_retained_with_an_expiry(
    broker: Mosquitto, gateway_factory: Callable[..., GatewayServer]
) -> None:
    gw = gateway_factory(broker, discovery_interval=2.0)
    seen = read_retained(broker)
    assert seen is not None
    assert seen["retain"] in (True, 1)
    record = DiscoveryRecord.from_json(seen["payload"])
    assert record.endpoint == gw.url
    assert record.max_upload_bytes == gw.settings.max_body_bytes
    assert 0 < seen["properties"]["message-expiry-interval"] <= 6


def test_record_expires_when_the_last_gateway_is_gone(
    broker: Mosquitto, gateway_factory: Callable[..., GatewayServer]
) -> None:
    gw = gateway_factory(broker, discovery_interval=1.0)
    assert read_retained(broker) is not None
    gw.stop()
    time.sleep(4.5)  # expiry is three refresh periods
    assert read_retained(broker, wait=2) is None


def test_replicas_behind_one_url_publish_identical_records(broker: Mosquitto) -> None:
    from concurrent.futures import Future

    published: list[bytes] = []

    def publish(topic: str, payload: bytes, retain: bool, expiry: int) -> Future[None]:
        published.append(payload)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    record = DiscoveryRecord(
        "https://offload.example.com", max_upload_bytes=10, auth_mechanisms=("SCRAM-SHA-512",)
    )
    replicas = [Advertiser(publish, record, topic="sys/metadata", interval=60) for _ in range(3)]
    for replica in replicas:
        assert replica.publish_once()
    assert len(set(published)) == 1
    assert replicas[0].expiry == 180
