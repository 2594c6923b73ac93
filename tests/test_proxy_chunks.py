"""offload-proxy reassembles ADR-23 chunked messages for UNMODIFIED subscribers: a producer
on `client.Client` that chunks (no endpoint) straight on a 256 KiB mosquitto, a plain
`mosquitto_sub` (MQTT 5) through the proxy with the real gateway and SeaweedFS behind it."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest
from test_proxy import start_proxy, subscribed

from _gateway import GatewayServer
from _proxy import ProxyServer
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers

MiB = 1024 * 1024


@pytest.fixture
def proxy(gateway: GatewayServer, broker: Mosquitto) -> Iterator[ProxyServer]:
    server = start_proxy(broker, gateway)
    yield server
    server.stop()


def mosquitto_sub(
    broker: Mosquitto, port: int, topic: str, *, qos: int, count: int
) -> tuple[subprocess.Popen[bytes], str]:
    client_id = f"sub-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        ["mosquitto_sub", "-p", str(port), "-t", topic, "-C", str(count), "-V", "5",
         "-q", str(qos), "-i", client_id, "-N", "-W", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    wait_until(subscribed(broker, client_id), "mosquitto_sub subscribed", 20)
    return proc, client_id


def output(proc: subprocess.Popen[bytes]) -> bytes:
    out, err = proc.communicate(timeout=150)
    assert proc.returncode == 0, err.decode()
    return out


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_chunked_messages_reach_mosquitto_sub_whole_through_the_proxy(
    proxy: ProxyServer, broker: Mosquitto, unique_topic: Callable[[str], str], qos: int
) -> None:
    from client import Client, Route

    topic = unique_topic("chunks")
    sub, sub_id = mosquitto_sub(broker, proxy.port, topic, qos=qos, count=3)
    first, second = os.urandom(3 * MiB), os.urandom(1 * MiB + 17)
    pub = Client(broker.url, automatic_offload=False, discovery_wait=0)
    pub.connect()
    try:
        for payload in (first, second):
            assert pub.publish(topic, payload, qos=qos).route is Route.CHUNKED
        pub.publish(topic, b"small", qos=qos)  # after the chunks, in order
    finally:
        pub.close()
    assert output(sub) == first + second + b"small"  # byte-exact, whole, in order
    assert proxy.metric("offload_proxy_reassembled_total") == 2
    if qos:  # the subscriber's own answer to the whole message reached the broker
        answer = "PUBACK" if qos == 1 else "PUBCOMP"
        wait_until(lambda: f"Received {answer} from {sub_id}" in broker.log(), answer, 20)
    assert "protocol error" not in broker.log().lower()


def test_a_chunked_message_beyond_the_bound_is_dropped_and_the_next_one_arrives(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    from client import Client, Route

    proxy = start_proxy(broker, gateway, max_reassembly_bytes=1 * MiB)
    try:
        topic = unique_topic("chunks-bound")
        sub, _ = mosquitto_sub(broker, proxy.port, topic, qos=1, count=1)
        too_big, fits = os.urandom(3 * MiB), os.urandom(MiB // 2)
        pub = Client(broker.url, automatic_offload=False, discovery_wait=0)
        pub.connect()
        try:
            for payload in (too_big, fits):
                assert pub.publish(topic, payload, qos=1).route is Route.CHUNKED
        finally:
            pub.close()
        assert output(sub) == fits  # the first never in part, the second whole
        assert proxy.metric("offload_proxy_chunk_failures_total", why="ChunkBufferOverflow") == 1
        assert proxy.metric("offload_proxy_reassembled_total") == 1
        assert proxy.call(lambda: proxy.proxy.services.reassembly.used) == 0
    finally:
        proxy.stop()


def test_a_chunk_larger_than_the_bound_is_dropped_never_handed_on_as_a_chunk(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    from client import Client, Route

    proxy = start_proxy(broker, gateway, max_reassembly_bytes=128 * 1024)  # < one chunk
    try:
        topic = unique_topic("chunks-one-too-big")
        sub, _ = mosquitto_sub(broker, proxy.port, topic, qos=1, count=1)
        pub = Client(broker.url, automatic_offload=False, discovery_wait=0)
        pub.connect()
        try:
            assert pub.publish(topic, os.urandom(MiB), qos=1).route is Route.CHUNKED
            pub.publish(topic, b"after", qos=1)
        finally:
            pub.close()
        assert output(sub) == b"after"  # no chunk of the first message, in whole or in part
        assert proxy.metric("offload_proxy_chunk_failures_total", why="bounds") >= 4
        assert proxy.metric("offload_proxy_reassembled_total") == 0
    finally:
        proxy.stop()
