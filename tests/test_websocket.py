"""MQTT over WebSocket: `ws://` broker URLs with a path and headers, through a real WebSocket
server in front of mosquitto (tests/_wsbridge.py says why not mosquitto's own)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from client import BrokerUrl, Client, ConfigError, ConnectionFailed, Message, Route

from _gateway import GatewayServer
from _servers import Mosquitto
from _wsbridge import WebSocketBridge

pytestmark = pytest.mark.servers


@pytest.fixture
def bridge(gateway: GatewayServer) -> Iterator[WebSocketBridge]:
    broker: Mosquitto = gateway.broker  # type: ignore[attr-defined]
    server = WebSocketBridge(
        broker.port, path="/mqtt/edge", required_header=("X-Edge-Token", "t0k")
    ).start()
    yield server
    server.close()


def test_offloaded_message_published_and_received_over_websocket(
    gateway: GatewayServer, bridge: WebSocketBridge, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("ws")
    payload = os.urandom(600 * 1024)  # over the broker's 256 KiB
    ws = {"websocket_headers": ("X-Edge-Token: t0k",), "discovery_wait": 10.0}
    with Client(bridge.url, **ws) as consumer, Client(bridge.url, **ws) as producer:  # type: ignore[arg-type]
        assert consumer.wait_for_endpoint(30) == gateway.url  # discovery came over ws too
        consumer.subscribe(topic, qos=1)
        result = producer.publish(topic, payload, qos=1)
        assert result.route is Route.OFFLOADED
        got = consumer.next_message(timeout=30)
        small = producer.publish(topic, b"direct over ws", qos=1)
        assert small.route is Route.DIRECT
        direct = consumer.next_message(timeout=30)
    assert isinstance(got, Message) and got.payload == payload
    assert isinstance(direct, Message) and direct.payload == b"direct over ws"
    # Every upgrade request went to the path with the header and the mqtt subprotocol.
    assert bridge.seen_headers
    for headers in bridge.seen_headers:
        assert headers["x-edge-token"] == "t0k"
        assert "mqtt" in headers["sec-websocket-protocol"]


def test_websocket_upgrade_refused_is_a_connection_failure(bridge: WebSocketBridge) -> None:
    client = Client(bridge.url, discovery_wait=0)  # no header: the edge answers 401
    with pytest.raises(ConnectionFailed):
        client.connect(timeout=5)
    client.close()


@pytest.mark.parametrize(
    ("url", "tls", "port", "path"),
    [
        ("ws://b.example/mqtt", False, 80, "/mqtt"),
        ("ws://b.example:8080", False, 8080, "/mqtt"),  # the usual path when none is named
        ("wss://b.example/edge/mqtt?x-amz=1", True, 443, "/edge/mqtt?x-amz=1"),
        ("mqtts://b.example", True, 8883, None),
    ],
)
def test_broker_urls(url: str, tls: bool, port: int, path: str | None) -> None:
    parsed = BrokerUrl.parse(url)
    assert (parsed.tls, parsed.port, parsed.ws_path) == (tls, port, path)
    assert "x-amz" not in str(parsed)  # a query may carry a signature: not in log lines


@pytest.mark.parametrize(
    "kw",
    [
        {"broker": "mqtt://b.example/some/path"},  # a path only means something over ws
        {"broker": "ws://b.example/a b"},
        {"websocket_headers": ("NoColon",)},
        {"websocket_headers": ("X-A: 1\r\nX-Injected: 2",)},
        {"websocket_headers": ("Sec-WebSocket-Key: x",)},
    ],
)
def test_bad_websocket_settings_are_config_errors(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Client(**kw)  # type: ignore[arg-type]
