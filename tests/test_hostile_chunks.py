"""Hostile `__chunk` values against real mosquitto and the real `Client`: bounded bookkeeping.

Reassembly used to count only payload bytes: a chunk 0 declaring 2**32-1 chunks with the
longest expiry, then empty chunks, grew memory without limit and never timed out. Here a
plain paho publisher does exactly that and worse; the subscriber reports or ignores every
hostile chunk, keeps delivering, and its allocations stay bounded.
"""

from __future__ import annotations

import gc
import hashlib
import tracemalloc
import uuid
from collections.abc import Callable, Iterator

import pytest

from client import ChunkBufferOverflow, ChunkTimeoutError, Client, Message, MessageError, Route
from client.protocol._reassembly import chunk_bounds

from _hostile import RawPublisher
from _servers import Mosquitto

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
SHA = hashlib.sha256(b"never").hexdigest()
MAX_U32 = 2**32 - 1
# spool_threshold 1 MiB and max_buffered_bytes 8 MiB on a 256 KiB broker: at most
# 8 MiB / 63 KiB (rounded up) + 1 = 132 chunks per message, and 4096 chunk entries in all
# (1 MiB / 256 B).
BOUNDS = {"spool_threshold": MiB, "max_buffered_bytes": 8 * MiB, "max_chunk_timeout": 2.0}


@pytest.fixture
def broker(mosquitto_factory: Callable[..., Mosquitto]) -> Mosquitto:
    return mosquitto_factory(max_packet_size=262144)


@pytest.fixture
def pub(broker: Mosquitto) -> Iterator[RawPublisher]:
    publisher = RawPublisher(broker.url)
    yield publisher
    publisher.close()


def _drain(client: Client, until: bytes, timeout: float = 60) -> list[Message | MessageError]:
    """Every delivery up to and including the direct message `until`."""
    seen: list[Message | MessageError] = []
    while True:
        item = client.next_message(timeout)
        assert item is not None, f"{until!r} never arrived; got {seen[-5:]}"
        seen.append(item)
        if isinstance(item, Message) and item.payload == until:
            return seen


def _errors(seen: list[Message | MessageError], kind: type) -> list[MessageError]:
    return [i for i in seen if isinstance(i, MessageError) and isinstance(i.error, kind)]


def test_empty_chunk_flood_keeps_memory_bounded(
    broker: Mosquitto, pub: RawPublisher, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("flood")
    with Client(broker.url, discovery_wait=0, **BOUNDS) as sub:  # type: ignore[arg-type]
        sub.subscribe(topic)
        pub.publish(topic, b"warm-up")
        _drain(sub, b"warm-up")
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            # The attack: 2**32-1 chunks, the longest expiry, then empty chunks.
            mid = str(uuid.uuid4())
            first = [("__chunk", f"{mid}:0:{MAX_U32}:{SHA}")]
            pub.publish(topic, b"", user_properties=first, expiry=MAX_U32)
            for index in range(1, 8001):
                pub.publish(topic, b"", user_properties=[("__chunk", f"{mid}:{index}")], qos=0)
            # Without a chunk 0: 70 messages of 130 empty chunks each, interleaved.
            ids = [str(uuid.uuid4()) for _ in range(70)]
            for index in range(1, 131):
                for other in ids:
                    chunk = [("__chunk", f"{other}:{index}")]
                    pub.publish(topic, b"", user_properties=chunk, qos=0)
            pub.publish(topic, b"after the flood")
            seen = _drain(sub, b"after the flood", timeout=120)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    refused = _errors(seen, ChunkBufferOverflow)
    assert any(e.message_id == mid and "beyond the bound" in str(e.error) for e in refused)
    # 64 partial messages of 130 entries would be 8320 entries: the 4096 bound evicts.
    assert any("chunks tracked" in str(e.error) for e in refused)
    # ~17,000 chunk entries went in; what is left is a few thousand, whatever came in.
    print(f"allocations grown by {grown} bytes")  # reported with -s
    assert grown < 4 * MiB, f"{grown} bytes still allocated after the flood"


def test_chunk0_expiry_is_capped_by_max_chunk_timeout(
    broker: Mosquitto, pub: RawPublisher, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("expiry")
    with Client(broker.url, discovery_wait=0, **BOUNDS) as sub:  # type: ignore[arg-type]
        sub.subscribe(topic)
        mid = str(uuid.uuid4())
        # Two chunks declared, one sent, and an expiry of 136 years: capped at 2 seconds.
        pub.publish(topic, b"x", user_properties=[("__chunk", f"{mid}:0:2:{SHA}")], expiry=MAX_U32)
        err = sub.next_message(30)
        pub.publish(topic, b"still here")
        after = _drain(sub, b"still here")
    assert isinstance(err, MessageError) and isinstance(err.error, ChunkTimeoutError), err
    assert err.message_id == mid
    assert isinstance(after[-1], Message)


def test_the_chunk_count_bound_holds_at_its_edge(
    broker: Mosquitto, pub: RawPublisher, unique_topic: Callable[[str], str]
) -> None:
    """A message of exactly the most chunks allowed is delivered; one more is refused at once."""
    per_message, _ = chunk_bounds(max_buffered_bytes=8 * MiB, packet_limit=262144, ram_budget=MiB)
    assert per_message == 132  # 8 MiB / (64 KiB - 1 KiB of headroom), rounded up, + 1
    topic = unique_topic("edge")
    at, over = str(uuid.uuid4()), str(uuid.uuid4())
    whole = b"a" * per_message
    digest = hashlib.sha256(whole).hexdigest()
    over_digest = hashlib.sha256(whole + b"a").hexdigest()
    with Client(broker.url, discovery_wait=0, **BOUNDS) as sub:  # type: ignore[arg-type]
        sub.subscribe(topic)
        pub.publish(
            topic, b"a", user_properties=[("__chunk", f"{over}:0:{per_message + 1}:{over_digest}")]
        )
        pub.publish(topic, b"a", user_properties=[("__chunk", f"{at}:0:{per_message}:{digest}")])
        for index in range(1, per_message):
            pub.publish(topic, b"a", user_properties=[("__chunk", f"{at}:{index}")])
        pub.publish(topic, b"after")
        seen = _drain(sub, b"after")
    assert len(seen) == 3, seen
    refused, delivered, _ = seen
    assert isinstance(refused, MessageError) and refused.message_id == over, refused
    assert isinstance(refused.error, ChunkBufferOverflow) and "beyond the bound" in str(
        refused.error
    )
    assert isinstance(delivered, Message) and delivered.route is Route.CHUNKED, delivered
    assert delivered.payload == whole and delivered.message_id == at
