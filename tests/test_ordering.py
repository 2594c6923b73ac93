"""Delivery order under concurrent fetches: per topic by default, strict arrival on request.

Real mosquitto, the real `Client` and `offload subscribe`; placeholders point at a tiny HTTP
endpoint of the test's own whose answers the test holds back (a gate per object) or fails
(503s) at will, so "slow" is real and nothing depends on timing: while a topic-A fetch is
held, topic B is delivered; once released, topic A arrives in publish order.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from client import Client, FetchError, Message, MessageError
from client.protocol import MessageId, Placeholder

from _hostile import RawPublisher
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers
OFFLOAD = shutil.which("offload") or "offload"


@dataclass
class Held:
    """One object the endpoint serves: its bytes, a gate, and 503s to answer first."""

    body: bytes
    gate: threading.Event = field(default_factory=threading.Event)
    failures: int = 0
    requests: int = 0


class GatedEndpoint:
    """Serves `/msg/<id>/payload` for registered ids, each once its gate is open."""

    def __init__(self) -> None:
        self.objects: dict[str, Held] = {}
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                held = endpoint.objects.get(self.path.split("/")[2])
                if held is None:
                    self.send_error(404)
                    return
                held.requests += 1
                if held.requests <= held.failures:
                    self.send_error(503, "restarting")
                    return
                held.gate.wait(60)
                self.send_response(200)
                self.send_header("Content-Length", str(len(held.body)))
                self.end_headers()
                self.wfile.write(held.body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def placeholder(
        self, body: bytes, *, held: bool = False, failures: int = 0
    ) -> tuple[bytes, list[tuple[str, str]], Held]:
        """A placeholder for `body` (held back until its gate opens when `held`)."""
        mid = MessageId.new()
        obj = Held(body, failures=failures)
        if not held:
            obj.gate.set()
        self.objects[str(mid)] = obj
        ref = Placeholder(f"{self.url}/msg/{mid}", len(body), hashlib.sha256(body).hexdigest(), mid)
        payload, props = ref.encode(None)
        assert props is not None
        return payload, list(props.user_properties), obj

    def close(self) -> None:
        for obj in self.objects.values():
            obj.gate.set()
        self._server.shutdown()


@pytest.fixture
def endpoint() -> Iterator[GatedEndpoint]:
    ep = GatedEndpoint()
    yield ep
    ep.close()


def _payloads(sub: Client, n: int) -> list[bytes]:
    got = []
    for _ in range(n):
        item = sub.next_message(30)
        assert isinstance(item, Message), item
        got.append(item.payload)
    return got


def _publish_mix(pub: RawPublisher, endpoint: GatedEndpoint, a: str, b: str) -> threading.Event:
    """A1 (held placeholder), A2 (direct), A3 (placeholder), B1 (direct), B2 (placeholder)."""
    body, props, held = endpoint.placeholder(b"A1" * 1000, held=True)
    pub.publish(a, body, user_properties=props)
    pub.publish(a, b"A2")
    body, props, _ = endpoint.placeholder(b"A3" * 1000)
    pub.publish(a, body, user_properties=props)
    pub.publish(b, b"B1")
    body, props, _ = endpoint.placeholder(b"B2" * 1000)
    pub.publish(b, body, user_properties=props)
    return held.gate


def test_a_held_fetch_holds_its_own_topic_only(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    endpoint: GatedEndpoint,
) -> None:
    broker = mosquitto_factory()
    root = unique_topic("order")
    pub = RawPublisher(broker.url)
    with Client(broker.url, endpoint=endpoint.url) as sub:
        sub.subscribe(f"{root}/#")
        gate = _publish_mix(pub, endpoint, f"{root}/a", f"{root}/b")
        # A1's payload is still held by the endpoint: topic B is delivered, in its order.
        assert _payloads(sub, 2) == [b"B1", b"B2" * 1000]
        # Nothing of topic A may overtake A1 (a correct client never returns one here).
        assert sub.next_message(1.0) is None
        gate.set()
        assert _payloads(sub, 3) == [b"A1" * 1000, b"A2", b"A3" * 1000]
    pub.close()


def test_arrival_ordering_keeps_strict_arrival_order(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    endpoint: GatedEndpoint,
) -> None:
    broker = mosquitto_factory()
    root = unique_topic("arrival")
    pub = RawPublisher(broker.url)
    with Client(broker.url, endpoint=endpoint.url, ordering="arrival") as sub:
        sub.subscribe(f"{root}/#")
        gate = _publish_mix(pub, endpoint, f"{root}/a", f"{root}/b")
        assert sub.next_message(1.0) is None  # B1 waits behind A1 too
        gate.set()
        assert _payloads(sub, 5) == [b"A1" * 1000, b"A2", b"A3" * 1000, b"B1", b"B2" * 1000]
    pub.close()


def test_transient_failures_are_retried_in_order(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    endpoint: GatedEndpoint,
) -> None:
    broker = mosquitto_factory()
    topic = unique_topic("retry")
    pub = RawPublisher(broker.url)
    with Client(broker.url, endpoint=endpoint.url, fetch_retry_for=30) as sub:
        sub.subscribe(topic)
        body, props, held = endpoint.placeholder(b"first" * 100, failures=2)
        pub.publish(topic, body, user_properties=props)
        pub.publish(topic, b"second")
        assert _payloads(sub, 2) == [b"first" * 100, b"second"]
        assert held.requests == 3  # two 503s, then the payload
    pub.close()


def test_without_retry_time_a_5xx_is_reported(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    endpoint: GatedEndpoint,
) -> None:
    broker = mosquitto_factory()
    topic = unique_topic("noretry")
    pub = RawPublisher(broker.url)
    with Client(broker.url, endpoint=endpoint.url, fetch_retry_for=0) as sub:
        sub.subscribe(topic)
        body, props, _ = endpoint.placeholder(b"x" * 100, failures=5)
        pub.publish(topic, body, user_properties=props)
        pub.publish(topic, b"next")
        err = sub.next_message(30)
        assert isinstance(err, MessageError) and isinstance(err.error, FetchError)
        assert err.error.status == 503
        assert _payloads(sub, 1) == [b"next"]
    pub.close()


def test_intake_stops_at_max_pending_deliveries(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    endpoint: GatedEndpoint,
) -> None:
    """A publisher flooding a topic whose head is held cannot grow what the client holds."""
    broker = mosquitto_factory()
    root = unique_topic("bound")
    pub = RawPublisher(broker.url)
    with Client(broker.url, endpoint=endpoint.url, max_pending_deliveries=4) as sub:
        sub.subscribe(f"{root}/#")
        body, props, held = endpoint.placeholder(b"head", held=True)
        pub.publish(f"{root}/a", body, user_properties=props)
        for i in range(20):
            pub.publish(f"{root}/t{i}", b"%d" % i)
        # Four outstanding at most: the head and three others; the rest wait unread.
        assert _payloads(sub, 3) == [b"0", b"1", b"2"]
        # A's head still held: the worker fills the room again, then takes no more.
        receiver = sub._receiver
        wait_until(lambda: receiver.sequencer.outstanding[0] == 4, "a full intake", 10)
        time.sleep(0.3)
        assert receiver.sequencer.outstanding[0] == 4
        held.gate.set()
        rest = _payloads(sub, 18)
        assert sorted(rest) == sorted([b"head"] + [b"%d" % i for i in range(3, 20)])
        assert sub._receiver.sequencer.outstanding == (0, 0)
    pub.close()


@pytest.mark.parametrize("qos", [1, 2])
def test_a_qos1_flood_beyond_the_bound_loses_nothing(
    mosquitto_factory: Callable[..., Mosquitto], unique_topic: Callable[[str], str], qos: int
) -> None:
    """QoS 1/2 messages are never shed, and a flood the application does not read waits at
    the broker: the client acknowledges a message only when its worker takes it, and asks
    for at most `max_pending_deliveries` unacknowledged (MQTT 5 Receive Maximum)."""
    broker = mosquitto_factory()
    topic = unique_topic("flood1")
    pub = RawPublisher(broker.url)
    with Client(broker.url, max_pending_deliveries=2) as sub:
        sub.subscribe(topic, qos=qos)
        sent = [b"%05d" % i + b"x" * 995 for i in range(200)]
        for payload in sent:
            pub.publish(topic, payload, qos=qos)  # each acknowledged by the broker
        receiver = sub._receiver
        wait_until(lambda: receiver.sequencer.outstanding[0] == 2, "a full intake", 10)
        time.sleep(0.5)  # what the broker would still send arrives meanwhile
        # 2 with a broker that keeps to Receive Maximum; mosquitto 2.0.11 (Debian 12's)
        # sends up to that many more per acknowledgement: a few more here.
        assert len(receiver.inbound) <= 10, len(receiver.inbound)
        assert _payloads(sub, 200) == sent  # all of them, in order, once read
        assert receiver.inbound.shed == 0
    pub.close()


def test_a_qos0_flood_beyond_the_bound_is_shed(
    mosquitto_factory: Callable[..., Mosquitto], unique_topic: Callable[[str], str]
) -> None:
    broker = mosquitto_factory()
    topic = unique_topic("flood0")
    pub = RawPublisher(broker.url)
    with Client(broker.url, max_pending_deliveries=2, max_pending_bytes=10_000) as sub:
        sub.subscribe(topic, qos=0)
        for i in range(300):
            pub.publish(topic, b"%05d" % i + b"x" * 995, qos=0)
        receiver = sub._receiver
        wait_until(lambda: receiver.inbound.shed > 0, "QoS 0 shed at the bound", 10)
        assert len(receiver.inbound) <= 2
    pub.close()


def test_publishing_from_the_message_loop_during_a_flood_does_not_hang(
    mosquitto_factory: Callable[..., Mosquitto], unique_topic: Callable[[str], str]
) -> None:
    """paho's thread never waits on the application, so its PUBACKs always get through."""
    broker = mosquitto_factory()
    topic = unique_topic("reply")
    pub = RawPublisher(broker.url)
    with Client(broker.url, max_pending_deliveries=2) as sub:
        sub.subscribe(f"{topic}/in", qos=1)
        for i in range(100):
            pub.publish(f"{topic}/in", b"%d" % i, qos=1)
        for _ in range(100):  # request/response: each message answered before the next
            message = sub.next_message(30)
            assert isinstance(message, Message)
            sub.publish(f"{topic}/out", message.payload, qos=1, timeout=30)
    pub.close()


def test_cli_subscribe_prints_other_topics_while_a_fetch_is_held(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    endpoint: GatedEndpoint,
) -> None:
    broker = mosquitto_factory()
    root = unique_topic("cli")
    pub = RawPublisher(broker.url)
    body, props, held = endpoint.placeholder(b"big" * 1000, held=True)
    # Retained: the CLI gets both as soon as it subscribes.
    pub.publish(f"{root}/a", body, user_properties=props, retain=True)
    pub.publish(f"{root}/b", b"small", retain=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env.update(OFFLOAD_CONFIG=os.devnull, OFFLOAD_ENDPOINT=endpoint.url)
    proc = subprocess.Popen(
        [OFFLOAD, "subscribe", "--broker", broker.url, "--topic", f"{root}/#", "--count", "2",
         "--timeout", "60", "--fetch-concurrency", "2", "--ordering", "topic"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["topic"] == f"{root}/b"
        held.gate.set()
        second = json.loads(proc.stdout.readline())
        assert second["topic"] == f"{root}/a" and second["size"] == 3000
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        pub.publish(f"{root}/a", b"", retain=True)
        pub.publish(f"{root}/b", b"", retain=True)
        pub.close()
