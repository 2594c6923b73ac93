"""offload-proxy's checks on the way to a subscriber, each caught when its line is broken
(issue 43): a plain payload past the subscriber's own Maximum Packet Size, and a compressed
or encrypted payload whose placeholder states a false SHA-256. Real mosquitto, gateway,
SeaweedFS; the subscribers are plain `mosquitto_sub`, the hostile publisher plain paho."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_proxy import MiB, PahoPeer, start_proxy
from test_proxy_encrypted import _compressible, _key, _output, _sub

from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

PASSED = "offload_proxy_placeholders_passed_total"


def test_a_plain_payload_past_the_subscribers_maximum_packet_size_stays_a_placeholder(
    gateway: GatewayServer,
    broker: Mosquitto,
    clients: Callable[..., Any],
    unique_topic: Callable[[str], str],
) -> None:
    """The only `client-limit` test went through the decoding path (proxy/_unseal.py): the
    plain path's own check (proxy/_outbound.py, `_why_not`) could go unnoticed."""
    proxy = start_proxy(broker, gateway)
    try:
        topic = unique_topic("too-big-for-it")
        sub = _sub(broker, proxy.port, topic, 1, "-D", "connect", "maximum-packet-size", str(MiB))
        clients().publish(topic, os.urandom(2 * MiB), qos=1)  # offloaded: plain, 2 MiB
        placeholder = json.loads(_output(sub))  # what it can take: the placeholder
        assert placeholder["_format"] == "external" and placeholder["size"] == 2 * MiB
        assert "cmp" not in placeholder and "enc" not in placeholder
        assert proxy.metric(PASSED, why="client-limit") == 1
        assert proxy.metric("offload_proxy_resolved_total") == 0
    finally:
        proxy.stop()


@pytest.mark.parametrize("sealed", ["compressed", "encrypted"])
def test_a_decoded_payload_whose_placeholder_lies_about_its_sha256_is_never_delivered(
    gateway: GatewayServer,
    broker: Mosquitto,
    clients: Callable[..., Any],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
    sealed: str,
) -> None:
    """A hostile publisher points a placeholder at a real stored object with a false digest:
    the decoding path must check the stored bytes as the plain path does (proxy/_unseal.py,
    `_decode`), or the subscriber gets a payload its placeholder never vouched for."""
    identity, key_file = _key(tmp_path, "proxy.key")
    proxy = start_proxy(broker, gateway, identity_files=[key_file], spool_dir=tmp_path)
    direct = PahoPeer(broker.port)
    try:
        topic = unique_topic(f"lie-{sealed}")
        direct.subscribe(broker, topic)
        if sealed == "compressed":
            clients(compress=True).publish(topic, _compressible(MiB), qos=1)
        else:
            clients(encrypt_to={topic: [str(identity.recipient)]}).publish(
                topic, os.urandom(MiB), qos=1
            )
        real = json.loads(direct.wait(1)[0].payload)
        assert ("cmp" if sealed == "compressed" else "enc") in real
        lie = json.dumps({**real, "sha256": "0" * 64}).encode()
        sub = _sub(broker, proxy.port, topic, 1)
        direct.client.publish(topic, lie, qos=1).wait_for_publish(30)
        assert _output(sub) == lie  # the placeholder as it came, never the decoded bytes
        assert proxy.metric(PASSED, why="fetch-failed") == 1
        assert proxy.metric("offload_proxy_resolved_total") == 0
        assert [p.name for p in tmp_path.iterdir()] == ["proxy.key"]  # nothing spooled left
    finally:
        direct.close()
        proxy.stop()
