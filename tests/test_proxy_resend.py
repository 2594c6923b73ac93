"""A QoS 2 PUBLISH over the broker's limit, resent with DUP by a client that lost the
PUBREC, is not stored a second time (proxy/_resends.py). A hand-written client on a raw
socket (paho resends on its own terms), real mosquitto (256 KiB), gateway and SeaweedFS."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterator

import pytest
from minio import Minio
from test_proxy import MiB, PahoPeer, start_proxy
from test_proxy_hostile import _packet, _read, _text, _varint, dial, until_closed

from _gateway import GatewayServer
from _proxy import ProxyServer
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers

PID = 7


@pytest.fixture
def proxy(gateway: GatewayServer, broker: Mosquitto) -> Iterator[ProxyServer]:
    server = start_proxy(broker, gateway)
    yield server
    server.stop()


class RawClient:
    """A persistent-session MQTT client that says exactly what the test tells it to."""

    def __init__(self, port: int, client_id: str, *, v5: bool) -> None:
        self.v5 = v5
        self.sock = dial(port)
        body = _text("MQTT") + bytes([5 if v5 else 4, 0x00]) + (60).to_bytes(2, "big")
        if v5:  # a session that outlives the connection
            props = b"\x11" + (300).to_bytes(4, "big")
            body += _varint(len(props)) + props
        self.sock.sendall(_packet(0x10, body + _text(client_id)))
        first, connack = _read(self.sock)
        assert first == 0x20 and connack[1] == 0, connack
        self.session_present = bool(connack[0] & 1)

    def publish_qos2(self, topic: str, payload: bytes, *, dup: bool) -> None:
        props = b"\x00" if self.v5 else b""
        body = _text(topic) + PID.to_bytes(2, "big") + props + payload
        self.sock.sendall(_packet(0x34 | (0x08 if dup else 0), body))

    def expect(self, kind: int) -> bytes:
        first, body = _read(self.sock)
        assert first >> 4 == kind, (first, body)
        assert body[:2] == PID.to_bytes(2, "big")
        return body


def _stored_ids(seaweed: SeaweedFS, bucket: str) -> list[str]:
    s3 = Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)
    return [str(o.object_name) for o in s3.list_objects(bucket, prefix="ids/", recursive=True)]


@pytest.mark.parametrize("v5", [True, False])
def test_a_qos2_resend_after_a_lost_pubrec_is_not_stored_again(
    proxy: ProxyServer,
    broker: Mosquitto,
    seaweed: SeaweedFS,
    bucket_name: str,
    unique_topic: Callable[[str], str],
    v5: bool,
) -> None:
    topic = unique_topic("qos2-resend")
    watcher = PahoPeer(broker.port)  # straight on the broker: sees the placeholders
    watcher.subscribe(broker, topic)
    payload = os.urandom(MiB)
    client_id = f"raw-{uuid.uuid4().hex[:8]}"
    try:
        first = RawClient(proxy.port, client_id, v5=v5)
        first.publish_qos2(topic, payload, dup=False)
        first.expect(5)  # PUBREC: stored and published; then "lost" with the connection
        first.sock.close()

        again = RawClient(proxy.port, client_id, v5=v5)
        assert again.session_present
        again.publish_qos2(topic, payload, dup=True)
        again.expect(5)  # PUBREC for the resend
        again.sock.sendall(b"\x62\x02" + PID.to_bytes(2, "big"))  # PUBREL
        again.expect(7)  # PUBCOMP
        again.sock.sendall(b"\xe0\x00")
        until_closed(again.sock)

        (message,) = watcher.wait(1)  # the broker discarded the resend: one message
        placeholder = json.loads(message.payload)
        assert placeholder["sha256"] == hashlib.sha256(payload).hexdigest()
        assert proxy.metric("offload_proxy_offloaded_total") == 1
        assert proxy.metric("offload_proxy_resends_total") == 1
        assert len(_stored_ids(seaweed, bucket_name)) == 1  # no second copy, no orphan
        assert proxy.call(lambda: len(proxy.proxy.services.stored_flows)) == 0  # PUBCOMP
    finally:
        watcher.close()


def test_a_resend_whose_bytes_differ_is_not_published_and_stored_when_sent_again(
    proxy: ProxyServer,
    broker: Mosquitto,
    seaweed: SeaweedFS,
    bucket_name: str,
    unique_topic: Callable[[str], str],
) -> None:
    topic = unique_topic("qos2-differs")
    watcher = PahoPeer(broker.port)
    watcher.subscribe(broker, topic)
    client_id = f"raw-{uuid.uuid4().hex[:8]}"
    original, other = os.urandom(MiB), os.urandom(MiB)
    try:
        first = RawClient(proxy.port, client_id, v5=True)
        first.publish_qos2(topic, original, dup=False)
        first.expect(5)
        first.sock.close()
        # Against MQTT's rule the "resend" carries other bytes: nothing of them may go out
        # under the stored placeholder; the connection is closed and the flow forgotten.
        liar = RawClient(proxy.port, client_id, v5=True)
        liar.publish_qos2(topic, other, dup=True)
        assert until_closed(liar.sock) == b""
        assert proxy.metric("offload_proxy_offload_failures_total", why="resend-differs") == 1
        assert proxy.metric("offload_proxy_resends_total") == 0
        # Sent once more, it is stored; mosquitto takes a QoS 2 resend whose payload differs
        # in place of the one it held (as for a client straight on it), so the client's
        # latest bytes are the message, and the first copy is the liar's own orphan.
        last = RawClient(proxy.port, client_id, v5=True)
        last.publish_qos2(topic, other, dup=True)
        last.expect(5)
        last.sock.sendall(b"\x62\x02" + PID.to_bytes(2, "big"))
        last.expect(7)
        (message,) = watcher.wait(1)
        assert json.loads(message.payload)["sha256"] == hashlib.sha256(other).hexdigest()
        assert proxy.metric("offload_proxy_offloaded_total") == 2
        assert len(_stored_ids(seaweed, bucket_name)) == 2
    finally:
        watcher.close()
