"""Nothing an uploader sends can cut the gateway off from the broker (real mosquitto).

A PUBLISH property with a control character makes mosquitto drop the connection; paho
used to resend that QoS 1 PUBLISH on every reconnect, so one upload wedged the link for good.
Every route now refuses such values with 400 before anything is stored, and the broker link
fails (never resends) whatever was unacknowledged when the broker hung up.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import uuid
from collections.abc import Callable

import bson
import httpx
import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from client.protocol import PublishProperties

from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

TUS = {"Tus-Resumable": "1.0.0"}


class Sub:
    """`mosquitto_sub -V 5` printing JSON: a subscriber that knows nothing of offload."""

    def __init__(self, broker: Mosquitto, topic: str) -> None:
        self.proc = subprocess.Popen(
            ["mosquitto_sub", "-V", "5", "-p", str(broker.port), "-h", "127.0.0.1",
             "-t", topic, "-F", "%j", "-C", "1", "-W", "40", "-q", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        time.sleep(0.5)  # no "subscribed" signal from mosquitto_sub

    def message(self) -> dict[str, object]:
        out, err = self.proc.communicate(timeout=50)
        assert self.proc.returncode == 0, err.decode()
        doc: dict[str, object] = json.loads(out)
        return doc


def _meta(**items: str) -> str:
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" for k, v in items.items())


def _ready(gw: GatewayServer) -> bool:
    r = httpx.get(f"{gw.url}/readyz", timeout=10)
    return r.status_code == 200 and r.json()["checks"]["broker"] == "ok"


def _objects(gw: GatewayServer, prefix: str) -> list[str]:
    from gateway._app import build_store

    return [o.key for o in build_store(gw.settings).list(prefix)]


def _assert_still_publishing(gw: GatewayServer, broker: Mosquitto, topic: str) -> None:
    """The link is up and a later publish reaches a plain subscriber."""
    assert _ready(gw)
    sub = Sub(broker, topic)
    r = httpx.post(f"{gw.url}/publish/{topic}", content=b"after", timeout=30)
    assert r.status_code == 201, r.text
    assert json.loads(str(sub.message()["payload"]))["sha256"] == r.json()["sha256"]


def test_control_characters_for_the_publish_are_400_and_the_link_survives(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
) -> None:
    gw = gateway_factory(broker)
    topic = unique_topic("wedge")
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        # tus metadata: the content type and a user property carry CR/LF.
        for meta in (
            _meta(topic=topic, content_type="text/plain\r\nX-Evil: 1"),
            _meta(topic=topic, filetype="text/plain\n"),
            _meta(topic=topic, **{"prop.note": "line one\r\nline two"}),
            _meta(topic=topic, **{"prop.a\tb": "v"}),
        ):
            r = http.post("/uploads/", headers={**TUS, "Upload-Length": "5",
                                                "Upload-Metadata": meta})  # fmt: skip
            assert r.status_code == 400, (meta, r.text)
        # /publish: HTTP allows HTAB and obs-text (bytes 0x80-0xFF, C1 controls once decoded)
        # inside a header value; mosquitto refuses both in a Content Type property.
        for content_type in (b"text/plain;\tcharset=utf-8", b"text/plain\x85", b"a/b\x7f"):
            r = http.post(f"/publish/{topic}", content=b"x",
                          headers={"Content-Type": content_type})  # fmt: skip
            assert r.status_code == 400, (content_type, r.text)
            # uvicorn's parser refuses some of them itself (plain-text 400), the rest we do.
            if r.headers["content-type"] == "application/json":
                assert "Content-Type" in r.json()["detail"]
        for prop in ("note:one\r\ntwo", "a\x00b:c", "k:\ufffe", "k:\x85"):
            r = http.post(f"/publish/{topic}", params={"prop": prop}, content=b"x")
            assert r.status_code == 400, (prop[:20], r.text)
        r = http.post(f"/publish/{topic}", content=b"x", headers={"X-Offload-Property": "a:b\tc"})
        assert r.status_code == 400
        # hop BSON through /publish: a text header becomes a user property.
        for headers in ([["note", b"one\r\ntwo"]], [["bad\nname", b"v"]]):
            doc = bson.encode({"message": b"payload", "headers": headers})
            r = http.post(f"/publish/{topic}", content=doc,
                          headers={"Content-Type": "application/bson"})  # fmt: skip
            assert r.status_code == 400, r.text
            assert "user property" in r.json()["detail"]
    # Refused before storing (or removed at once): no payload, no upload state.
    assert _objects(gw, f"data/{topic}") == []
    assert _objects(gw, "ids/") == []
    assert _objects(gw, "uploads/") == []
    _assert_still_publishing(gw, broker, topic)


def test_a_binary_hop_header_is_kept_but_not_published(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
) -> None:
    """Not UTF-8 at all: no user-property form, so it stays in the stored message only."""
    gw = gateway_factory(broker)
    topic = unique_topic("binary")
    sub = Sub(broker, topic)
    doc = bson.encode({"message": b"payload", "headers": [["blob", b"\xff\xfe\x00"],
                                                          ["note", b"fine"]]})  # fmt: skip
    r = httpx.post(f"{gw.url}/publish/{topic}", content=doc,
                   headers={"Content-Type": "application/bson"})  # fmt: skip
    assert r.status_code == 201, r.text
    props = sub.message()["properties"]
    assert isinstance(props, dict)
    pairs = json.dumps(props.get("user-properties"))
    assert '"note"' in pairs and '"blob"' not in pairs
    stored = bson.decode(httpx.get(f"{gw.url}/msg/{r.json()['id']}").content)
    assert [v for k, v in stored["metadata"]["headers"] if k == "blob"] == [b"\xff\xfe\x00"]


def test_a_publish_the_broker_refuses_is_failed_not_resent(broker: Mosquitto) -> None:
    """Force what validation now prevents: mosquitto disconnects, the link recovers."""
    from gateway.core._mqtt import broker_link
    from gateway.core._settings import Settings

    conn = broker_link(Settings(mqtt_url=broker.url))
    assert conn is not None
    conn.start()
    try:
        assert conn.wait_connected(10)
        disconnects: list[object] = []
        conn._paho.on_disconnect = _counting(conn._paho.on_disconnect, disconnects)
        bad = Properties(PacketTypes.PUBLISH)
        bad.ContentType = "text/plain\r\nX: 1"  # what tus metadata used to smuggle in
        # Straight to paho, past MqttConnection.publish and its validation.
        info = conn._paho.publish("wedge/raw", b"x", qos=1, properties=bad)
        with pytest.raises(RuntimeError):
            info.wait_for_publish(timeout=20)  # failed by the disconnect, not left waiting
        assert info.rc == paho.MQTT_ERR_CONN_LOST
        assert "malformed" in broker.log().lower() or disconnects
        assert conn.wait_connected(20)
        topic = f"wedge/after/{uuid.uuid4().hex}"
        sub = Sub(broker, topic)
        conn.publish(topic, b"hello", qos=1).result(timeout=30)  # acknowledged: link works
        assert sub.message()["payload"] == "hello"
        assert len(disconnects) == 1  # the bad PUBLISH was not sent again after reconnect
        # And MqttConnection.publish itself refuses it before queueing.
        refused = conn.publish("wedge/raw", b"x", properties=_props("a\nb"))
        with pytest.raises(ValueError, match="content type"):
            refused.result(timeout=5)
        assert conn.connected
    finally:
        conn.close()


def _props(content_type: str) -> PublishProperties:
    return PublishProperties(content_type=content_type)


def _counting(inner: Callable[..., None], seen: list[object]) -> Callable[..., None]:
    def on_disconnect(*args: object) -> None:
        seen.append(args[3])
        inner(*args)

    return on_disconnect
