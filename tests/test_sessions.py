"""Persistent sessions (`session_expiry`, `client_id`) against real mosquitto, gateway and
SeaweedFS: a consumer away while 100 QoS 1 offloaded messages are published gets all of them
when it comes back, payloads intact; over a network outage, a killed and restarted process,
and a broker restart (with persistence) in between; and the documented outcome for a
consumer away longer than payload retention (docs/connections.md, docs/reliability.md)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from client import (
    AsyncClient,
    Client,
    ConfigError,
    Message,
    MessageError,
    PayloadNotFound,
    Route,
)

from _gateway import GatewayServer
from _relay import Relay
from _servers import Mosquitto

pytestmark = pytest.mark.servers

COUNT = 100
OFFLOAD = shutil.which("offload") or "offload"


def _payloads(n: int = COUNT) -> dict[str, bytes]:
    """`n` payloads by SHA-256: small ones (offloaded by the threshold) and a few larger than
    the 256 KiB broker takes."""
    out = {}
    for i in range(n):
        data = os.urandom(300 * 1024 if i % 25 == 0 else 2048)
        out[hashlib.sha256(data).hexdigest()] = data
    return out


def _publish_all(gateway: GatewayServer, topic: str, payloads: dict[str, bytes]) -> None:
    with Client(gateway.broker.url, endpoint=gateway.url, offload_threshold=1024) as producer:  # type: ignore[attr-defined]
        for data in payloads.values():
            assert producer.publish(topic, data, qos=1).route is Route.OFFLOADED


def _collect(client: Client, want: set[str], timeout: float = 120) -> dict[str, Message]:
    """Deliveries until every SHA-256 in `want` came (duplicates allowed, errors not)."""
    got: dict[str, Message] = {}
    deadline = time.monotonic() + timeout
    while not want <= got.keys():
        item = client.next_message(timeout=max(deadline - time.monotonic(), 0.1))
        assert item is not None, f"{len(want - got.keys())} of {len(want)} never came"
        assert isinstance(item, Message), item
        assert item.route is Route.OFFLOADED
        got[item.sha256] = item
    return got


def _check(got: dict[str, Message], payloads: dict[str, bytes]) -> None:
    assert got.keys() == payloads.keys()
    for sha, msg in got.items():
        assert msg.payload == payloads[sha]  # the bytes themselves, not just the checksum


def _subscribed(broker: Mosquitto, client_id: str, topic: str, before: int) -> bool:
    return broker.log().count(f"\t{topic} (QoS") > before


@pytest.fixture
def persistent_broker() -> Iterator[Mosquitto]:
    """A 256 KiB broker that saves its sessions and queues when it stops."""
    # Not under pytest's tmp_path (mode 0700): mosquitto run as root drops privileges to
    # its own user before it writes the database.
    state = Path(tempfile.mkdtemp(prefix="offload-mosq-state-"))
    state.chmod(0o777)
    broker = Mosquitto(
        max_packet_size=262144,
        extra_config=f"persistence true\npersistence_location {state}/\n",
    ).start()
    try:
        yield broker
    finally:
        broker.close()
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def session_gateway(
    gateway_factory: Callable[..., GatewayServer], persistent_broker: Mosquitto
) -> GatewayServer:
    server = gateway_factory(persistent_broker)
    server.broker = persistent_broker  # type: ignore[attr-defined]
    return server


def _consumer(url: str, gateway: GatewayServer, client_id: str, **kw: object) -> Client:
    return Client(url, endpoint=gateway.url, client_id=client_id, session_expiry=3600, **kw)  # type: ignore[arg-type]


def test_a_persistent_session_needs_a_client_id_and_a_usable_expiry() -> None:
    with pytest.raises(ConfigError, match="client_id"):
        Client("mqtt://127.0.0.1:1", session_expiry=60)
    with pytest.raises(ConfigError, match="session_expiry"):
        Client("mqtt://127.0.0.1:1", session_expiry=-1, client_id="x")


def test_network_outage_loses_nothing_and_keeps_the_subscription(
    session_gateway: GatewayServer, unique_topic: Callable[[str], str]
) -> None:
    broker: Mosquitto = session_gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("sess/outage")
    payloads = _payloads()
    relay = Relay(broker.port)
    try:
        with _consumer(relay.url, session_gateway, f"c-{uuid.uuid4().hex[:8]}") as consumer:
            consumer.subscribe(topic, qos=1)
            conn = consumer.connection
            relay.cut()
            while conn.connected:
                time.sleep(0.05)
            subs_before = broker.log().count(f"\t{topic} (QoS")
            _publish_all(session_gateway, topic, payloads)
            relay.resume()
            got = _collect(consumer, set(payloads))
            assert conn.session_present and conn.connections >= 2
            # The broker kept the subscription: it was not made again.
            assert broker.log().count(f"\t{topic} (QoS") == subs_before
        _check(got, payloads)
    finally:
        relay.close()


def test_a_suback_read_before_its_subscribe_is_recorded_still_counts(
    session_gateway: GatewayServer,
    unique_topic: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """paho's thread may read a SUBACK before the caller's thread, back from sending the
    SUBSCRIBE, has recorded it (CI met it under load). Forced here by a recording that
    comes late: the subscription still counts as the broker's, so a reconnect that finds
    the session present does not subscribe again (which would have the broker send every
    retained message once more)."""
    from client.mqtt._session import Subscriptions

    recorded = Subscriptions.sent

    def late(self: Subscriptions, mid: int, topic_filter: str) -> None:
        time.sleep(0.3)  # the SUBACK is read meanwhile
        recorded(self, mid, topic_filter)

    monkeypatch.setattr(Subscriptions, "sent", late)
    broker: Mosquitto = session_gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("sess/early")
    relay = Relay(broker.port)
    try:
        with _consumer(relay.url, session_gateway, f"c-{uuid.uuid4().hex[:8]}") as consumer:
            consumer.subscribe(topic, qos=1)
            conn = consumer.connection
            relay.cut()
            while conn.connected:
                time.sleep(0.05)
            relay.resume()
            deadline = time.monotonic() + 30
            while not (conn.connected and conn.connections >= 2):
                assert time.monotonic() < deadline, "no reconnect"
                time.sleep(0.05)
            assert conn.session_present
            time.sleep(0.5)  # a SUBSCRIBE sent again would be in the log by now
            assert broker.log().count(f"\t{topic} (QoS") == 1
    finally:
        relay.close()


def test_subacks_for_subscribes_never_sent_are_kept_within_a_bound() -> None:
    """A broker that sends SUBACKs for packet ids the client never used cannot grow what
    the client keeps for answers that came early; one that did come early still counts."""
    from client.mqtt._session import MAX_EARLY_ACKS, Subscriptions

    subs = Subscriptions()
    subs.add("a/b", 1)
    subs.acknowledged(7, True)  # before its SUBSCRIBE is recorded
    for mid in range(10_000, 20_000):
        subs.acknowledged(mid, True)
    assert len(subs._early) <= MAX_EARLY_ACKS
    subs.acknowledged(9, True)
    subs.sent(9, "a/b")
    assert subs.to_restore(session_present=True) == []
    subs.acknowledged(11, False)  # refused: still to be sent
    subs.add("c", 0)
    subs.sent(11, "c")
    assert subs.to_restore(session_present=True) == [("c", 0)]


def test_broker_restart_while_away_loses_nothing(
    session_gateway: GatewayServer, unique_topic: Callable[[str], str]
) -> None:
    broker: Mosquitto = session_gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("sess/restart")
    payloads = _payloads()
    client_id = f"c-{uuid.uuid4().hex[:8]}"
    with _consumer(broker.url, session_gateway, client_id) as consumer:
        consumer.subscribe(topic, qos=1)
    _publish_all(session_gateway, topic, payloads)
    broker.restart()  # SIGTERM: mosquitto saves sessions and queues; same port
    with _consumer(broker.url, session_gateway, client_id) as consumer:
        # No subscribe: the session the broker restored has it.
        got = _collect(consumer, set(payloads))
        assert consumer.connection.session_present
    _check(got, payloads)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env["OFFLOAD_CONFIG"] = os.devnull
    return env


def _subscriber(
    broker: Mosquitto, gateway: GatewayServer, topic: str, client_id: str, out: Path
) -> subprocess.Popen[str]:
    args = [
        OFFLOAD,
        "subscribe",
        "--broker",
        broker.url,
        "--endpoint",
        gateway.url,
        "--topic",
        topic,
    ]
    args += ["--client-id", client_id, "--session-expiry", "3600", "--out", str(out)]
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
    )


def test_killed_subscriber_process_gets_everything_after_its_restart(
    session_gateway: GatewayServer, unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    broker: Mosquitto = session_gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("sess/kill")
    client_id = f"c-{uuid.uuid4().hex[:8]}"
    before = broker.log().count(f"\t{topic} (QoS")
    first = _subscriber(broker, session_gateway, topic, client_id, tmp_path / "first")
    try:
        deadline = time.monotonic() + 30
        while broker.log().count(f"\t{topic} (QoS") == before:
            assert first.poll() is None and time.monotonic() < deadline, "not subscribed"
            time.sleep(0.05)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    payloads = _payloads()
    _publish_all(session_gateway, topic, payloads)
    second = _subscriber(broker, session_gateway, topic, client_id, tmp_path / "second")
    seen: set[str] = set()
    try:
        assert second.stdout is not None
        for line in second.stdout:  # ends when the process does (it fails the test then)
            doc = json.loads(line)
            assert "error" not in doc, doc
            assert Path(doc["file"]).read_bytes() == payloads[doc["sha256"]]
            seen.add(doc["sha256"])
            if seen == payloads.keys():
                break
    finally:
        second.send_signal(signal.SIGKILL)
        _, err = second.communicate(timeout=10)
    assert seen == payloads.keys(), err


def test_consumer_away_longer_than_retention_gets_payload_not_found_naming_the_id(
    gateway_factory: Callable[..., GatewayServer],
    persistent_broker: Mosquitto,
    unique_topic: Callable[[str], str],
) -> None:
    gateway = gateway_factory(persistent_broker, default_ttl=1)
    gateway.broker = persistent_broker  # type: ignore[attr-defined]
    topic = unique_topic("sess/expired")
    client_id = f"c-{uuid.uuid4().hex[:8]}"
    with _consumer(persistent_broker.url, gateway, client_id) as consumer:
        consumer.subscribe(topic, qos=1)
    with Client(persistent_broker.url, endpoint=gateway.url, offload_threshold=1024) as producer:
        result = producer.publish(topic, os.urandom(4096), qos=1)
    assert result.url is not None and result.message_id is not None
    while httpx.get(result.url, timeout=10).status_code != 404:  # its retention ran out
        time.sleep(0.1)
    with _consumer(persistent_broker.url, gateway, client_id) as consumer:
        item = consumer.next_message(timeout=60)
    assert isinstance(item, MessageError), item
    assert isinstance(item.error, PayloadNotFound)
    assert item.message_id == result.message_id


def test_messages_the_application_never_took_are_not_acknowledged(
    session_gateway: GatewayServer, unique_topic: Callable[[str], str]
) -> None:
    """Fetched and queued for the application, but the application never took them when the
    client went away: a persistent session's broker sends them again."""
    broker: Mosquitto = session_gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("sess/untaken")
    payloads = _payloads(20)
    client_id = f"c-{uuid.uuid4().hex[:8]}"
    with _consumer(broker.url, session_gateway, client_id) as consumer:
        consumer.subscribe(topic, qos=1)
        _publish_all(session_gateway, topic, payloads)
        # Every one received, fetched and waiting in the delivery queue, none taken.
        while consumer._receiver.deliveries.qsize() < len(payloads):
            time.sleep(0.05)
    with _consumer(broker.url, session_gateway, client_id) as consumer:
        got = _collect(consumer, set(payloads))
    _check(got, payloads)


def test_async_client_resumes_its_session(
    session_gateway: GatewayServer, unique_topic: Callable[[str], str]
) -> None:
    broker: Mosquitto = session_gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("sess/async")
    payloads = _payloads(10)
    session = {"endpoint": session_gateway.url, "client_id": f"c-{uuid.uuid4().hex[:8]}"}

    async def subscribe() -> None:
        async with AsyncClient(broker.url, session_expiry=3600, **session) as consumer:  # type: ignore[arg-type]
            await consumer.subscribe(topic, qos=1)

    async def collect() -> dict[str, bytes]:
        got: dict[str, bytes] = {}
        async with AsyncClient(broker.url, session_expiry=3600, **session) as consumer:  # type: ignore[arg-type]
            assert consumer.connection.session_present
            while got.keys() != payloads.keys():
                item = await consumer.next_message(timeout=60)
                assert isinstance(item, Message), item
                got[item.sha256] = item.payload
        return got

    asyncio.run(subscribe())
    _publish_all(session_gateway, topic, payloads)
    assert asyncio.run(collect()) == payloads
