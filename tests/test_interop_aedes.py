"""The core end-to-end flows against a second broker implementation: aedes 2 (Node), over
TCP and over the WebSocket listener it serves itself, stating mosquitto's 256 KiB limit.

Covered per transport with MQTT 3.1.1: a direct message, an offloaded 1 MiB message, a
retained offloaded placeholder for a late subscriber, and a persistent session (Clean Session
0) that is away while 20 offloaded messages are published. With MQTT 5: the CONNACK's limit
and a 1 MiB message in ADR-23 chunks across it. The chunked tests with persistent sessions
(tests/test_session_chunks.py) run against aedes too; Receive Maximum, which aedes does not
enforce on what it sends, is covered against mosquitto only.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable, Iterator

import pytest

from client import Client, Message, Route

from _aedes import Aedes
from _gateway import GatewayServer

pytestmark = pytest.mark.servers

LIMIT = 256 * 1024  # 3.1.1 states no limit: the clients are told the broker's


@pytest.fixture(scope="module")
def aedes() -> Iterator[Aedes]:
    broker = Aedes(max_packet_size=LIMIT).start()
    yield broker
    broker.stop()


@pytest.fixture(params=["tcp", "ws"])
def broker_url(request: pytest.FixtureRequest, aedes: Aedes) -> str:
    return aedes.url if request.param == "tcp" else aedes.ws_url


@pytest.fixture
def plain_gateway(gateway_factory: Callable[..., GatewayServer]) -> GatewayServer:
    return gateway_factory(None)  # its broker link speaks MQTT 5: clients get the endpoint


def _client(url: str, gateway: GatewayServer, **kw: object) -> Client:
    return Client(url, protocol=4, max_packet_size=LIMIT, endpoint=gateway.url, **kw)  # type: ignore[arg-type]


def test_direct_offloaded_and_retained(
    broker_url: str, plain_gateway: GatewayServer, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("aedes")
    big = os.urandom(1024 * 1024)
    with (
        _client(broker_url, plain_gateway) as consumer,
        _client(broker_url, plain_gateway) as producer,
    ):
        consumer.subscribe(topic, qos=1)
        assert producer.publish(topic, b"small", qos=1).route is Route.DIRECT
        assert producer.publish(topic, big, qos=1).route is Route.OFFLOADED
        first = consumer.next_message(timeout=30)
        second = consumer.next_message(timeout=30)
        retained = producer.publish(f"{topic}/r", big, qos=1, retain=True)
        assert retained.route is Route.OFFLOADED
    assert isinstance(first, Message) and first.payload == b"small"
    assert isinstance(second, Message) and second.payload == big
    assert second.route is Route.OFFLOADED
    with _client(broker_url, plain_gateway) as late:
        late.subscribe(f"{topic}/r", qos=1)
        got = late.next_message(timeout=30)
    assert isinstance(got, Message) and got.retain and got.payload == big


def test_persistent_session_while_away(
    broker_url: str, plain_gateway: GatewayServer, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("aedes/sess")
    client_id = f"c-{uuid.uuid4().hex[:8]}"
    session = {"client_id": client_id, "session_expiry": 3600}
    with _client(broker_url, plain_gateway, **session) as consumer:
        consumer.subscribe(topic, qos=1)
    payloads = {}
    with _client(broker_url, plain_gateway, offload_threshold=1024) as producer:
        for _ in range(20):
            data = os.urandom(4096)
            payloads[hashlib.sha256(data).hexdigest()] = data
            assert producer.publish(topic, data, qos=1).route is Route.OFFLOADED
    got: dict[str, bytes] = {}
    with _client(broker_url, plain_gateway, **session) as consumer:
        assert consumer.connection.session_present
        while got.keys() != payloads.keys():
            item = consumer.next_message(timeout=30)
            assert isinstance(item, Message), item
            got[item.sha256] = item.payload
    assert got == payloads


def test_mqtt5_chunks_cross_aedes(broker_url: str, unique_topic: Callable[[str], str]) -> None:
    """No gateway: a 1 MiB message goes in ADR-23 chunks sized to aedes's CONNACK limit."""
    topic = unique_topic("aedes/chunks")
    big = os.urandom(1024 * 1024)
    with (
        Client(broker_url, discovery_wait=0) as consumer,
        Client(broker_url, discovery_wait=0) as producer,
    ):
        assert producer.max_packet_size == LIMIT  # MQTT 5: stated by aedes's CONNACK
        consumer.subscribe(topic, qos=1)
        sent = producer.publish(topic, big, qos=1)
        assert sent.route is Route.CHUNKED and sent.packets is not None and sent.packets > 4
        got = consumer.next_message(timeout=30)
    assert isinstance(got, Message) and got.route is Route.CHUNKED
    assert got.payload == big and got.message_id == sent.message_id
