"""Reassembly with bounded RAM: SpoolingChunkStore under the pure Reassembler, and the client
delivering a chunked message larger than its memory budget as a spooled payload."""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client import ChecksumMismatchError, Client, Message, Route
from client.protocol import PublishProperties
from client.protocol._chunk import split
from client.protocol._reassembly import Complete, Error, Reassembler
from client.receive._chunkstore import SpoolingChunkStore

from _servers import Mosquitto


@dataclass(frozen=True)
class Received:
    topic: str
    payload: bytes
    properties: PublishProperties
    qos: int = 1


def chunks_of(payload: bytes, limit: int = 1200) -> list[Received]:
    return [
        Received("t", data, props)
        for props, data in split(payload, topic="t", qos=1, properties=None, limit=limit)
    ]


def feed(r: Reassembler, chunks: list[Received]) -> list[object]:
    return [r.feed(c, 0.0) for c in chunks]


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_in_order_message_over_the_budget_is_spooled_without_a_copy(tmp_path: Path) -> None:
    store = SpoolingChunkStore(memory_limit=5000, directory=tmp_path)
    r = Reassembler(store=store)
    payload = os.urandom(40_000)
    outs = []
    for c in chunks_of(payload):
        outs.append(r.feed(c, 0.0))
        assert store.memory_bytes <= 5000
    done = outs[-1]
    assert isinstance(done, Complete) and isinstance(done.payload, Path)
    assert done.payload.read_bytes() == payload
    assert done.sha256 == hashlib.sha256(payload).hexdigest() and done.size == len(payload)
    assert leftovers(tmp_path) == [done.payload.name]  # the spool file itself, no copy


def test_out_of_order_with_duplicates_is_reordered_once(tmp_path: Path) -> None:
    store = SpoolingChunkStore(memory_limit=3000, directory=tmp_path)
    r = Reassembler(store=store)
    payload = os.urandom(30_000)
    chunks = chunks_of(payload)
    order = chunks[1:] + chunks[3:6] + chunks[:1]
    random.Random(7).shuffle(order[:-1])
    done = [o for o in feed(r, order) if isinstance(o, Complete)]
    assert len(done) == 1 and isinstance(done[0].payload, Path)
    assert done[0].payload.read_bytes() == payload
    assert leftovers(tmp_path) == [done[0].payload.name]


def test_small_messages_stay_in_memory(tmp_path: Path) -> None:
    r = Reassembler(store=SpoolingChunkStore(memory_limit=1 << 20, directory=tmp_path))
    payload = os.urandom(10_000)
    done = feed(r, chunks_of(payload))[-1]
    assert isinstance(done, Complete) and done.payload == payload
    assert leftovers(tmp_path) == []


def test_checksum_mismatch_leaves_no_file(tmp_path: Path) -> None:
    r = Reassembler(store=SpoolingChunkStore(memory_limit=1000, directory=tmp_path))
    chunks = chunks_of(os.urandom(20_000))
    chunks[2] = Received("t", b"X" * len(chunks[2].payload), chunks[2].properties)
    out = feed(r, chunks)[-1]
    assert isinstance(out, Error) and isinstance(out.error, ChecksumMismatchError)
    assert leftovers(tmp_path) == []


def test_timeouts_evictions_and_close_remove_spool_files(tmp_path: Path) -> None:
    store = SpoolingChunkStore(memory_limit=1000, directory=tmp_path)
    r = Reassembler(store=store, default_timeout=5, max_partial_messages=1)
    a, b = chunks_of(os.urandom(20_000)), chunks_of(os.urandom(20_000))
    feed(r, a[:5])
    spool_a = leftovers(tmp_path)
    assert store.spooled_messages == 1 and len(spool_a) == 1
    evicted = r.feed(b[0], 1.0)  # a second partial evicts the first (max 1)
    assert evicted.dropped
    # a's file is gone; b's first chunk alone is over the budget, so b has its own file.
    assert store.spooled_messages == 1 and leftovers(tmp_path) != spool_a
    feed(r, b[1:4])
    assert r.expire(100.0) and leftovers(tmp_path) == []
    feed(r, chunks_of(os.urandom(20_000))[:3])
    assert len(leftovers(tmp_path)) == 1
    store.close()
    assert leftovers(tmp_path) == []


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    payload=st.binary(min_size=1, max_size=6000),
    limit=st.integers(0, 8000),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_order_and_budget_reassembles_byte_exact(
    tmp_path: Path, payload: bytes, limit: int, seed: int
) -> None:
    r = Reassembler(store=SpoolingChunkStore(memory_limit=limit, directory=tmp_path))
    chunks = chunks_of(payload, limit=400)
    rng = random.Random(seed)
    order = chunks + rng.sample(chunks, k=min(2, len(chunks)))
    rng.shuffle(order)
    done = [o for o in feed(r, order) if isinstance(o, Complete)]
    assert len(done) == 1
    got = done[0].payload
    assert (got.read_bytes() if isinstance(got, Path) else got) == payload
    if isinstance(got, Path):
        got.unlink()
    assert leftovers(tmp_path) == []


@pytest.mark.servers
def test_client_delivers_a_chunked_message_over_its_budget_spooled(
    mosquitto_factory: Callable[..., Mosquitto], unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    broker = mosquitto_factory(max_packet_size=65536)
    topic = unique_topic("spool")
    source = tmp_path / "in.bin"
    source.write_bytes(os.urandom(1024 * 1024 + 5))
    with (
        Client(broker.url, discovery_wait=0, spool_threshold=128 * 1024) as sub,
        Client(broker.url, discovery_wait=0) as pub,
    ):
        sub.subscribe(topic)
        result = pub.publish(topic, source, qos=1)
        assert result.route is Route.CHUNKED and result.packets > 16
        msg = sub.next_message(30)
        assert isinstance(msg, Message) and msg.route is Route.CHUNKED
        assert msg.body.path is not None  # spooled, not held in memory
        assert msg.payload == source.read_bytes()
        assert msg.sha256 == result.sha256
