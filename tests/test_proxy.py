"""offload-proxy with UNMODIFIED peers (mosquitto_pub/sub, plain paho) across a 256 KiB
mosquitto, the real gateway and SeaweedFS; `client.Client` on either side."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from _gateway import GatewayServer
from _proxy import ProxyServer
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers

MiB = 1024 * 1024


def start_proxy(
    mosquitto: Mosquitto, gateway: GatewayServer | None, **settings: Any
) -> ProxyServer:
    from proxy import ProxySettings

    values: dict[str, Any] = {"broker": mosquitto.url, "port": 0}
    if gateway is not None:
        values["endpoint"] = gateway.url
    values.update(settings)
    return ProxyServer(ProxySettings(**values)).start()


@pytest.fixture
def proxy(gateway: GatewayServer, broker: Mosquitto) -> Iterator[ProxyServer]:
    server = start_proxy(broker, gateway)
    yield server
    server.stop()


@pytest.fixture
def big_file(tmp_path: Path) -> Path:
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(20 * MiB))
    return path


def subscribed(broker: Mosquitto, client_id: str) -> Callable[[], bool]:
    return lambda: f"Sending SUBACK to {client_id}" in broker.log()


class MosquittoSub:
    """`mosquitto_sub -C 1` through `port`; waits until the broker has subscribed it."""

    def __init__(self, broker: Mosquitto, port: int, topic: str, version: str) -> None:
        self.client_id = f"sub-{uuid.uuid4().hex[:8]}"
        self.proc = subprocess.Popen(
            ["mosquitto_sub", "-p", str(port), "-t", topic, "-C", "1", "-V", version,
             "-q", "1", "-i", self.client_id, "-N", "-W", "120"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        wait_until(subscribed(broker, self.client_id), "mosquitto_sub subscribed", 20)

    def payload(self) -> bytes:
        out, err = self.proc.communicate(timeout=150)
        assert self.proc.returncode == 0, err.decode()
        return out


@pytest.mark.parametrize("version", ["5", "311"])
def test_mosquitto_pub_to_mosquitto_sub_20mib_through_the_proxy_byte_exact(
    proxy: ProxyServer, broker: Mosquitto, big_file: Path, unique_topic: Callable[[str], str],
    version: str,
) -> None:  # fmt: skip
    topic = unique_topic("proxy")
    sub = MosquittoSub(broker, proxy.port, topic, version)
    with big_file.open("rb") as stdin:
        pub = subprocess.run(
            ["mosquitto_pub", "-p", str(proxy.port), "-t", topic, "-s", "-q", "1", "-V", version],
            stdin=stdin, capture_output=True, timeout=120,
        )  # fmt: skip
    assert pub.returncode == 0, pub.stderr.decode()
    got = sub.payload()
    assert hashlib.sha256(got).digest() == hashlib.sha256(big_file.read_bytes()).digest()
    assert proxy.metric("offload_proxy_offloaded_total") == 1
    assert proxy.metric("offload_proxy_resolved_total") == 1


class PahoPeer:
    """A plain paho client (no offload code at all) and what it receives."""

    def __init__(
        self,
        port: int,
        *,
        v5: bool = True,
        credentials: tuple[str, str] | None = None,
        bind_address: str = "",
        **will: Any,
    ) -> None:
        self.client_id = f"paho-{uuid.uuid4().hex[:8]}"
        protocol = paho.MQTTv5 if v5 else paho.MQTTv311
        self.client = paho.Client(CallbackAPIVersion.VERSION2, self.client_id, protocol=protocol)
        self.messages: list[paho.MQTTMessage] = []
        self.arrived = threading.Condition()
        self.client.on_message = self._on_message
        if will:
            self.client.will_set(**will)
        if credentials is not None:
            self.client.username_pw_set(*credentials)
        self.client.connect("127.0.0.1", port, keepalive=30, bind_address=bind_address)
        self.client.loop_start()
        wait_until(self.client.is_connected, "paho connected", 20)

    def _on_message(self, _c: Any, _u: Any, message: paho.MQTTMessage) -> None:
        with self.arrived:
            self.messages.append(message)
            self.arrived.notify_all()

    def subscribe(self, broker: Mosquitto, topic: str, qos: int = 2) -> None:
        self.client.subscribe(topic, qos)
        wait_until(subscribed(broker, self.client_id), "paho subscribed", 20)

    def wait(self, count: int) -> list[paho.MQTTMessage]:
        wait_until(lambda: len(self.messages) >= count, f"{count} messages", 120)
        return self.messages

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _user_props(message: paho.MQTTMessage) -> list[tuple[str, str]]:
    return list(getattr(message.properties, "UserProperty", []) or [])


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_plain_paho_qos_retain_and_properties_through_the_proxy(
    proxy: ProxyServer, broker: Mosquitto, gateway: GatewayServer,
    unique_topic: Callable[[str], str], qos: int,
) -> None:  # fmt: skip
    from client import Client

    topic = unique_topic("paho")
    payload = os.urandom(3 * MiB + 17)
    sub, direct = PahoPeer(proxy.port), PahoPeer(broker.port)
    sub.subscribe(broker, topic)
    direct.subscribe(broker, topic)
    pub = PahoPeer(proxy.port)
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("app", "x")]
    props.ContentType = "application/x-test"
    info = pub.client.publish(topic, payload, qos=qos, retain=True, properties=props)
    info.wait_for_publish(60)
    assert info.rc == 0
    got = sub.wait(1)[0]
    assert got.payload == payload and got.qos == qos
    assert _user_props(got) == [("app", "x")] and got.properties.ContentType == "application/x-test"
    seen = direct.wait(1)[0]  # straight on the broker: the library's placeholder
    assert ("_format", "external") in _user_props(seen) and ("app", "x") in _user_props(seen)
    ref = json.loads(seen.payload)
    assert ref["size"] == len(payload) and ref["sha256"] == hashlib.sha256(payload).hexdigest()
    late = PahoPeer(proxy.port)  # the retained message, resolved for a later subscriber
    late.subscribe(broker, topic)
    retained = late.wait(1)[0]
    assert retained.retain and retained.payload == payload
    with Client(broker.url, discovery_wait=10.0) as lib:  # the library straight on the broker
        lib.subscribe(topic)
        resolved = lib.next_message(60)
        assert resolved is not None and resolved.payload == payload  # type: ignore[union-attr]
    for peer in (sub, direct, pub, late):
        peer.close()


def test_a_gateway_that_redirects_downloads_to_its_store_is_followed_there_and_only_there(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto, seaweed: Any,
    big_file: Path, unique_topic: Callable[[str], str],
) -> None:  # fmt: skip
    """Direct transfers on: `GET /msg/<id>/payload` is a 307 to a presigned store URL. The
    proxy follows it to the store the gateway's own record (`GET /`) declares, without
    credentials, and the unmodified subscriber gets the payload, not the placeholder."""
    gw = gateway_factory(broker, s3_public_url=f"http://{seaweed.endpoint}")
    proxy = start_proxy(broker, gw)
    try:
        topic = unique_topic("proxy-direct")
        sub = MosquittoSub(broker, proxy.port, topic, "5")
        with big_file.open("rb") as stdin:
            pub = subprocess.run(
                ["mosquitto_pub", "-p", str(proxy.port), "-t", topic, "-s", "-q", "1"],
                stdin=stdin, capture_output=True, timeout=120,
            )  # fmt: skip
        assert pub.returncode == 0, pub.stderr.decode()
        got = sub.payload()
        assert hashlib.sha256(got).digest() == hashlib.sha256(big_file.read_bytes()).digest()
        assert proxy.metric("offload_proxy_resolved_total") == 1
    finally:
        proxy.stop()


def test_a_store_that_cannot_be_reached_gives_the_placeholder_and_the_client_goes_on(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto,
    unique_topic: Callable[[str], str],
) -> None:  # fmt: skip
    """The gateway redirects downloads to a store origin nothing listens on: the unmodified
    subscriber gets the placeholder (what the proxy does with any payload it cannot fetch),
    and the next message still arrives."""
    gw = gateway_factory(broker, s3_public_url="http://127.0.0.1:9")  # discard: refused
    proxy = start_proxy(broker, gw)
    try:
        topic = unique_topic("proxy-store-down")
        peer = PahoPeer(proxy.port)
        peer.subscribe(broker, topic, qos=1)
        big = os.urandom(400 * 1024)
        for payload in (big, b"small"):
            pub = subprocess.run(
                ["mosquitto_pub", "-p", str(proxy.port), "-t", topic, "-s", "-q", "1"],
                input=payload, capture_output=True, timeout=120,
            )  # fmt: skip
            assert pub.returncode == 0, pub.stderr.decode()
        first, second = peer.wait(2)[:2]
        placeholder = json.loads(first.payload)
        assert placeholder["_format"] == "external"
        assert placeholder["size"] == len(big)
        assert second.payload == b"small"
        peer.close()
    finally:
        proxy.stop()
