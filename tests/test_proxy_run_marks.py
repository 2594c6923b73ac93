"""What must stop a run, through the running proxy (issue 51 §5): each mark the relay's
run rules hold, shown by a packet that only that mark stops, with real peers (mosquitto's
tools, paho) across a 256 KiB mosquitto, the gateway and SeaweedFS. tests/test_proxy_runs.py
checks the rules themselves; these check that the relay gives them those marks."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable

import pytest
from test_proxy import MosquittoSub, PahoPeer, start_proxy
from test_proxy_fleet import device
from test_proxy_hostile import _packet, _read

from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

TOPIC_ALIAS = 0x23


def mosquitto_pub(port: int, topic: str, *args: str, payload: bytes) -> None:
    done = subprocess.run(
        ["mosquitto_pub", "-p", str(port), "-t", topic, "-V", "5", "-q", "1", *args, "-s"],
        input=payload, capture_output=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()


def test_a_placeholder_marked_only_by_its_user_property_is_resolved_not_passed_in_a_run(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    """A placeholder whose JSON does not name `_format` (the library's rule takes the user
    property `_format=external` alone), published straight on the broker by
    `mosquitto_pub -D publish user-property _format external`: the plain `mosquitto_sub`
    behind the proxy gets the payload, byte-exact. Only the run rule's user-property mark
    stops that PUBLISH (its payload holds no `"_format"`): without it the subscriber got
    the placeholder's JSON."""
    proxy = start_proxy(broker, gateway)
    try:
        stored, relayed = unique_topic("stored"), unique_topic("marked")
        payload = os.urandom(400 * 1024)
        straight = MosquittoSub(broker, broker.port, stored, "5")  # gets the placeholder
        mosquitto_pub(proxy.port, stored, payload=payload)  # offloaded by the proxy
        reference = json.loads(straight.payload())
        assert reference.pop("_format") == "external"
        unmarked = json.dumps(reference).encode()
        assert b'"_format"' not in unmarked

        sub = MosquittoSub(broker, proxy.port, relayed, "5")
        mosquitto_pub(
            broker.port, relayed, "-D", "publish", "user-property", "_format", "external",
            payload=unmarked,
        )  # fmt: skip
        got = sub.payload()
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(payload).hexdigest(), got[:200]
        assert proxy.metric("offload_proxy_resolved_total") == 1
    finally:
        proxy.stop()


def publish(topic: bytes, payload: bytes, packet_id: int, props: bytes) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + packet_id.to_bytes(2, "big")
    return _packet(0x32, body + bytes([len(props)]) + props + payload)


def test_a_large_alias_only_publish_after_a_small_one_that_set_the_alias_is_offloaded(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    """An MQTT 5 device sets Topic Alias 1 with a small PUBLISH, then sends a 300 KB one
    with the alias alone (no topic): the proxy knows the alias from the small one (which
    the run rule's Topic Alias mark stops, so the proxy reads it), offloads the large one
    under its topic, and the subscriber gets both, in order, byte-exact; both PUBACKs
    succeed. Without the mark the small one passed in a run unread and the large one got
    DISCONNECT 0x94 (Topic Alias invalid)."""
    proxy = start_proxy(broker, gateway)
    try:
        topic = unique_topic("aliased")
        sub = PahoPeer(proxy.port)
        sub.subscribe(broker, topic, qos=1)
        sock = device(proxy.port, "127.0.0.1")
        alias = bytes([TOPIC_ALIAS]) + (1).to_bytes(2, "big")
        small, large = b"small one", os.urandom(300 * 1024)
        sock.sendall(publish(topic.encode(), small, 1, alias) + publish(b"", large, 2, alias))
        assert _read(sock) == (0x40, (1).to_bytes(2, "big"))  # PUBACK, success
        assert _read(sock) == (0x40, (2).to_bytes(2, "big"))
        got = sub.wait(2)
        assert [m.topic for m in got] == [topic, topic]
        assert got[0].payload == small
        assert hashlib.sha256(got[1].payload).digest() == hashlib.sha256(large).digest()
        assert proxy.metric("offload_proxy_offloaded_total") == 1
        sock.close()
        sub.close()
    finally:
        proxy.stop()
