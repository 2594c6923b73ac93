"""Offload end to end: client -> real gateway (SeaweedFS) -> placeholder -> fetching client."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Generator
from pathlib import Path

import httpx
import pytest
from minio import Minio

from client import (
    AsyncClient,
    Client,
    Message,
    MessageError,
    PayloadChecksumMismatch,
    PayloadNotFound,
    PublishProperties,
    Route,
    UntrustedEndpoint,
)
from client.protocol import MessageId, Placeholder

from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers

MiB = 1024 * 1024


class RecordingAuth(httpx.Auth):
    """A real httpx auth flow that adds a header and remembers where it was used."""

    def __init__(self) -> None:
        self.urls: list[str] = []

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        self.urls.append(str(request.url))
        request.headers["Authorization"] = "Bearer test-token"
        yield request


def _next(client: Client, timeout: float = 30.0) -> Message | MessageError:
    item = client.next_message(timeout)
    assert item is not None, "nothing delivered in time"
    return item


def test_20_mib_crosses_a_256_kib_broker_as_a_placeholder(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    broker: Mosquitto = gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("big")
    payload = os.urandom(20 * MiB)
    source = tmp_path / "big.bin"
    source.write_bytes(payload)
    raw = subprocess.Popen(
        ["mosquitto_sub", "-p", str(broker.port), "-V", "5", "-t", topic, "-C", "1",
         "-W", "60", "-F", "%P\t%p"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    spool = tmp_path / "spool"
    spool.mkdir()
    sub = clients(spool_threshold=1 * MiB, spool_dir=str(spool))
    sub.subscribe(topic)
    pub = clients()
    assert pub.wait_for_endpoint(10) == gateway.url
    props = PublishProperties(
        content_type="application/x-test",
        user_properties=(("origin", "test"),),
        message_expiry_interval=600,
        response_topic="reply/here",
        correlation_data=b"corr",
    )
    result = pub.publish(topic, source, qos=1, properties=props)
    assert result.route is Route.OFFLOADED
    assert result.url == f"{gateway.url}/msg/{result.message_id}"
    assert result.sha256 == hashlib.sha256(payload).hexdigest()

    msg = _next(sub)
    assert isinstance(msg, Message), msg
    assert msg.route is Route.OFFLOADED
    assert msg.size == 20 * MiB
    assert msg.body.path is not None  # spooled to disk above the threshold
    assert msg.body.path.parent == spool  # in `spool_dir`
    assert msg.payload == payload
    assert msg.sha256 == result.sha256
    assert msg.message_id == result.message_id
    assert msg.properties.user_properties == (("origin", "test"),)
    assert msg.properties.content_type == "application/x-test"
    assert msg.properties.response_topic == "reply/here"
    assert msg.properties.correlation_data == b"corr"
    assert msg.properties.message_expiry_interval is not None

    out, _ = raw.communicate(timeout=60)
    user_props, _, body = out.partition(b"\t")
    assert len(out) < 1024
    assert b"_format" in user_props and b"external" in user_props
    ref = json.loads(body)
    assert ref == {
        "_format": "external",  # in the body too: 3.1.1 subscribers see no user properties
        "_id": result.message_id,
        "url": result.url,
        "size": 20 * MiB,
        "sha256": result.sha256,
    }
    # mosquitto logs "disconnected due to protocol error" for an oversize packet.
    assert "due to" not in broker.log()
    assert "dropping" not in broker.log().lower()


def _publish_placeholder(client: Client, topic: str, ref: Placeholder) -> None:
    body, props = ref.encode(None)
    client.connection.publish(topic, body, qos=1, properties=props).result(10)


def test_a_topic_beyond_ascii_is_offloaded_and_fetched(
    clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    """The gateway answers the fetch with `X-Offload-Topic` in UTF-8 bytes; the client's
    reader refused that header (UnicodeEncodeError), so no such message was ever delivered."""
    topic = unique_topic("uni") + "/€-ü"
    sub = clients()
    sub.subscribe(topic)
    pub = clients()
    payload = os.urandom(300 * 1024)
    assert pub.publish(topic, payload, qos=1).route is Route.OFFLOADED
    msg = _next(sub)
    assert isinstance(msg, Message), msg
    assert msg.topic == topic and msg.payload == payload


def test_missing_object_is_payload_not_found(
    gateway: GatewayServer, clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("missing")
    sub = clients()
    sub.subscribe(topic)
    mid = MessageId.new()
    ref = Placeholder(f"{gateway.url}/msg/{mid}", 10, "0" * 64, mid)
    _publish_placeholder(clients(), topic, ref)
    err = _next(sub)
    assert isinstance(err, MessageError)
    assert isinstance(err.error, PayloadNotFound)
    assert err.error.status == 404
    assert err.message_id == str(mid)


def test_tampered_checksum_is_never_delivered(
    gateway: GatewayServer, clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("tamper")
    sub = clients()
    sub.subscribe(topic)
    pub = clients(offload_threshold=10)  # offload even a small payload
    result = pub.publish(topic, b"genuine payload bytes", qos=1)
    assert result.route is Route.OFFLOADED
    good = _next(sub)
    assert isinstance(good, Message) and good.payload == b"genuine payload bytes"
    assert result.url is not None and result.message_id is not None
    wrong = hashlib.sha256(b"something else").hexdigest()
    ref = Placeholder(result.url, result.size, wrong, MessageId.parse(result.message_id))
    _publish_placeholder(pub, topic, ref)
    err = _next(sub)
    assert isinstance(err, MessageError)
    assert isinstance(err.error, PayloadChecksumMismatch)
    assert err.error.expected == wrong and err.error.actual == result.sha256


def test_gateway_down_falls_back_to_chunking(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = unique_topic("fallback")
    sub = clients()
    sub.subscribe(topic)
    pub = clients()
    assert pub.wait_for_endpoint(10) == gateway.url
    gateway.stop()  # the retained record is still there: the upload is refused
    payload = os.urandom(1 * MiB)
    result = pub.publish(topic, payload, qos=1)
    assert result.route is Route.CHUNKED
    assert "falling back to chunking" in caplog.text
    msg = _next(sub)
    assert isinstance(msg, Message) and msg.payload == payload and msg.route is Route.CHUNKED


def test_credentials_only_go_to_the_advertised_endpoint(
    gateway: GatewayServer,
    gateway_factory: Callable[..., GatewayServer],
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
) -> None:
    other = gateway_factory(None)  # same storage, but not what the broker advertises
    topic = unique_topic("creds")
    auth = RecordingAuth()
    sub = clients(http_auth=auth)
    sub.subscribe(topic)
    pub = clients(offload_threshold=1)
    result = pub.publish(topic, b"payload-1", qos=1)
    assert isinstance(_next(sub), Message)
    assert auth.urls == [f"{result.url}/payload"]

    assert result.url is not None and result.message_id is not None
    foreign = result.url.replace(gateway.url, other.url)
    ref = Placeholder(foreign, result.size, result.sha256, MessageId.parse(result.message_id))
    # By default a foreign origin is refused, and the error says what would allow it.
    _publish_placeholder(pub, topic, ref)
    err = _next(sub)
    assert isinstance(err, MessageError) and isinstance(err.error, UntrustedEndpoint)
    assert "discovery_allowlist" in str(err.error)
    assert "untrusted_endpoint=anonymous" in str(err.error)

    # Opted in by name: fetched, but without the credentials.
    anonymous = clients(untrusted_endpoint="anonymous", http_auth=auth)
    anonymous.subscribe(topic)
    allowlisted = clients(discovery_allowlist=(gateway.url, other.url), http_auth=auth)
    allowlisted.subscribe(topic)
    _publish_placeholder(pub, topic, ref)
    for receiver in (anonymous, allowlisted):
        msg = _next(receiver)
        assert isinstance(msg, Message) and msg.payload == b"payload-1"
    again = _next(sub)  # the strict one refused it again, naming it
    assert isinstance(again, MessageError) and isinstance(again.error, UntrustedEndpoint), again
    assert again.message_id == result.message_id
    assert len(auth.urls) == 1  # neither sent credentials to the other origin


def test_mqtt_311_placeholder_carries_its_tag(
    gateway: GatewayServer, clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("v311")
    raw5 = clients(fetch_external=False)
    raw5.subscribe(topic)
    sub311 = clients(protocol=4)
    sub311.subscribe(topic)
    pub = clients(protocol=4, max_packet_size=262144)  # 3.1.1 CONNACK states no limit
    payload = os.urandom(300 * 1024)
    result = pub.publish(topic, payload, qos=1)
    assert result.route is Route.OFFLOADED
    seen = _next(raw5)
    assert isinstance(seen, Message)
    doc = json.loads(seen.payload)
    assert doc["_format"] == "external" and doc["_id"] == result.message_id
    got = _next(sub311)
    assert isinstance(got, Message) and got.payload == payload and got.route is Route.OFFLOADED


def test_async_client_round_trip(
    gateway: GatewayServer, unique_topic: Callable[[str], str]
) -> None:
    broker: Mosquitto = gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("aio")
    payload = os.urandom(2 * MiB)

    async def main() -> list[Message | MessageError]:
        async with AsyncClient(broker.url) as sub, AsyncClient(broker.url) as pub:
            await sub.subscribe(topic)
            big = await pub.publish(topic, payload, qos=1)
            small = await pub.publish(topic, b"tiny", qos=1)
            assert (big.route, small.route) == (Route.OFFLOADED, Route.DIRECT)
            got: list[Message | MessageError] = []
            async for item in sub.messages(timeout=30):
                got.append(item)
                if isinstance(item, Message) and item.payload == b"tiny":
                    # publish from inside the async loop, then read it back
                    await sub.publish(topic, b"from-loop", qos=1)
                if len(got) == 3:
                    break
            return got

    got = asyncio.run(main())
    payloads = [m.payload for m in got if isinstance(m, Message)]
    assert payloads == [payload, b"tiny", b"from-loop"]


def test_payload_expiry_follows_the_placeholder_expiry(
    gateway: GatewayServer, seaweed: SeaweedFS, bucket_name: str
) -> None:
    with Client(gateway.broker.url, endpoint=gateway.url) as producer:  # type: ignore[attr-defined]
        result = producer.publish(
            "ttl/topic",
            os.urandom(400_000),
            qos=1,
            properties=PublishProperties(message_expiry_interval=120),
        )
    s3 = Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)
    manifest = json.loads(s3.get_object(bucket_name, f"ids/{result.message_id}.json").read())
    assert 0 < manifest["expires"] - manifest["timestamp"] <= 120_000


def test_a_retried_publish_with_the_same_id_keeps_one_object(
    gateway: GatewayServer, seaweed: SeaweedFS, bucket_name: str
) -> None:
    """The producer crashed after the upload, before the placeholder: the retry with the
    same id is confirmed by the gateway (idempotent) and then announces the message."""
    payload = os.urandom(600_000)
    msg_id = MessageId.new()
    with Client(gateway.broker.url, endpoint=gateway.url) as producer:  # type: ignore[attr-defined]
        first = producer.publish("retry/topic", payload, qos=1, message_id=msg_id)
        again = producer.publish("retry/topic", payload, qos=1, message_id=str(msg_id))
    assert first.route == again.route == Route.OFFLOADED
    assert first.message_id == again.message_id == str(msg_id)
    s3 = Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)
    payloads = [
        o.object_name
        for o in s3.list_objects(bucket_name, prefix="data/", recursive=True)
        if not str(o.object_name).endswith(".meta.json")
    ]
    assert len(payloads) == 1


@pytest.mark.parametrize(
    ("pub_protocol", "sub_protocol"),
    [(4, 4), (4, 5), (5, 4), (5, 5)],
    ids=["311-to-311", "311-to-5", "5-to-311", "5-to-5"],
)
def test_one_placeholder_for_every_protocol_pair(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    pub_protocol: int,
    sub_protocol: int,
) -> None:
    """Mixed fleets: a 3.1.1 subscriber sees no user properties, yet knows a placeholder."""
    topic = unique_topic("mixed")
    sub = clients(protocol=sub_protocol)
    sub.subscribe(topic)
    pub = clients(protocol=pub_protocol, max_packet_size=262144)
    payload = os.urandom(300 * 1024)  # over the broker's 256 KiB: offloaded
    result = pub.publish(topic, payload, qos=1)
    assert result.route is Route.OFFLOADED
    got = _next(sub)
    assert isinstance(got, Message), got
    assert got.route is Route.OFFLOADED and got.payload == payload
    assert got.message_id == result.message_id


def test_gateway_placeholder_reaches_a_311_subscriber(
    gateway: GatewayServer, clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    """The gateway encodes its placeholders with the same code: 3.1.1 recognises them too."""
    topic = unique_topic("gw311")
    sub = clients(protocol=4)
    sub.subscribe(topic)
    payload = os.urandom(64 * 1024)
    r = httpx.post(f"{gateway.url}/publish/{topic}", content=payload, timeout=30)
    assert r.status_code == 201, r.text
    got = _next(sub)
    assert isinstance(got, Message), got
    assert got.route is Route.OFFLOADED and got.payload == payload


def test_topic_dot_segments_reach_the_gateway_unchanged(
    gateway: GatewayServer, clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    """`a/../b` is an MQTT topic of three levels, not a path to normalise into `b`."""
    from hop import bson as hop_bson

    topic = unique_topic("dots") + "/../x/./y"
    sub = clients()
    sub.subscribe(topic)
    pub = clients(offload_threshold=1)
    result = pub.publish(topic, b"dotted", qos=1)
    assert result.route is Route.OFFLOADED
    got = _next(sub)
    assert isinstance(got, Message) and got.payload == b"dotted"
    stored = httpx.get(f"{gateway.url}/msg/{result.message_id}", timeout=30)
    assert stored.status_code == 200
    assert hop_bson.loads(stored.content)["metadata"]["topic"] == topic


def test_cli_311_subscriber_resolves_an_mqtt5_placeholder(
    gateway: GatewayServer, clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    """`offload subscribe --protocol 3.1.1` used to print an MQTT 5 placeholder as data."""
    broker: Mosquitto = gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("cli311")
    pub = clients()  # MQTT 5
    payload = os.urandom(1 * MiB)
    # Retained: the CLI gets it when it subscribes, no guessing when that is.
    result = pub.publish(topic, payload, qos=1, retain=True)
    assert result.route is Route.OFFLOADED
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env["OFFLOAD_CONFIG"] = os.devnull
    try:
        done = subprocess.run(
            ["offload", "subscribe", "--protocol", "3.1.1", "--broker", broker.url,
             "--topic", topic, "--count", "1", "--timeout", "30"],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
    finally:
        pub.publish(topic, b"", qos=1, retain=True)
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout)
    assert line["route"] == "offloaded" and line["size"] == len(payload)
    assert line["sha256"] == hashlib.sha256(payload).hexdigest()
