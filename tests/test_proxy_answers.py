"""Answers a device can act on (issue 50): a refusal that resending cannot change gets PUBACK
0x87 (the gateway refused the login or the access) or 0x83 (the gateway refused the request
itself: a payload over its size limit, properties over its request head), never 0x80
("resend"); a 3.1.1 device, which has no reason codes, gets a plain PUBACK (the message
dropped, as mosquitto answers a 3.1.1 PUBLISH its ACL refuses) instead of a closed
connection it would reconnect to and resend for ever. 0x80 stays for what a resend may
fix (a gateway that did not answer: test_proxy_frozen_gateway.py).

Unmodified paho devices through the running proxy, real mosquitto, gateway and store.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from test_proxy import MiB, PahoPeer, start_proxy

from _dynsec import directory, plugin_path, start_dynsec_broker
from _gateway import GatewayServer
from _servers import Mosquitto, wait_until

__all__ = ["directory"]  # the shared fixture

pytestmark = pytest.mark.servers


class Acks:
    """The PUBACK reason codes a paho device got (a 3.1.1 PUBACK counts as 0)."""

    def __init__(self, device: PahoPeer) -> None:
        self.codes: list[int] = []
        self._lock = threading.Lock()
        device.client.on_publish = self._on_publish

    def _on_publish(self, _c: Any, _u: Any, _mid: int, rc: Any, _p: Any) -> None:
        with self._lock:
            self.codes.append(int(getattr(rc, "value", rc)))

    def wait(self, count: int) -> list[int]:
        wait_until(lambda: len(self.codes) >= count, f"{count} PUBACKs", 60)
        return self.codes


def _failures(server: Any) -> float:
    """Offloads refused, whatever the reason."""
    registry = server.proxy.metrics.registry
    return sum(
        sample.value
        for metric in registry.collect()
        if metric.name == "offload_proxy_offload_failures"
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


def _refused_then_still_connected(
    server: Any, device: PahoPeer, publish: Callable[[], object], expected: int
) -> None:
    acks = Acks(device)
    publish()
    assert acks.wait(1) == [expected]
    assert _failures(server) == 1  # once: not refused, reconnected and resent, again and again
    # The connection stays: a small message on it still goes through.
    device.client.publish(f"{uuid.uuid4().hex}/small", b"x", qos=1)
    assert acks.wait(2)[1] in (0x00, 0x10)
    assert device.client.is_connected()
    assert server.metric("offload_proxy_offloaded_total") == 0


@pytest.mark.skipif(plugin_path() is None, reason="mosquitto's dynsec plugin missing")
@pytest.mark.parametrize("v5", [True, False], ids=["mqtt5", "mqtt311"])
def test_a_login_the_gateway_refuses_gets_0x87(
    directory: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
    v5: bool,
) -> None:
    """A dynamic-security client made with mosquitto_ctrl (101 PBKDF2 iterations: SCRAM
    cannot work, and the gateway is plain HTTP, so no Basic either): the broker accepts
    its login, the gateway refuses it. 0x87 (before: 0x80, the SCRAM failure had no
    status), a 3.1.1 device a plain PUBACK; nothing stored, nothing published."""
    dyn = start_dynsec_broker(mosquitto_factory, directory, max_packet_size=262144)
    gw = gateway_factory(None, dynsec_file=dyn.file, auth_secret="s" * 32)
    dyn.ctrl("createRole", "cams")
    dyn.ctrl("addRoleACL", "cams", "publishClientSend", "#", "allow")
    dyn.ctrl("addRoleACL", "cams", "subscribePattern", "#", "allow")
    dyn.ctrl("createClient", "cam1", "-p", "pw-cam1")
    dyn.ctrl("addClientRole", "cam1", "cams")
    server = start_proxy(dyn.broker, gw)
    topic = f"cams/{uuid.uuid4().hex[:8]}"
    watcher = PahoPeer(dyn.port, credentials=("cam1", "pw-cam1"))
    watcher.subscribe(dyn.broker, topic)
    device = PahoPeer(server.port, v5=v5, credentials=("cam1", "pw-cam1"))
    try:
        _refused_then_still_connected(
            server,
            device,
            lambda: device.client.publish(topic, os.urandom(MiB), qos=1),
            0x87 if v5 else 0,
        )
        assert server.metric("offload_proxy_offload_failures_total", why="401") == 1
        assert [m.topic for m in watcher.messages] == []
    finally:
        device.close()
        watcher.close()
        server.stop()


@pytest.mark.parametrize("v5", [True, False], ids=["mqtt5", "mqtt311"])
def test_a_payload_over_the_gateways_size_limit_gets_0x83(
    broker: Mosquitto, gateway_factory: Callable[..., GatewayServer], v5: bool
) -> None:
    """The gateway stores at most 1 MiB (OFFLOAD_MAX_BODY_BYTES): a 2 MiB PUBLISH gets
    0x83 (before: 0x97, "quota exceeded", which invites a resend that can never work)."""
    gw = gateway_factory(broker, max_body_bytes=MiB)
    server = start_proxy(broker, gw)
    device = PahoPeer(server.port, v5=v5)
    try:
        _refused_then_still_connected(
            server,
            device,
            lambda: device.client.publish("big/x", os.urandom(2 * MiB), qos=1),
            0x83 if v5 else 0,
        )
        assert server.metric("offload_proxy_offload_failures_total", why="413") == 1
    finally:
        device.close()
        server.stop()


def test_properties_over_the_gateways_request_head_get_0x83(
    broker: Mosquitto, gateway_factory: Callable[..., GatewayServer]
) -> None:
    """User properties of 80 KiB go to the gateway as header fields, over its 64 KiB
    request head: 0x83 at once, no upload (before: the gateway's 431, PUBACK 0x80, and
    the device resent for ever)."""
    gw = gateway_factory(broker)
    server = start_proxy(broker, gw)
    device = PahoPeer(server.port)
    properties = Properties(PacketTypes.PUBLISH)
    properties.UserProperty = [(f"k{i}", "v" * 1000) for i in range(80)]
    try:
        _refused_then_still_connected(
            server,
            device,
            lambda: device.client.publish("props/x", os.urandom(MiB), qos=1, properties=properties),
            0x83,
        )
        assert server.metric("offload_proxy_uploaded_bytes_total") == 0
    finally:
        device.close()
        server.stop()
