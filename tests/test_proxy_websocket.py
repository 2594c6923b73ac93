"""MQTT over WebSocket into offload-proxy (`ws_port`): mqtt.js in Node (20 MiB) and plain
paho with `transport="websockets"`, unmodified, across a 256 KiB mosquitto; what the
listener refuses; `offload-proxy --ws-port`. Real mosquitto, gateway, SeaweedFS."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from test_proxy import MiB, PahoPeer, start_proxy
from test_proxy_mqttjs import _node, mqtt_js  # noqa: F401 - the fixture
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from _gateway import GatewayServer
from _proxy import ProxyServer
from _servers import Mosquitto, free_port, wait_for_port, wait_until

pytestmark = pytest.mark.servers


@pytest.fixture
def ws_proxy(gateway: GatewayServer, broker: Mosquitto) -> Iterator[ProxyServer]:
    server = start_proxy(broker, gateway, ws_port=0)
    yield server
    server.stop()


def _ws_url(server: ProxyServer) -> str:
    return f"ws://127.0.0.1:{server.proxy.ws_port}/mqtt"


@pytest.mark.parametrize("version", ["5", "4"])
def test_mqtt_js_over_websocket_20mib_through_the_proxy(
    ws_proxy: ProxyServer,
    mqtt_js: Path,  # noqa: F811
    tmp_path: Path,
    unique_topic: Callable[[str], str],
    version: str,
) -> None:
    topic = unique_topic("mqttjs-ws")
    data = os.urandom(20 * MiB)
    (tmp_path / "big.bin").write_bytes(data)
    sub = _node(mqtt_js, "sub", _ws_url(ws_proxy), topic, version)
    assert sub.stdout is not None
    assert sub.stdout.readline().strip() == "ready"
    pub = _node(mqtt_js, "pub", _ws_url(ws_proxy), topic, str(tmp_path / "big.bin"), version, "1")
    _, err = pub.communicate(timeout=120)
    assert pub.returncode == 0, err
    out, err = sub.communicate(timeout=120)
    assert sub.returncode == 0, (out, err)
    assert json.loads(out) == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert ws_proxy.metric("offload_proxy_offloaded_total") == 1
    assert ws_proxy.metric("offload_proxy_resolved_total") == 1


def test_paho_over_websocket_publishes_over_the_limit_in_one_frame(
    ws_proxy: ProxyServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("paho-ws")
    sub = PahoPeer(ws_proxy.port)  # plain TCP through the same proxy
    sub.subscribe(broker, topic)
    pub = paho.Client(
        CallbackAPIVersion.VERSION2,
        f"paho-ws-{uuid.uuid4().hex[:8]}",
        protocol=paho.MQTTv5,
        transport="websockets",
    )
    pub.ws_set_options(path="/mqtt")
    pub.connect("127.0.0.1", ws_proxy.proxy.ws_port, keepalive=30)
    pub.loop_start()
    try:
        wait_until(pub.is_connected, "paho connected over WebSocket", 20)
        # paho sends the whole packet as one WebSocket frame, masked byte by byte in Python
        # (20 MiB take it minutes): 3 MiB are over the broker's limit all the same.
        data = os.urandom(3 * MiB)
        pub.publish(topic, data, qos=1).wait_for_publish(120)
        (message,) = sub.wait(1)
        assert message.payload == data
        assert ws_proxy.metric("offload_proxy_offloaded_total") == 1
    finally:
        pub.disconnect()
        pub.loop_stop()
        sub.close()


def test_the_listener_refuses_what_is_not_mqtt_over_websocket(ws_proxy: ProxyServer) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(_ws_url(ws_proxy), open_timeout=20).close()  # no "mqtt" subprotocol
    assert refused.value.response.status_code == 400
    mqtt: Any = "mqtt"  # websockets types subprotocols as its own Subprotocol
    with connect(_ws_url(ws_proxy), subprotocols=[mqtt], open_timeout=20) as ws:
        assert ws.subprotocol == "mqtt"
        ws.send("CONNECT")  # text: MQTT over WebSocket is binary
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=20)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1003


def test_the_ws_port_flag_opens_the_websocket_listener(
    gateway: GatewayServer, broker: Mosquitto, tmp_path: Path
) -> None:
    port, ws_port = free_port(), free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        "OFFLOAD_PROXY_BROKER": broker.url,
        "OFFLOAD_PROXY_ENDPOINT": gateway.url,
        "OFFLOAD_PROXY_PORT": str(port),
    }
    log = tmp_path / "proxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "--ws-port", str(ws_port)],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        f"paho-ws-flag-{uuid.uuid4().hex[:8]}",
        protocol=paho.MQTTv5,
        transport="websockets",
    )
    try:
        wait_for_port(ws_port, 30, proc, log)
        client.ws_set_options(path="/mqtt")
        client.connect("127.0.0.1", ws_port, keepalive=30)
        client.loop_start()
        wait_until(client.is_connected, "paho connected over WebSocket to --ws-port", 20)
    finally:
        client.disconnect()
        client.loop_stop()
        proc.terminate()
        proc.wait(30)


def test_the_messages_one_read_brings_are_read_as_one_piece() -> None:
    """A client sends a WebSocket message per MQTT packet: what one socket read brings is
    handed on as one piece (up to the read's size), so the relay passes its packets as one
    run; what comes later is the next piece."""
    import asyncio

    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, BytesMessage, Request

    from proxy._websocket import WebSocketReader

    client, server = WSConnection(ConnectionType.CLIENT), WSConnection(ConnectionType.SERVER)
    server.receive_data(client.send(Request(host="proxy", target="/mqtt", subprotocols=["mqtt"])))
    next(server.events())
    client.receive_data(server.send(AcceptConnection(subprotocol="mqtt")))
    packets = [bytes([0x30, 4, 0, 1, 0x74, i]) for i in range(10)]
    frames = b"".join(client.send(BytesMessage(data=p)) for p in packets)

    async def read() -> list[bytes]:
        raw = asyncio.StreamReader()
        reader = WebSocketReader(server, raw, None)  # type: ignore[arg-type]: no pings here
        raw.feed_data(frames)
        first = await reader.read(1 << 18)
        raw.feed_data(client.send(BytesMessage(data=b"\xc0\x00")))
        return [first, await reader.read(1 << 18)]

    assert asyncio.run(read()) == [b"".join(packets), b"\xc0\x00"]
