"""Issue 29: a chunked (ADR-23) message delivered to a persistent-session consumer is never
lost once its publish returned; against real mosquitto, chunks written by a plain paho
publisher so that the test decides what the broker holds between them.

The soak lost one such message: chunk 0 was acknowledged when the worker took it, chunk 1
waited behind a backlog for longer than `chunk_timeout` (counted from chunk 0), the
partial timed out. Now the timeout counts only while the session delivers nothing, and
chunk acknowledgements wait for their message (docs/connections.md, "Chunked messages").
The pure halves are in test_session_chunks_units.py.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from test_sessions import persistent_broker  # noqa: F401  (a fixture: a broker that saves)

from client import ChunkBufferOverflow, ChunkTimeoutError, Client, Message, MessageError, Route
from client.receive._receive import Receiver

from _aedes import Aedes
from _hostile import RawPublisher
from _servers import Mosquitto

pytestmark = pytest.mark.servers

#: chunk_timeout of the consumers: short, so that a backlog outlasts it quickly.
TIMEOUT = 0.5
WHOLE = b"chunk zero|chunk one"
SHA = hashlib.sha256(WHOLE).hexdigest()


@pytest.fixture(scope="module")
def aedes() -> Iterator[Aedes]:
    """The second broker (MQTT 5 since aedes 2), with mosquitto's 256 KiB limit."""
    server = Aedes(max_packet_size=262144).start()
    yield server
    server.stop()


@pytest.fixture(params=["mosquitto", "aedes"])
def chunk_broker(request: pytest.FixtureRequest) -> Mosquitto | Aedes:
    """Each broker the chunked tests run against (issue 43: mosquitto only before)."""
    broker: Mosquitto | Aedes = request.getfixturevalue(
        "broker" if request.param == "mosquitto" else "aedes"
    )
    return broker


@pytest.fixture
def pub(chunk_broker: Mosquitto | Aedes) -> Iterator[RawPublisher]:
    publisher = RawPublisher(chunk_broker.url)
    yield publisher
    publisher.close()


def _session(broker: Mosquitto | Aedes, client_id: str, **kw: object) -> Client:
    return Client(
        broker.url,
        client_id=client_id,
        session_expiry=600,
        chunk_timeout=TIMEOUT,
        discovery_wait=0,
        **kw,  # type: ignore[arg-type]
    )


def _receiver(client: Client) -> Receiver:
    return client._receiver  # the worker's state, read to wait for it (never changed)


def _until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def _chunk(message_id: str, index: int) -> list[tuple[str, str]]:
    value = f"{message_id}:0:2:{SHA}" if index == 0 else f"{message_id}:{index}"
    return [("__chunk", value)]


def _send_chunk(pub: RawPublisher, topic: str, message_id: str, index: int) -> None:
    part = WHOLE[:10] if index == 0 else WHOLE[10:]
    pub.publish(topic, part, user_properties=_chunk(message_id, index), qos=1)


def test_a_slow_consumer_gets_a_chunked_message_from_behind_a_backlog_longer_than_the_timeout(
    chunk_broker: Mosquitto | Aedes, pub: RawPublisher, unique_topic: Callable[[str], str]
) -> None:
    """Chunk 1 behind 30 messages the application has not read yet, the reading starting
    only after `chunk_timeout` has passed since chunk 0: the message arrives whole."""
    topic = unique_topic("backlog")
    mid = str(uuid.uuid4())
    # A window of 4: the broker sends chunk 0 and 3 messages, the rest waits for the reader.
    with _session(chunk_broker, f"c-{uuid.uuid4().hex[:8]}", max_pending_deliveries=4) as sub:
        sub.subscribe(topic, qos=1)
        _send_chunk(pub, topic, mid, 0)
        backlog = [f"m{i}".encode() for i in range(30)]
        for payload in backlog:
            pub.publish(topic, payload, qos=1)
        _send_chunk(pub, topic, mid, 1)
        receiver = _receiver(sub)
        _until(lambda: receiver._reassembler.partial_messages == 1, "chunk 0 taken")
        opened = time.monotonic()
        # The application is busy elsewhere: nothing read for three timeouts.
        _until(lambda: time.monotonic() > opened + 3 * TIMEOUT, "three timeouts passed")
        seen: list[Message | MessageError] = []
        while not seen or seen[-1].message_id != mid:  # the message, or its error
            item = sub.next_message(30)
            assert item is not None, f"nothing about the chunked message: {seen[-3:]}"
            seen.append(item)
    errors = [i for i in seen if isinstance(i, MessageError)]
    assert errors == []
    assert [i.payload for i in seen[:-1] if isinstance(i, Message)] == backlog
    whole = seen[-1]
    assert isinstance(whole, Message) and whole.payload == WHOLE and whole.message_id == mid


def test_a_consumer_closed_after_chunk_zero_gets_the_message_whole_when_it_comes_back(
    chunk_broker: Mosquitto | Aedes, pub: RawPublisher, unique_topic: Callable[[str], str]
) -> None:
    """A restart of the process mid-message: the broker sends chunk 0 again (it was never
    acknowledged), then chunk 1, published while the consumer was away."""
    topic = unique_topic("restart")
    client_id = f"c-{uuid.uuid4().hex[:8]}"
    mid = str(uuid.uuid4())
    with _session(chunk_broker, client_id) as first:
        first.subscribe(topic, qos=1)
        _send_chunk(pub, topic, mid, 0)
        receiver = _receiver(first)
        _until(lambda: receiver._reassembler.partial_messages == 1, "chunk 0 taken")
    _send_chunk(pub, topic, mid, 1)  # while away
    with _session(chunk_broker, client_id) as second:
        second.subscribe(topic, qos=1)
        item = second.next_message(30)
        assert second.connection.session_present
    assert isinstance(item, Message), item
    assert (item.payload, item.message_id, item.route) == (WHOLE, mid, Route.CHUNKED)


def test_a_broker_restart_between_the_chunks_loses_nothing(
    persistent_broker: Mosquitto,  # noqa: F811
    unique_topic: Callable[[str], str],
) -> None:
    """The soak's setting: chunk 0 taken, then the broker restarts (the consumer is
    disconnected for longer than `chunk_timeout`), chunk 1 comes after it behind the
    broker's resends: the message arrives whole, once, and the session keeps flowing past
    more messages than its window."""
    broker = persistent_broker
    topic = unique_topic("restart")
    mid = str(uuid.uuid4())
    with _session(broker, f"c-{uuid.uuid4().hex[:8]}", max_pending_deliveries=4) as sub:
        sub.subscribe(topic, qos=1)
        first = RawPublisher(broker.url)
        try:
            _send_chunk(first, topic, mid, 0)
            for i in range(6):
                first.publish(topic, f"m{i}".encode(), qos=1)
        finally:
            first.close()
        receiver = _receiver(sub)
        _until(lambda: receiver._reassembler.partial_messages == 1, "chunk 0 taken")
        conn = sub.connection
        before = conn.connections
        stopped = time.monotonic()
        broker.stop()  # SIGTERM: mosquitto saves the session, its queue and in-flight set
        _until(lambda: not conn.connected, "the consumer saw the broker go")
        _until(lambda: time.monotonic() > stopped + 3 * TIMEOUT, "three timeouts passed")
        broker.start()
        _until(lambda: conn.connected and conn.connections > before, "reconnected")
        second = RawPublisher(broker.url)
        try:
            _send_chunk(second, topic, mid, 1)
            for i in range(6, 30):  # more than the window: nothing may hold a place of it
                second.publish(topic, f"m{i}".encode(), qos=1)
        finally:
            second.close()
        seen: list[Message | MessageError] = []
        while not seen or getattr(seen[-1], "payload", None) != b"m29":
            item = sub.next_message(30)
            assert item is not None, f"stalled after {len(seen)} deliveries: {seen[-3:]}"
            seen.append(item)
    assert [i for i in seen if isinstance(i, MessageError)] == []
    chunked = [i for i in seen if isinstance(i, Message) and i.route is Route.CHUNKED]
    assert [(m.payload, m.message_id) for m in chunked] == [(WHOLE, mid)]
    directs = {i.payload for i in seen if isinstance(i, Message) and i.route is Route.DIRECT}
    assert directs == {f"m{i}".encode() for i in range(30)}  # duplicates allowed, none lost


def test_a_chunk_zero_flood_on_a_busy_session_stays_bounded_and_never_stalls(
    chunk_broker: Mosquitto | Aedes, pub: RawPublisher, unique_topic: Callable[[str], str]
) -> None:
    """A hostile publisher sends 40 chunk 0s that never get a chunk 1, each followed by a
    message that keeps the connection busy: at most `max_partial_messages` partials and at
    most half the window of held acknowledgements at any time (more could fill the window
    and stop the session for good; mosquitto 2.0.11 sends past a small Receive Maximum, so
    the bound is asserted rather than the stall), every direct message is delivered, and every
    chunk 0 gets exactly one error: evicted by the bound, or timed out once the connection
    went quiet."""
    topic = unique_topic("flood")
    window, partials, count = 8, 16, 40
    ids = [str(uuid.uuid4()) for _ in range(count)]
    with _session(
        chunk_broker,
        f"c-{uuid.uuid4().hex[:8]}",
        max_pending_deliveries=window,
        max_partial_messages=partials,
    ) as sub:
        sub.subscribe(topic, qos=1)
        receiver = _receiver(sub)
        for i, mid in enumerate(ids):
            _send_chunk(pub, topic, mid, 0)
            pub.publish(topic, f"d{i}".encode(), qos=1)
        seen: list[Message | MessageError] = []
        most_held = most_partial = 0
        failed: set[str | None] = set()
        while failed != set(ids) or b"d39" not in {getattr(i, "payload", b"") for i in seen}:
            item = sub.next_message(30)
            assert item is not None, f"stalled after {len(seen)} deliveries: {seen[-3:]}"
            seen.append(item)
            if isinstance(item, MessageError):
                failed.add(item.message_id)
            most_held = max(most_held, receiver.chunk_acks.held)
            most_partial = max(most_partial, receiver._reassembler.partial_messages)
    directs = [i.payload for i in seen if isinstance(i, Message)]
    assert directs == [f"d{i}".encode() for i in range(count)]
    errors = [i for i in seen if isinstance(i, MessageError)]
    assert sorted(str(e.message_id) for e in errors) == sorted(ids)  # one each
    for error in errors:
        assert isinstance(error.error, ChunkBufferOverflow | ChunkTimeoutError), error
    assert most_held <= window // 2 and most_partial <= partials


def test_held_chunk_acknowledgements_go_out_in_the_order_the_chunks_came(
    broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    """MQTT 5 4.6.0-2: PUBACKs in the order the PUBLISHes came. The second of two
    interleaved chunked messages completes first; its held chunks' acknowledgements used to
    go out before the first message's chunk 0 (mosquitto takes that; the rule does not)."""
    topic = unique_topic("acks")
    client_id = f"c-{uuid.uuid4().hex[:8]}"
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    pub = RawPublisher(broker.url)
    with _session(broker, client_id) as sub:
        sub.subscribe(topic, qos=1)
        for mid, index in ((first, 0), (second, 0), (second, 1), (first, 1)):
            _send_chunk(pub, topic, mid, index)
        pub.close()
        got = [sub.next_message(30), sub.next_message(30)]
        assert [getattr(m, "message_id", m) for m in got] == [second, first]
        acked = rf"Received PUBACK from {client_id} \(Mid: (\d+)"
        _until(lambda: len(re.findall(acked, broker.log())) == 4, "four PUBACKs")
    sent = re.findall(
        rf"Sending PUBLISH to {client_id} \(d0, q1, r0, m(\d+), '{topic}'", broker.log()
    )
    assert len(sent) == 4 and re.findall(acked, broker.log()) == sent
