"""Faults survived: real servers stopped, restarted and killed under the real client.

Fault injection happens by stopping the real program (SeaweedFS, mosquitto, a gateway
process killed with SIGKILL) or at the byte seam (a payload file whose reads pause), never by
mocking a library.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import bson
import httpx
import pytest

from client import Client, Message, MessageError, PayloadNotFound, Route, UploadError
from client.core._source import PayloadSource
from client.http._transport import HttpTransport
from client.protocol import MessageId
from gateway import Settings
from gateway.storage import S3Store

from _gateway import GatewayProcess, GatewayServer
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers

MiB = 1024 * 1024


# -- helpers ----------------------------------------------------------------------------------


class GatedPayload(io.BytesIO):
    """A seekable payload whose reads stop at `gate_at` bytes, on pass `gate_pass`, until
    released: the test decides what breaks while a transfer is half done."""

    def __init__(self, data: bytes, gate_at: int, gate_pass: int = 0) -> None:
        super().__init__(data)
        self.gate_at = gate_at
        self.gate_pass = gate_pass
        self.passes = -1
        self.reached = threading.Event()
        self.release = threading.Event()

    def read(self, n: int | None = -1) -> bytes:
        if self.tell() == 0:
            self.passes += 1
        if (
            self.passes == self.gate_pass
            and self.tell() >= self.gate_at
            and not self.release.is_set()
        ):
            self.reached.set()
            if not self.release.wait(60):
                raise OSError("gate never released")
        return super().read(n)


def upload_doc(payload: bytes, msg_id: uuid.UUID) -> bytes:
    return bson.encode({"message": bson.Binary(payload), "headers": [["_id", msg_id.bytes]]})


def bucket_keys(server: SeaweedFS, bucket: str) -> list[str]:
    store = S3Store(
        server.endpoint, bucket, access_key=server.access_key, secret_key=server.secret_key
    )
    # The messages' objects, not the payloads' records (tests/test_lifecycle_*.py).
    return sorted(info.key for info in store.list("") if not info.key.startswith("blobs/"))


def drain(client: Client, seconds: float) -> list[Message | MessageError]:
    """Everything delivered within `seconds`."""
    out: list[Message | MessageError] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        item = client.next_message(left)
        if item is not None:
            out.append(item)
    return out


def wait_until_delivered(
    sub: Client, probe: Client, topic: str, timeout: float = 30
) -> list[Message | MessageError]:
    """Publish small probes until `sub` receives one: both are connected and subscribed."""
    seen: list[Message | MessageError] = []
    deadline = time.monotonic() + timeout
    n = 0
    while time.monotonic() < deadline:
        n += 1
        with contextlib.suppress(Exception):  # not reconnected yet: try again
            probe.publish(topic, f"probe-{n}".encode(), qos=1, timeout=2)
        for item in drain(sub, 0.5):
            seen.append(item)
            if isinstance(item, Message) and item.payload.startswith(b"probe-"):
                return seen
    raise AssertionError("subscriber did not come back after the broker restart")


def is_big(item: Message | MessageError, sha: str) -> bool:
    return isinstance(item, MessageError) or item.sha256 == sha


@pytest.fixture
def clients(broker: Mosquitto) -> Iterator[Callable[..., Client]]:
    made: list[Client] = []

    def make(**kw: object) -> Client:
        c = Client(broker.url, discovery_wait=5.0, **kw)  # type: ignore[arg-type]
        c.connect()
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


# -- object store down ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_seaweed() -> Iterator[SeaweedFS]:
    """A SeaweedFS only this module stops (the session one is shared by every test)."""
    server = SeaweedFS().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def store_gateway(
    own_seaweed: SeaweedFS, bucket_name: str, broker: Mosquitto
) -> Iterator[GatewayServer]:
    settings = Settings(
        storage_url=own_seaweed.storage_url(bucket_name),
        s3_access_key=own_seaweed.access_key,
        s3_secret_key=own_seaweed.secret_key,
        mqtt_url=broker.url,
        discovery_interval=5.0,
        sweep_interval=0,
        allow_anonymous=True,
    )
    server = GatewayServer(settings).start()
    try:
        yield server
    finally:
        server.stop()
        if own_seaweed.proc is None:  # leave the store running for the next test
            own_seaweed.start()


def test_store_down_503_fast_producer_falls_back_or_raises_and_all_recovers(
    store_gateway: GatewayServer,
    own_seaweed: SeaweedFS,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
) -> None:
    before, during = uuid.uuid4(), uuid.uuid4()
    topic = unique_topic("f/fallback")
    payload = os.urandom(1 * MiB)  # over the 256 KiB broker limit
    sub = clients()
    sub.subscribe(topic, qos=1)
    chunker = clients(endpoint=store_gateway.url)
    strict = clients(endpoint=store_gateway.url, chunking=False)
    with httpx.Client(base_url=store_gateway.url, timeout=30) as http:
        assert http.post("/topic/f/s+oversized", content=upload_doc(b"b", before)).is_success
        assert http.get("/readyz").status_code == 200

        own_seaweed.stop()
        started = time.monotonic()
        r = http.post("/topic/f/s+oversized", content=upload_doc(b"x" * 100_000, during))
        took = time.monotonic() - started
        assert r.status_code == 503, r.text
        assert "object store" in r.json()["detail"]
        assert took < 5, f"503 took {took:.1f}s"
        ready = http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["storage"].startswith("unavailable")
        # A stored message is unavailable, not gone: 503, never a 404 a client would trust.
        assert http.get(f"/msg/{before}/payload").status_code == 503

        # The producer: falls back to chunks by default, raises when chunking is off.
        result = chunker.publish(topic, payload, qos=1)
        assert result.route is Route.CHUNKED
        got = [m for m in drain(sub, 5) if isinstance(m, Message)]
        assert [m.payload for m in got] == [payload]
        with pytest.raises(UploadError) as caught:
            strict.publish(topic, payload, qos=1)
        assert caught.value.status == 503
        assert drain(sub, 2) == []  # nothing was published for the failed upload

        own_seaweed.start()
        deadline = time.monotonic() + 60
        while http.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "gateway did not become ready again"
            time.sleep(0.5)
        assert http.post("/topic/f/s+oversized", content=upload_doc(b"d", during)).is_success
        assert http.get(f"/msg/{before}/payload").content == b"b"
        assert http.get(f"/msg/{during}/payload").content == b"d"
        assert strict.publish(topic, payload, qos=1).route is Route.OFFLOADED


# -- broker restarts --------------------------------------------------------------------------


def test_broker_restart_during_an_offload_delivers_once_the_upload_is_done(
    gateway: GatewayServer, clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    broker: Mosquitto = gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("f/offload")
    data = os.urandom(4 * MiB)
    sha = hashlib.sha256(data).hexdigest()
    sub = clients()
    sub.subscribe(topic, qos=1)
    probe = clients()
    pub = clients(endpoint=gateway.url, chunking=False)
    gated = GatedPayload(data, gate_at=2 * MiB)
    outcome: dict[str, object] = {}

    def publish() -> None:
        try:
            outcome["result"] = pub.publish(topic, gated, qos=1, timeout=60)
        except Exception as exc:  # reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=publish)
    thread.start()
    assert gated.reached.wait(30), "upload never started"
    broker.restart()  # the upload is half way to the gateway
    early = wait_until_delivered(sub, probe, topic)
    assert not [m for m in early if is_big(m, sha)]  # nothing announced before the upload
    gated.release.set()
    thread.join(60)
    assert "error" not in outcome, outcome
    result = outcome["result"]
    assert result.route is Route.OFFLOADED  # type: ignore[attr-defined]

    big = [m for m in drain(sub, 5) if is_big(m, sha)]
    assert big, "the message never arrived"
    for item in big:  # at least once, and every copy resolves
        assert isinstance(item, Message), item
        assert item.route is Route.OFFLOADED
        assert hashlib.sha256(item.payload).hexdigest() == sha


def test_broker_restart_during_a_chunked_send_delivers_the_message(
    broker: Mosquitto, clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("f/chunks")
    data = os.urandom(2 * MiB)  # about 9 chunks of 256 KiB
    sha = hashlib.sha256(data).hexdigest()
    sub = clients(chunk_timeout=60.0)
    sub.subscribe(topic, qos=1)
    probe = clients()
    pub = clients(automatic_offload=False)
    gated = GatedPayload(data, gate_at=1 * MiB, gate_pass=1)  # pass 0 is the hash
    outcome: dict[str, object] = {}

    def publish() -> None:
        try:
            outcome["result"] = pub.publish(topic, gated, qos=1, timeout=60)
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=publish)
    thread.start()
    assert gated.reached.wait(30), "chunked send never started"
    time.sleep(0.5)  # the chunks before the gate reach the subscriber
    broker.restart()
    wait_until_delivered(sub, probe, topic)
    gated.release.set()
    thread.join(60)
    assert "error" not in outcome, outcome
    assert outcome["result"].route is Route.CHUNKED  # type: ignore[attr-defined]
    big = [m for m in drain(sub, 10) if is_big(m, sha)]
    assert big and all(isinstance(m, Message) for m in big), big
    assert all(m.payload == data for m in big if isinstance(m, Message))


# -- gateway killed ---------------------------------------------------------------------------


@pytest.fixture
def gateway_process(seaweed: SeaweedFS, bucket_name: str) -> Iterator[GatewayProcess]:
    S3Store(
        seaweed.endpoint, bucket_name, access_key=seaweed.access_key, secret_key=seaweed.secret_key
    ).ensure_bucket()
    gw = GatewayProcess(
        {
            "OFFLOAD_STORAGE_URL": seaweed.storage_url(bucket_name),
            "OFFLOAD_S3_ACCESS_KEY": seaweed.access_key,
            "OFFLOAD_S3_SECRET_KEY": seaweed.secret_key,
            "OFFLOAD_S3_PART_SIZE": str(5 * MiB),  # a 12 MiB payload goes multipart
            "OFFLOAD_SWEEP_INTERVAL": "0",
            "OFFLOAD_LOG_LEVEL": "WARNING",
            "OFFLOAD_ALLOW_ANONYMOUS": "true",
        }
    ).start()
    try:
        yield gw
    finally:
        gw.kill()


def test_gateway_killed_mid_upload_serves_nothing_and_the_retry_stores_one_object(
    gateway_process: GatewayProcess, seaweed: SeaweedFS, bucket_name: str
) -> None:
    data = os.urandom(12 * MiB)
    msg_id = MessageId.new()
    gated = GatedPayload(data, gate_at=8 * MiB)  # two 5 MiB parts are in the store by then
    failure: list[BaseException] = []

    def upload() -> None:
        with HttpTransport(timeout=30) as http, PayloadSource(gated) as source:
            try:
                http.upload(gateway_process.url, "f/killed", source, message_id=msg_id)
            except UploadError as exc:
                failure.append(exc)

    thread = threading.Thread(target=upload)
    thread.start()
    assert gated.reached.wait(30)
    time.sleep(0.5)  # let the gateway push what it has to the store
    gateway_process.kill()
    gated.release.set()
    thread.join(60)
    assert failure, "the upload should have failed with the gateway gone"

    gateway_process.start()
    assert bucket_keys(seaweed, bucket_name) == []  # no partial object, no index
    with httpx.Client(base_url=gateway_process.url, timeout=30) as http:
        assert http.get(f"/msg/{msg_id}/payload").status_code == 404

    with HttpTransport(timeout=60) as transport:
        for _ in range(2):  # the retry, and a duplicate retry
            with PayloadSource(data) as source:
                transport.upload(gateway_process.url, "f/killed", source, message_id=msg_id)
        fetched = transport.fetch(
            f"{gateway_process.url}/msg/{msg_id}/payload",
            expected_sha256=hashlib.sha256(data).hexdigest(),
        )
    assert fetched.read() == data
    keys = bucket_keys(seaweed, bucket_name)
    payloads = [k for k in keys if k.startswith("data/") and not k.endswith(".meta.json")]
    assert len(payloads) == 1 and len(keys) == 3, keys


def test_gateway_killed_mid_offload_publishes_no_placeholder(
    gateway_process: GatewayProcess,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
) -> None:
    topic = unique_topic("f/nohalf")
    data = os.urandom(4 * MiB)
    sub = clients()
    sub.subscribe(topic, qos=1)
    pub = clients(endpoint=gateway_process.url, chunking=False)
    gated = GatedPayload(data, gate_at=2 * MiB)
    failure: list[BaseException] = []

    def publish() -> None:
        try:
            pub.publish(topic, gated, qos=1)
        except UploadError as exc:
            failure.append(exc)

    thread = threading.Thread(target=publish)
    thread.start()
    assert gated.reached.wait(30)
    gateway_process.kill()
    gated.release.set()
    thread.join(60)
    assert failure and isinstance(failure[0], UploadError)
    assert drain(sub, 2) == []


# -- consumer side ----------------------------------------------------------------------------


def test_placeholder_whose_object_is_gone_is_payload_not_found(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    seaweed: SeaweedFS,
    bucket_name: str,
) -> None:
    topic = unique_topic("f/gone")
    pub = clients(endpoint=gateway.url)
    result = pub.publish(topic, os.urandom(1 * MiB), qos=1, retain=True)
    assert result.route is Route.OFFLOADED
    store = S3Store(
        seaweed.endpoint, bucket_name, access_key=seaweed.access_key, secret_key=seaweed.secret_key
    )
    for key in bucket_keys(seaweed, bucket_name):  # an operator (or lifecycle rule) deleted it
        store.delete(key)
    sub = clients()
    sub.subscribe(topic, qos=1)  # the retained placeholder arrives now
    items = drain(sub, 5)
    assert len(items) == 1
    error = items[0]
    assert isinstance(error, MessageError)
    assert isinstance(error.error, PayloadNotFound)
    pub.publish(topic, b"", qos=1, retain=True)  # clear the retained placeholder
