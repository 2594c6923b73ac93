"""A hostile publisher against real mosquitto, the real gateway, `Client` and `offload subscribe`.

Hypothesis writes placeholders (odd URLs, sizes, ids, deep nesting), `__chunk` values and
discovery records (retained or not); a plain paho client publishes them, interleaved with
valid direct, offloaded and chunked messages. Both subscribers (the library and the CLI,
running side by side the whole time) must stay alive, deliver every valid message, and
report or ignore each hostile one. Every placeholder and record is hostile input until read:
nothing in one may raise out of paho's thread or the worker.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client import (
    ChunkError,
    Client,
    FetchError,
    MalformedChunk,
    MalformedPlaceholder,
    Message,
    MessageError,
    Route,
)
from client.receive._receive import Delivery

from _gateway import GatewayServer
from _hostile import PeakRss, RawPublisher
from _servers import Mosquitto

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
MAX_U32 = 2**32 - 1
SHA = hashlib.sha256(b"x").hexdigest()
OFFLOAD = shutil.which("offload") or "offload"
MALFORMED = "ignoring malformed discovery record"

# -- strategies ---------------------------------------------------------------------------

# What an MQTT broker carries as a UTF-8 string (mosquitto disconnects on the rest).
text = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Cn")), max_size=40)
FIXED_URLS = [
    "http://[gw/msg/x",
    "http://gw:99999/msg/x",
    "http://g\tw/msg/x",
    "http://" + "a" * 300 + "/msg/x",
    "ftp://127.0.0.1/msg/x",
    "file:///etc/passwd",
    "http://user:pw@127.0.0.1/msg/x",
    f"http://127.0.0.1:1/msg/{uuid.uuid4()}",
    "http://169.254.169.254/latest/meta-data/",
    "",
]


def urls(gateway_url: str) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(FIXED_URLS),
        text,
        st.uuids().map(lambda u: f"{gateway_url}/msg/{u}"),  # trusted origin, no object
        text.map(lambda path: f"{gateway_url}/{path}"),
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)


def deep(opener: bytes, closer: bytes) -> st.SearchStrategy[bytes]:
    head = b'{"_format":"external","url":'
    return st.integers(17, 32000).map(lambda n: head + opener * n + closer * n + b"}")


def placeholders(gateway_url: str) -> st.SearchStrategy[bytes]:
    doc = st.fixed_dictionaries(
        {"_format": st.just("external")},
        optional={
            "url": urls(gateway_url) | json_values,
            "size": st.integers(-1, 2**70) | json_values,
            "sha256": st.sampled_from([SHA, SHA.upper(), "AB"]) | json_values,
            "_id": st.uuids().map(str) | json_values,
        },
    )
    return st.one_of(
        doc.map(lambda d: json.dumps(d).encode()),
        deep(b"[", b"]"),
        deep(b'{"a":', b"}"),
        st.just(b"{" * 65536),
        st.binary(max_size=300).map(lambda b: b'{"_format":"external",' + b),
    )


user_props = st.lists(
    st.tuples(st.sampled_from(["_format", "_id", "x"]) | text, st.just("external") | text),
    max_size=3,
)
chunk_values = st.one_of(
    text,
    st.builds(
        lambda u, i, t, s: f"{u}:{i}:{t}:{s}",
        st.uuids(),
        st.integers(0, 2**33),
        st.integers(0, 2**33),
        st.sampled_from([SHA, "x"]),
    ),
    st.builds(lambda u, i: f"{u}:{i}", st.uuids(), st.integers(0, 2**33)),
)


@dataclass(frozen=True)
class Hostile:
    """One hostile PUBLISH: where, what, which user properties, expiry, retained."""

    where: str  # "data" or "discovery"
    payload: bytes
    props: tuple[tuple[str, str], ...] = ()
    expiry: int | None = None
    retain: bool = False


def hostile_messages(gateway_url: str) -> st.SearchStrategy[Hostile]:
    record_docs = st.fixed_dictionaries(
        {},
        optional={
            "LargeMessageUploadEndpoint": urls(gateway_url) | json_values,
            "OffloadProtocolVersion": json_values,
            "MaxUploadBytes": st.integers(-1, 2**70) | json_values,
            "AuthMechanisms": json_values,
        },
    ).map(lambda d: json.dumps(d).encode())
    return st.one_of(
        st.builds(
            Hostile,
            st.just("data"),
            placeholders(gateway_url),
            st.just((("_format", "external"),)) | user_props.map(tuple),
        ),
        st.builds(
            Hostile,
            st.just("data"),
            st.binary(max_size=64),
            st.tuples(st.tuples(st.just("__chunk"), chunk_values)),
            st.none() | st.integers(1, MAX_U32),
        ),
        st.builds(
            Hostile,
            st.just("discovery"),
            record_docs | placeholders(gateway_url) | st.binary(max_size=200),
            retain=st.booleans(),
        ),
    )


# -- the peers ----------------------------------------------------------------------------


class CliSubscriber:
    """`offload subscribe` in a subprocess; its JSON lines collected by a reader thread."""

    def __init__(self, topic_filter: str, env: dict[str, str]) -> None:
        self.lines: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            [OFFLOAD, "subscribe", "--topic", topic_filter],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self._peak = PeakRss(self.proc.pid)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(json.loads(line))
                self._cond.notify_all()

    def wait_for(self, sha256: str, timeout: float = 60) -> None:
        with self._cond:
            found = self._cond.wait_for(
                lambda: any(doc.get("sha256") == sha256 for doc in self.lines), timeout
            )
        assert found, f"the CLI never printed {sha256}; last lines {self.lines[-3:]}"

    def stop(self) -> tuple[str, int]:
        """Stop it; its stderr and its peak RSS in KiB."""
        self.proc.terminate()
        assert self.proc.stderr is not None
        err = self.proc.stderr.read()
        self.proc.wait(timeout=30)
        return err, self._peak.stop()

    def close(self) -> None:
        if self.proc.returncode is None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Scene:
    gateway: GatewayServer
    broker: Mosquitto
    topic: str
    discovery: str
    sub: Client
    cli: CliSubscriber
    hostile: RawPublisher
    offloader: Client
    chunker: Client
    record: bytes

    def restore_discovery(self) -> None:
        """Re-advertise the real endpoint and wait until the subscriber uses it again."""
        self.hostile.publish(self.discovery, self.record, retain=True)
        deadline = time.monotonic() + 20
        while self.sub.endpoint != self.gateway.url:
            assert time.monotonic() < deadline, "the subscriber never took the record back"
            time.sleep(0.05)


@pytest.fixture
def scene(
    gateway_factory: Callable[..., GatewayServer],
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
) -> Iterator[Scene]:
    broker = mosquitto_factory(max_packet_size=262144)
    gateway = gateway_factory(broker)
    prefix = unique_topic("hostile")
    discovery = f"{prefix}/discovery"  # this test's own discovery topic: it writes it
    record = json.dumps({"LargeMessageUploadEndpoint": gateway.url}).encode()
    hostile = RawPublisher(broker.url)
    hostile.publish(discovery, record, retain=True)
    hostile.publish(f"{prefix}/data/ready", b"ready", retain=True)
    bounds: dict[str, Any] = {
        "discovery_topic": discovery,
        "http_timeout": 5.0,
        "spool_threshold": MiB,
        "max_buffered_bytes": 8 * MiB,
        "chunk_timeout": 2.0,
        "max_chunk_timeout": 2.0,
        "discovery_wait": 5.0,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env["OFFLOAD_CONFIG"] = os.devnull
    env["OFFLOAD_BROKER"] = broker.url
    env.update({f"OFFLOAD_{k.upper()}": str(v) for k, v in bounds.items()})
    cli = CliSubscriber(f"{prefix}/data/#", env)
    sub = Client(broker.url, **bounds)
    offloader = Client(broker.url, endpoint=gateway.url, offload_threshold=1)
    chunker = Client(broker.url, automatic_offload=False)
    try:
        sub.connect()
        offloader.connect()
        chunker.connect()
        sub.subscribe(f"{prefix}/data/#")
        cli.wait_for(hashlib.sha256(b"ready").hexdigest())  # the CLI has subscribed
        yield Scene(
            gateway, broker, f"{prefix}/data/x", discovery, sub, cli, hostile, offloader,
            chunker, record,
        )  # fmt: skip
    finally:
        hostile.publish(discovery, b"", retain=True)
        hostile.publish(f"{prefix}/data/ready", b"", retain=True)
        for client in (sub, offloader, chunker):
            client.close()
        hostile.close()
        cli.close()


def _await(
    sub: Client, payload: bytes, seen: dict[str, list[Delivery]], timeout: float = 60
) -> Message:
    """Wait for `payload`; every other delivery on the way is kept in `seen`, by topic."""
    deadline = time.monotonic() + timeout
    while True:
        item = sub.next_message(max(deadline - time.monotonic(), 0.01))
        assert item is not None, f"valid message {payload[:20]!r} never delivered"
        if isinstance(item, Message) and item.payload == payload:
            return item
        seen.setdefault(item.topic, []).append(item)


def _tagged_json(payload: bytes) -> bool:
    """The placeholder rule's JSON half, as documented (client/protocol/_placeholder.py)."""
    if len(payload) > 65536 or payload.lstrip()[:1] != b"{":
        return False
    try:
        doc = json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and _depth(doc) <= 16 and doc.get("_format") == "external"


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def expected_outcome(item: Hostile) -> str:
    """What a data message must become: "chunk" or "placeholder" (reported) or "plain"."""
    keys = [key for key, _ in item.props]
    if "__chunk" in keys:
        return "chunk"
    tag = next((value for key, value in item.props if key == "_format"), None)
    if tag is not None:
        return "placeholder" if tag == "external" else "plain"
    return "placeholder" if _tagged_json(item.payload) else "plain"


def check_outcome(item: Hostile, got: list[Delivery]) -> None:
    """One delivery per hostile message: the error of its kind, or (not hostile) itself."""
    kind = expected_outcome(item)
    assert len(got) == 1, (kind, item, got)
    (delivery,) = got
    if kind == "plain":
        assert isinstance(delivery, Message) and delivery.route is Route.DIRECT, (item, delivery)
        assert delivery.payload == item.payload
    elif kind == "placeholder":
        assert isinstance(delivery, MessageError), (item, delivery)
        assert isinstance(delivery.error, MalformedPlaceholder | FetchError), delivery
    elif isinstance(delivery, Message):  # a well-formed single chunk: a message after all
        assert delivery.route is Route.CHUNKED and delivery.payload == item.payload, item
    else:
        assert isinstance(delivery.error, ChunkError | MalformedChunk), (item, delivery)


# -- the tests ----------------------------------------------------------------------------


def test_hostile_publisher_cannot_stop_the_subscribers(
    scene: Scene, caplog: pytest.LogCaptureFixture
) -> None:
    valid: list[bytes] = []
    sent: dict[str, Hostile] = {}  # each hostile data message on a topic of its own
    seen: dict[str, list[Delivery]] = {}
    gateway_url = scene.gateway.url

    @settings(
        max_examples=12,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        derandomize=True,
    )
    @given(batch=st.lists(hostile_messages(gateway_url), min_size=1, max_size=6))
    def round_trip(batch: list[Hostile]) -> None:
        for item in batch:
            topic = f"{scene.topic}/{len(sent)}" if item.where == "data" else scene.discovery
            if item.where == "data":
                sent[topic] = item
            scene.hostile.publish(
                topic, item.payload, user_properties=list(item.props) or None,
                expiry=item.expiry, retain=item.retain,
            )  # fmt: skip
        # A direct, an offloaded and a chunked message after the hostile ones: all arrive.
        direct = f"valid {uuid.uuid4()}".encode()
        scene.hostile.publish(scene.topic, direct)
        _await(scene.sub, direct, seen)
        scene.restore_discovery()
        big = os.urandom(300 * 1024)  # over the 256 KiB broker limit
        assert scene.offloader.publish(scene.topic, big, qos=1).route is Route.OFFLOADED
        got = _await(scene.sub, big, seen)
        assert got.route is Route.OFFLOADED
        chunked = os.urandom(300 * 1024)
        assert scene.chunker.publish(scene.topic, chunked, qos=1).route is Route.CHUNKED
        got = _await(scene.sub, chunked, seen)
        assert got.route is Route.CHUNKED
        valid.extend([direct, big, chunked])

    caplog.set_level(logging.WARNING)
    round_trip()
    # Partial chunked messages are reported when their timeout (2 s) runs out: wait for
    # every hostile message's outcome, then for a last valid message behind them all.
    deadline = time.monotonic() + 60
    while not all(topic in seen for topic in sent):
        item = scene.sub.next_message(max(deadline - time.monotonic(), 0.01))
        assert item is not None, [sent[t] for t in sent if t not in seen]
        seen.setdefault(item.topic, []).append(item)
    last = f"last {uuid.uuid4()}".encode()
    scene.hostile.publish(scene.topic, last)
    _await(scene.sub, last, seen)
    ready = scene.topic.rsplit("/", 1)[0] + "/ready"  # the retained start marker
    assert set(seen) - {ready} == set(sent), "a delivery on no hostile message's topic"
    kinds = [expected_outcome(item) for item in sent.values()]
    assert {"chunk", "placeholder", "plain"} <= set(kinds), kinds  # every kind was tried
    for topic, item in sent.items():
        check_outcome(item, seen[topic])
    # The CLI ran beside the library client the whole time and printed every valid message,
    # and one line per hostile one: an error for what the library reported as one.
    for payload in [*valid, last]:
        scene.cli.wait_for(hashlib.sha256(payload).hexdigest())
    lines: dict[str, list[dict[str, Any]]] = {}
    for doc in scene.cli.lines:
        lines.setdefault(doc["topic"], []).append(doc)
    for topic in sent:
        (delivery,) = seen[topic]
        (doc,) = lines[topic]
        if isinstance(delivery, MessageError):
            assert "error" in doc and doc["id"] == delivery.message_id, (doc, delivery)
        else:
            assert doc["sha256"] == delivery.sha256, (doc, delivery)
    assert not [doc for doc in scene.cli.lines if "error" in doc and doc["topic"] not in sent]
    stderr, peak_kib = scene.cli.stop()
    assert "Traceback" not in stderr
    # The CLI's whole process, hostile round trips and 300 KiB payloads included.
    assert 0 < peak_kib < 256 * 1024, f"CLI peaked at {peak_kib} KiB"
    assert "could not handle" not in caplog.text  # no unexpected failure, only known ones


def test_malformed_retained_discovery_record_is_ignored_once(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Retained, a bad record reaches every client at connect; none may break on it."""
    broker = mosquitto_factory()
    discovery = unique_topic("bad-discovery")
    topic = unique_topic("after-bad-discovery")
    hostile = RawPublisher(broker.url)
    bad_records = [
        b'{"LargeMessageUploadEndpoint": "http://[gw/"}',
        b'{"LargeMessageUploadEndpoint": "http://gw:99999"}',
        b'{"LargeMessageUploadEndpoint":' + b"[" * 30000 + b"]" * 30000 + b"}",
        b"\xff\xfe not json",
    ]
    try:
        for bad in bad_records:
            hostile.publish(discovery, bad, retain=True)
            caplog.clear()
            caplog.set_level(logging.WARNING)
            # Re-subscribing every 0.2 s re-delivers the retained record many times.
            with Client(broker.url, discovery_topic=discovery, discovery_refresh=0.2) as sub:
                sub.subscribe(topic)  # used to fail: paho's thread had died on the record
                time.sleep(1.0)
                hostile.publish(topic, b"delivered")
                got = sub.next_message(30)
                assert isinstance(got, Message) and got.payload == b"delivered"
                assert sub.endpoint is None
            assert caplog.text.count(MALFORMED) == 1, caplog.text
            env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
            env.update(OFFLOAD_CONFIG=os.devnull, OFFLOAD_DISCOVERY_TOPIC=discovery)
            hostile.publish(topic, b"retained for the CLI", retain=True)
            done = subprocess.run(
                [OFFLOAD, "subscribe", "--broker", broker.url, "--topic", topic,
                 "--count", "1", "--timeout", "30"],
                capture_output=True, text=True, timeout=60, env=env,
            )  # fmt: skip
            hostile.publish(topic, b"", retain=True)
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["size"] == len(b"retained for the CLI")
            assert done.stderr.count(MALFORMED) == 1, done.stderr
    finally:
        hostile.publish(discovery, b"", retain=True)
        hostile.close()
