"""The blocking client against a real mosquitto: direct, chunked, limits, discovery, re-entrancy."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from client import (
    BrokerUrl,
    ChunkTimeoutError,
    Client,
    Message,
    MessageError,
    MessageTooLarge,
    MqttConnection,
    PublishProperties,
    Route,
)
from client.protocol._chunk import split
from client.protocol._size import publish_packet_size

from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

KiB = 1024


def _one(client: Client, timeout: float = 10.0) -> Message | MessageError:
    item = client.next_message(timeout)
    assert item is not None, "nothing delivered in time"
    return item


def _message(client: Client, timeout: float = 10.0) -> Message:
    item = _one(client, timeout)
    assert isinstance(item, Message), item
    return item


@pytest.fixture
def clients(broker: Mosquitto) -> Iterator[Callable[..., Client]]:
    made: list[Client] = []

    def make(url: str | None = None, **kw: object) -> Client:
        kw.setdefault("discovery_wait", 0.3)
        c = Client(url or broker.url, **kw)  # type: ignore[arg-type]
        c.connect()
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_small_message_goes_direct_with_properties(
    clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("direct")
    sub, pub = clients(), clients()
    sub.subscribe(topic)
    props = PublishProperties(
        content_type="text/plain", user_properties=(("a", "1"), ("a", "2")), correlation_data=b"c"
    )
    result = pub.publish(topic, "hello", qos=1, properties=props)
    assert result.route is Route.DIRECT
    assert result.sha256 == hashlib.sha256(b"hello").hexdigest()
    msg = _message(sub)
    assert (msg.topic, msg.payload, msg.qos, msg.route) == (topic, b"hello", 1, Route.DIRECT)
    assert msg.sha256 == result.sha256
    assert msg.properties.user_properties == (("a", "1"), ("a", "2"))
    assert msg.properties.content_type == "text/plain"
    assert msg.properties.correlation_data == b"c"


def test_limit_is_read_from_connack(clients: Callable[..., Client]) -> None:
    assert clients().max_packet_size == 262144


def test_oversized_without_endpoint_is_chunked_and_arrives_byte_exact(
    clients: Callable[..., Client], unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_topic("chunked")
    payload = os.urandom(3 * 256 * KiB + 12345)
    source = tmp_path / "big.bin"
    source.write_bytes(payload)
    sub, pub = clients(), clients()
    sub.subscribe(topic)
    props = PublishProperties(
        content_type="application/octet-stream", user_properties=(("k", "v"),)
    )
    result = pub.publish(topic, source, qos=1, properties=props)
    assert result.route is Route.CHUNKED
    assert result.packets == 4
    msg = _message(sub)
    assert msg.route is Route.CHUNKED
    assert msg.payload == payload
    assert msg.sha256 == hashlib.sha256(payload).hexdigest() == result.sha256
    assert msg.properties.user_properties == (("k", "v"),)
    assert msg.properties.content_type == "application/octet-stream"
    assert msg.message_id == result.message_id


def test_chunking_disabled_raises_message_too_large(
    clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("toolarge")
    pub = clients(chunking=False)
    with pytest.raises(MessageTooLarge) as info:
        pub.publish(topic, b"x" * 300 * KiB)
    expected = publish_packet_size(topic, 300 * KiB, qos=0, properties=None)
    assert info.value.size == expected
    assert info.value.limit == 262144
    # The connection is still usable: nothing oversized was sent.
    assert pub.publish(topic, b"ok").route is Route.DIRECT


def test_exact_fit_goes_direct_one_more_byte_chunks(
    clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    from client.protocol._size import max_payload

    topic = unique_topic("edge")
    sub, pub = clients(), clients()
    sub.subscribe(topic)
    biggest = max_payload(topic, qos=1, properties=None, limit=262144)
    assert pub.publish(topic, b"a" * biggest, qos=1).route is Route.DIRECT
    assert pub.publish(topic, b"b" * (biggest + 1), qos=1).route is Route.CHUNKED
    assert _message(sub).payload == b"a" * biggest
    assert _message(sub).payload == b"b" * (biggest + 1)


def test_limit_re_read_after_broker_restart_with_another_limit(
    mosquitto_factory: Callable[..., Mosquitto], unique_topic: Callable[[str], str]
) -> None:
    server = mosquitto_factory(max_packet_size=262144)
    client = Client(server.url, discovery_wait=0.1)
    client.connect()
    try:
        assert client.max_packet_size == 262144
        server.stop()
        server.max_packet_size = 65536
        server.start()  # same port
        deadline = time.monotonic() + 20
        while client.max_packet_size != 65536 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.max_packet_size == 65536
        assert client.connection.wait_connected(10)
        topic = unique_topic("restart")
        client.subscribe(topic)
        result = client.publish(topic, os.urandom(100 * KiB), qos=1)
        assert result.route is Route.CHUNKED
        assert _message(client).size == 100 * KiB
    finally:
        client.close()


def test_configured_limit_applies_when_connack_has_none(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
) -> None:
    server = mosquitto_factory()  # no max_packet_size: CONNACK states none
    client = Client(server.url, max_packet_size=10000, discovery_wait=0.1)
    client.connect()
    try:
        assert client.max_packet_size == 10000
        topic = unique_topic("cfg")
        client.subscribe(topic)
        assert client.publish(topic, b"z" * 20000, qos=1).route is Route.CHUNKED
        assert _message(client).payload == b"z" * 20000
    finally:
        client.close()


def _retain_record(broker: Mosquitto, topic: str, payload: str, expiry: int | None) -> None:
    args = ["mosquitto_pub", "-p", str(broker.port), "-t", topic, "-r", "-V", "5", "-q", "1"]
    if expiry is not None:
        args += ["-D", "publish", "message-expiry-interval", str(expiry)]
    if payload:
        args += ["-m", payload]
    else:
        args += ["-n"]
    subprocess.run(args, check=True, timeout=10)


def test_discovery_record_is_resolved_with_expiry(
    broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("disc")
    record = json.dumps({"LargeMessageUploadEndpoint": "http://127.0.0.1:9/x/"})
    _retain_record(broker, topic, record, expiry=2)
    client = Client(broker.url, discovery_topic=topic)
    client.connect()
    try:
        assert client.wait_for_endpoint(5) == "http://127.0.0.1:9/x"
        assert client.discovery_record is not None
        time.sleep(2.2)
        assert client.endpoint is None  # expired locally, as the broker would have
    finally:
        client.close()
        _retain_record(broker, topic, "", None)


def test_a_publish_right_after_connect_waits_for_the_discovery_record(
    gateway: GatewayServer, unique_topic: Callable[[str], str]
) -> None:
    """connect() returns once the connection's callbacks have run, the discovery wait's
    start among them: before, a publish on the heels of connect() could find the wait not
    yet started, see no endpoint and chunk (a CI run, and `offload publish` at any time)."""
    broker: Mosquitto = gateway.broker  # type: ignore[attr-defined]
    conn = MqttConnection(BrokerUrl.parse(broker.url))
    conn.on_connected(lambda: time.sleep(0.5))  # paho's thread is slow to reach the client's
    with Client(connection=conn, discovery_wait=10) as client:
        result = client.publish(unique_topic("early"), os.urandom(300 * KiB), qos=1)
    assert result.route is Route.OFFLOADED, result


def test_malformed_record_means_no_offload(
    clients: Callable[..., Client],
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    disc = unique_topic("disc")
    _retain_record(broker, disc, '{"LargeMessageUploadEndpoint": 42}', expiry=60)
    topic = unique_topic("data")
    pub = clients(discovery_topic=disc, discovery_wait=2.0)
    sub = clients()
    sub.subscribe(topic)
    result = pub.publish(topic, b"q" * 300 * KiB, qos=1)
    assert result.route is Route.CHUNKED
    assert pub.endpoint is None
    assert "malformed discovery record" in caplog.text
    assert _message(sub).size == 300 * KiB
    _retain_record(broker, disc, "", None)


def test_publish_from_inside_the_message_loop(
    clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    ping, pong = unique_topic("ping"), unique_topic("pong")
    echo, driver = clients(), clients()
    echo.subscribe(ping, qos=1)
    driver.subscribe(pong, qos=1)
    for i in range(3):
        driver.publish(ping, f"{i}".encode() * (100 * KiB), qos=1)  # chunked
    for seen, item in enumerate(echo.messages(timeout=10), start=1):
        assert isinstance(item, Message)
        # QoS 1 publishes (direct and chunked) from the consumer's loop: must not deadlock.
        echo.publish(pong, item.payload[:10], qos=1)
        echo.publish(pong, item.payload + b"!", qos=1)
        if seen == 3:
            break
    got = [_message(driver).payload for _ in range(6)]
    assert got[0::2] == [f"{i}".encode() * 10 for i in range(3)]
    assert got[1::2] == [f"{i}".encode() * (100 * KiB) + b"!" for i in range(3)]


def test_out_of_order_chunks_with_duplicate_and_bad_checksum(
    clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("ooo")
    sub = clients()
    sub.subscribe(topic, qos=1)
    payload = os.urandom(500_000)
    chunks = split(payload, topic=topic, qos=1, properties=None, limit=65536)
    raw = clients()
    order = [*reversed(chunks), chunks[1]]
    for props, data in order:
        raw.connection.publish(topic, data, qos=1, properties=props).result(10)
    msg = _message(sub)
    assert msg.payload == payload and msg.route is Route.CHUNKED
    assert sub.next_message(0.5) is None  # the duplicate delivered nothing

    bad = split(b"x" * 200_000, topic=topic, qos=1, properties=None, limit=65536)
    first_props, first_data = bad[0]
    value = first_props.user_property("__chunk")
    assert value is not None
    tampered = value[:-64] + "0" * 64
    first_props = first_props.without_user_properties("__chunk").with_user_properties(
        ("__chunk", tampered)
    )
    for props, data in [(first_props, first_data), *bad[1:]]:
        raw.connection.publish(topic, data, qos=1, properties=props).result(10)
    err = _one(sub)
    assert isinstance(err, MessageError)
    assert "checksum mismatch" in str(err.error)


def test_missing_chunk_times_out_as_error(
    clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("timeout")
    sub = clients(chunk_timeout=1.0)
    sub.subscribe(topic, qos=1)
    chunks = split(b"y" * 200_000, topic=topic, qos=1, properties=None, limit=65536)
    raw = clients()
    for props, data in chunks[:-1]:
        raw.connection.publish(topic, data, qos=1, properties=props).result(10)
    err = _one(sub, timeout=5)
    assert isinstance(err, MessageError)
    assert isinstance(err.error, ChunkTimeoutError)


def test_mqtt_311_direct_and_too_large(
    mosquitto_factory: Callable[..., Mosquitto], unique_topic: Callable[[str], str]
) -> None:
    server = mosquitto_factory(max_packet_size=65536)
    client = Client(server.url, protocol=4, max_packet_size=65536, discovery_wait=0.1)
    client.connect()
    try:
        topic = unique_topic("v311")
        client.subscribe(topic)
        assert client.publish(topic, b"small", qos=1).route is Route.DIRECT
        assert _message(client).payload == b"small"
        # Chunking needs MQTT 5 user properties; without an endpoint it cannot be sent.
        with pytest.raises(MessageTooLarge):
            client.publish(topic, b"x" * 70000, qos=1)
    finally:
        client.close()
