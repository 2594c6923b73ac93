"""offload-proxy in front of a mosquitto on the dynamic security plugin: devices created with
mosquitto_ctrl get one identity for MQTT and payloads. A device whose role grants the topic
sends 5 MiB with mosquitto_pub across a 256 KiB broker; one whose role forbids it gets PUBACK
0x87 and nothing is stored. mosquitto_ctrl's 101-iteration hashes cannot do SCRAM, so the
proxy presents the device's login with HTTP Basic (OFFLOAD_PROXY_GATEWAY_LOGIN=basic) to a
gateway that is behind TLS (OFFLOAD_TLS=true).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_proxy import MiB, PahoPeer, start_proxy

from _dynsec import directory, plugin_path, start_dynsec_broker
from _gateway import GatewayServer
from _servers import Mosquitto, wait_until

__all__ = ["directory"]  # the shared fixture

pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(plugin_path() is None, reason="mosquitto's dynsec plugin missing"),
]


def test_dynsec_devices_through_the_proxy(
    directory: Path,
    tmp_path: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    dyn = start_dynsec_broker(mosquitto_factory, directory, max_packet_size=262144)
    gw = gateway_factory(None, dynsec_file=dyn.file, tls=True, auth_secret="s" * 32)
    for role, verdict in (("cams", "allow"), ("muted", "deny")):
        dyn.ctrl("createRole", role)
        dyn.ctrl("addRoleACL", role, "publishClientSend", "cams/#", verdict)
        dyn.ctrl("addRoleACL", role, "subscribePattern", "cams/#", verdict)
    for device, role in (("cam1", "cams"), ("cam2", "muted"), ("viewer", "cams")):
        dyn.ctrl("createClient", device, "-p", f"pw-{device}")
        dyn.ctrl("addClientRole", device, role)
    server = start_proxy(dyn.broker, gw, gateway_login="basic")
    try:
        topic = f"cams/{uuid.uuid4().hex[:8]}"
        viewer = f"viewer-{uuid.uuid4().hex[:6]}"
        sub = subprocess.Popen(
            ["mosquitto_sub", "-p", str(server.port), "-t", topic, "-C", "1", "-q", "1",
             "-u", "viewer", "-P", "pw-viewer", "-i", viewer, "-N", "-W", "120"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        wait_until(lambda: f"Sending SUBACK to {viewer}" in dyn.broker.log(), "subscribed", 20)
        # cam2 first: refused, nothing stored, and the viewer gets nothing from it.
        cam2 = PahoPeer(server.port, credentials=("cam2", "pw-cam2"))
        acks: list[Any] = []
        cam2.client.on_publish = lambda _c, _u, mid, rc, _p: acks.append(rc)
        cam2.client.publish(topic, os.urandom(MiB), qos=1)
        wait_until(lambda: len(acks) == 1, "cam2's PUBACK", 60)
        assert acks[0].value == 0x87
        assert server.metric("offload_proxy_offload_failures_total", why="403") == 1
        assert server.metric("offload_proxy_offloaded_total") == 0
        cam2.close()
        payload = tmp_path / "5mib.bin"
        payload.write_bytes(os.urandom(5 * MiB))
        with payload.open("rb") as stdin:
            pub = subprocess.run(
                ["mosquitto_pub", "-p", str(server.port), "-t", topic, "-s", "-q", "1",
                 "-u", "cam1", "-P", "pw-cam1"],
                stdin=stdin, capture_output=True, timeout=120,
            )  # fmt: skip
        assert pub.returncode == 0, pub.stderr.decode()
        out, err = sub.communicate(timeout=150)
        assert sub.returncode == 0, err.decode()
        assert hashlib.sha256(out).digest() == hashlib.sha256(payload.read_bytes()).digest()
        assert server.metric("offload_proxy_offloaded_total") == 1  # cam1's only
        assert server.metric("offload_proxy_resolved_total") == 1
    finally:
        server.stop()
