"""offload-proxy's part in retention (proxy/_lifecycle.py): dedup across the proxy, its group's
confirmations, PUBACK 0x97 past the quota. Real mosquitto (256 KiB), gateway, SeaweedFS,
unmodified paho devices."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from test_proxy import MiB, PahoPeer, start_proxy

from client import Client, Route
from gateway.storage import S3Store

from _gateway import GatewayServer
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers


def payload_objects(store: S3Store) -> list[str]:
    return sorted(o.key for o in store.list("data/") if not o.key.endswith(".meta.json"))


def raw_bytes_in() -> float:
    value = REGISTRY.get_sample_value(
        "offload_http_received_bytes_total", {"route": "/msg/{message_id}"}
    )
    return value or 0.0


def mosquitto_pub(port: int, topic: str, payload: bytes) -> None:
    done = subprocess.run(
        ["mosquitto_pub", "-p", str(port), "-t", topic, "-s", "-q", "1", "-V", "5"],
        input=payload, capture_output=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()


def test_dedup_across_the_proxy(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto, store: S3Store
) -> None:
    """A payload the library stored, published again by a device through the proxy: read
    whole, asked for by SHA-256, linked: the gateway receives none of its bytes, the
    subscriber gets it. One over `dedup_bytes` streams, and the gateway keeps one copy."""
    gw = gateway_factory(broker)
    proxy = start_proxy(broker, gw, dedup_bytes=2 * MiB)
    payload, big = os.urandom(MiB), os.urandom(3 * MiB)
    try:
        with Client(broker.url, endpoint=gw.url) as lib:
            for data in (payload, big):
                assert lib.publish("dedup/lib", data, qos=1).route is Route.OFFLOADED
        sub = PahoPeer(proxy.port)
        sub.subscribe(broker, "dedup/device", qos=1)
        before = raw_bytes_in()
        mosquitto_pub(proxy.port, "dedup/device", payload)
        assert raw_bytes_in() == before  # linked: not a byte of it uploaded
        assert sub.wait(1)[0].payload == payload
        mosquitto_pub(proxy.port, "dedup/device", big)  # streams: sent, kept once
        assert raw_bytes_in() - before == len(big)
        assert sub.wait(2)[1].payload == big
        sub.close()
    finally:
        proxy.stop()
    assert len(payload_objects(store)) == 2


def test_a_device_past_its_quota_gets_puback_0x97(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto, store: S3Store
) -> None:
    """The gateway refuses the upload with 413 naming the quota; the device's PUBLISH gets
    PUBACK 0x97 (quota exceeded), nothing is published, and one that fits still goes."""
    gw = gateway_factory(broker, max_stored_bytes_per_user=MiB)
    proxy = start_proxy(broker, gw)
    codes: list[int] = []
    device = PahoPeer(proxy.port)
    device.client.on_publish = lambda _c, _u, _mid, rc, _p: codes.append(rc.value)
    try:
        for size in (2 * MiB, 512 * 1024):
            seen = len(codes)
            device.client.publish("quota/device", os.urandom(size), qos=1)
            wait_until(lambda seen=seen: len(codes) > seen, "the PUBACK", 60)
        assert codes == [0x97, 0x10]  # refused; stored (no subscriber)
    finally:
        device.close()
        proxy.stop()
    assert sum(o.size for o in store.list("data/") if not o.key.endswith(".json")) == 512 * 1024


def test_the_proxy_confirms_what_it_delivered_for_its_group(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto, store: S3Store, tmp_path: Path
) -> None:
    """Its topic waits for the group `devices`; the proxy, in that group, resolves the
    placeholder for an unmodified subscriber, and once it has written the payload whole
    it confirms: the gateway deletes the message."""
    groups = tmp_path / "groups.toml"
    groups.write_text('[topics]\n"fleet/#" = ["devices"]\n')
    gw = gateway_factory(broker, retention_groups_file=groups)
    proxy = start_proxy(broker, gw, group="devices")
    try:
        sub = PahoPeer(proxy.port)
        sub.subscribe(broker, "fleet/7", qos=1)
        payload = os.urandom(400 * 1024)
        with Client(broker.url, endpoint=gw.url) as lib:
            assert lib.publish("fleet/7", payload, qos=1).route is Route.OFFLOADED
        assert sub.wait(1)[0].payload == payload
        wait_until(lambda: payload_objects(store) == [], "deleted once confirmed", 15)
        wait_until(lambda: not list(store.list("ids/")), "its index gone too", 15)
        sub.close()
    finally:
        proxy.stop()
