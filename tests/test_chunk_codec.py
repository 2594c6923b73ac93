"""ADR 23 codec: `__chunk` values, chunk plans and the reassembler.

Byte vectors are written by hand from the ADR text; round trips go through our splitter and
both our reassembler and the independent one in `adr23_reference.py`.
"""

from __future__ import annotations

import hashlib
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client.core._exceptions import (
    ChecksumMismatchError,
    ChunkBufferOverflow,
    ChunkTimeoutError,
    MalformedChunk,
    MessageTooLarge,
)
from client.protocol._chunk import (
    CHUNK_PROPERTY,
    ChunkHeader,
    ChunkPlan,
    chunk_header,
    plan_chunks,
    split,
)
from client.protocol._props import PublishProperties
from client.protocol._reassembly import (
    Complete,
    Error,
    MemoryChunkStore,
    PartialKey,
    Pending,
    Reassembler,
)
from client.protocol._size import max_payload, publish_packet_size
from client.protocol._types import MessageId

from adr23_reference import ReassemblyFailed, reassemble

ID = "0f8fad5b-d9cb-469f-a165-70867728950e"
ID2 = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
# SHA-256("abc"), the FIPS 180-2 test vector.
SHA_ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


@dataclass(frozen=True)
class Received:
    """A received PUBLISH as the consumer adapter will hand it over."""

    topic: str
    payload: bytes
    properties: PublishProperties
    qos: int = 1


def chunk(value: str, payload: bytes, topic: str = "t") -> Received:
    return Received(topic, payload, PublishProperties(user_properties=((CHUNK_PROPERTY, value),)))


def abc_chunks(topic: str = "t", message_id: str = ID) -> list[Received]:
    """b"abc" as three hand-written ADR 23 chunks."""
    return [
        chunk(f"{message_id}:0:3:{SHA_ABC}", b"a", topic),
        chunk(f"{message_id}:1", b"b", topic),
        chunk(f"{message_id}:2", b"c", topic),
    ]


# ----------------------------------------------------------------------- `__chunk` values


def test_parse_first_and_other_forms() -> None:
    first = ChunkHeader.parse(f"{ID}:0:3:{SHA_ABC}")
    assert first == ChunkHeader(ID, 0, 3, SHA_ABC)
    assert first.is_first
    assert str(first) == f"{ID}:0:3:{SHA_ABC}"
    other = ChunkHeader.parse(f"{ID}:4294967295")
    assert other == ChunkHeader(ID, 2**32 - 1)
    assert not other.is_first
    assert str(other) == f"{ID}:4294967295"
    assert ChunkHeader.first(MessageId.parse(ID), 3, SHA_ABC.upper()) == first
    assert ChunkHeader.other(ID.upper(), 7) == ChunkHeader(ID, 7)


def test_upper_case_id_and_checksum_are_read_and_normalised() -> None:
    header = ChunkHeader.parse(f"{ID.upper()}:0:1:{SHA_ABC.upper()}")
    assert str(header) == f"{ID}:0:1:{SHA_ABC}"
    # Built directly, a value must already be canonical.
    with pytest.raises(MalformedChunk):
        ChunkHeader(ID.upper(), 1)


@pytest.mark.parametrize(
    "value",
    [
        "",
        ID,
        f"{ID}:",
        f"{ID}:1:",
        f"{ID}:0:3",
        f"{ID}:0:3:{SHA_ABC}:x",
        f"{ID}:01",  # leading zero
        f"{ID}:+1",
        f"{ID}:-1",
        f"{ID}: 1",
        f"{ID}:1 ",
        f"{ID}:1\n",
        f"{ID}:1_0",
        f"{ID}:\u0661",  # ARABIC-INDIC DIGIT ONE: int() would take it
        f"{ID}:4294967296",  # 2**32
        f"{ID}:0",  # chunk 0 must be the long form
        f"{ID}:1:3:{SHA_ABC}",  # only chunk 0 has the long form
        f"{ID}:0:0:{SHA_ABC}",  # no message has zero chunks
        f"{ID}:0:4294967296:{SHA_ABC}",
        f"{ID}:0:3:{SHA_ABC[:-1]}",
        f"{ID}:0:3:{SHA_ABC}0",
        f"{ID}:0:3:{SHA_ABC[:-1]}g",
        f"{ID.replace('-', '')}:1",
        f"{{{ID}}}:1",
        f"urn:uuid:{ID}:1",
        f"{ID[:-1]}:1",
        f"{ID[:-1]}g:1",
        f" {ID}:1",
        f"{ID}:1" + "0" * 200,
    ],
)
def test_malformed_values_are_rejected(value: str) -> None:
    with pytest.raises(MalformedChunk):
        ChunkHeader.parse(value)


def test_non_string_is_malformed() -> None:
    with pytest.raises(MalformedChunk):
        ChunkHeader.parse(b"x")  # type: ignore[arg-type]


@settings(deadline=None)
@given(st.text(max_size=150) | st.from_regex(r"[0-9a-fA-F:\-+ ]{0,130}", fullmatch=True))
def test_junk_parses_or_raises_malformed_chunk(value: str) -> None:
    try:
        header = ChunkHeader.parse(value)
    except MalformedChunk:
        return
    assert str(header) == value.lower()


_headers = st.one_of(
    st.builds(
        ChunkHeader.first,
        st.uuids().map(str),
        st.integers(1, 2**32 - 1),
        st.binary(max_size=8).map(lambda b: hashlib.sha256(b).hexdigest()),
    ),
    st.builds(ChunkHeader.other, st.uuids().map(str), st.integers(1, 2**32 - 1)),
)


@settings(deadline=None)
@given(_headers)
def test_values_round_trip(header: ChunkHeader) -> None:
    assert ChunkHeader.parse(str(header)) == header
    assert ChunkHeader.parse(str(header).upper()) == header


def test_chunk_header_from_properties() -> None:
    assert chunk_header(PublishProperties(user_properties=(("a", "b"),))) is None
    value = f"{ID}:2"
    props = PublishProperties(user_properties=(("a", "b"), (CHUNK_PROPERTY, value)))
    assert chunk_header(props) == ChunkHeader(ID, 2)
    # The same value twice is harmless; two different ones are ambiguous.
    assert chunk_header(props.with_user_properties((CHUNK_PROPERTY, value))) == ChunkHeader(ID, 2)
    with pytest.raises(MalformedChunk):
        chunk_header(props.with_user_properties((CHUNK_PROPERTY, f"{ID}:3")))


# ----------------------------------------------------------------------- splitting


def test_split_hand_vector() -> None:
    # Chunk 0 of b"abc" on topic "t", QoS 0, one payload byte per chunk, by hand:
    # 30 | remaining length | 0001 74 | property length | 26 0007 "__chunk" 0069 <105 chars> | 61
    value0 = f"{ID}:0:3:{SHA_ABC}"
    assert len(value0) == 0x69
    props = bytes([0x26]) + b"\x00\x07__chunk" + b"\x00\x69" + value0.encode()
    body = b"\x00\x01t" + bytes([len(props)]) + props + b"a"
    packet = bytes([0x30, len(body)]) + body
    assert len(packet) == 124
    limit = len(packet)

    chunks = split(b"abc", topic="t", qos=0, properties=None, limit=limit, message_id=ID)
    assert chunks == [
        (PublishProperties(user_properties=((CHUNK_PROPERTY, value0),)), b"a"),
        (PublishProperties(user_properties=((CHUNK_PROPERTY, f"{ID}:1"),)), b"b"),
        (PublishProperties(user_properties=((CHUNK_PROPERTY, f"{ID}:2"),)), b"c"),
    ]
    first_props = chunks[0][0]
    assert publish_packet_size("t", 1, qos=0, properties=first_props) == len(packet)
    with pytest.raises(MessageTooLarge):
        split(b"abc", topic="t", qos=0, properties=None, limit=limit - 1, message_id=ID)


ORIGINAL = PublishProperties(
    payload_format_indicator=1,
    message_expiry_interval=120,
    content_type="text/plain",
    response_topic="reply/to",
    correlation_data=b"\x01\x02",
    user_properties=(("trace", "abc"), ("$partition", "3"), ("trace", "def")),
)


def test_properties_of_first_and_other_chunks() -> None:
    plan = plan_chunks(
        topic="big/one",
        payload_size=10_000,
        sha256_hex=SHA_ABC,
        message_id=ID,
        qos=1,
        properties=ORIGINAL,
        limit=1_000,
    )
    first, second = plan[0].properties, plan[1].properties
    # Everything but the payload format indicator, plus `__chunk` last.
    assert first == replace(
        ORIGINAL,
        payload_format_indicator=None,
        user_properties=(
            *ORIGINAL.user_properties,
            (CHUNK_PROPERTY, f"{ID}:0:{plan.total}:{SHA_ABC}"),
        ),
    )
    assert second == PublishProperties(
        message_expiry_interval=120,
        user_properties=(("$partition", "3"), (CHUNK_PROPERTY, f"{ID}:1")),
    )
    with pytest.raises(ValueError):
        plan_chunks(
            topic="t",
            payload_size=10,
            sha256_hex=SHA_ABC,
            message_id=ID,
            qos=1,
            properties=ORIGINAL.with_user_properties((CHUNK_PROPERTY, "x")),
            limit=1_000,
        )


def check_plan(plan: ChunkPlan, limit: int) -> None:
    """Every chunk fits, all but the last have the same size, and it is the largest possible."""
    indices = sorted(
        {0, 1, 2, plan.total // 2, plan.total - 2, plan.total - 1} & set(range(plan.total))
    )
    offset_end = 0
    for i in indices:
        c = plan[i]
        assert c.index == i
        assert c.offset == i * plan.chunk_size
        size = publish_packet_size(plan.topic, c.length, qos=plan.qos, properties=c.properties)
        assert size <= limit
        if i < plan.total - 1:
            assert c.length == plan.chunk_size
        else:
            offset_end = c.offset + c.length
            assert 0 < c.length <= plan.chunk_size or plan.payload_size == 0
    assert offset_end == plan.payload_size
    # Tight: one more byte per chunk would overflow chunk 0 or the last (the longest header).
    tight = [plan[0]] + ([plan[plan.total - 1]] if plan.total > 1 else [])
    assert any(
        publish_packet_size(plan.topic, plan.chunk_size + 1, qos=plan.qos, properties=c.properties)
        > limit
        for c in tight
    )
    assert (
        str(chunk_header(plan[0].properties)) == f"{plan.message_id}:0:{plan.total}:{plan.sha256}"
    )


def test_chunk_count_crossing_a_digit_boundary_shrinks_the_chunks() -> None:
    common = {"topic": "t", "sha256_hex": SHA_ABC, "message_id": ID, "qos": 1, "properties": None}
    c = plan_chunks(payload_size=1, limit=800, **common).chunk_size  # type: ignore[arg-type]
    nine = plan_chunks(payload_size=9 * c, limit=800, **common)  # type: ignore[arg-type]
    assert (nine.total, nine.chunk_size) == (9, c)
    # One more byte needs a 10th chunk; "10" is one character longer than "9" in chunk 0's
    # value, so every chunk loses one byte of room.
    ten = plan_chunks(payload_size=9 * c + 1, limit=800, **common)  # type: ignore[arg-type]
    assert (ten.total, ten.chunk_size) == (10, c - 1)
    check_plan(nine, 800)
    check_plan(ten, 800)


def test_plan_for_a_huge_payload_is_lazy_and_exact() -> None:
    plan = plan_chunks(
        topic="t",
        payload_size=5 * 2**40,  # 5 TiB: only the chunks looked at are ever built
        sha256_hex=SHA_ABC,
        message_id=ID,
        qos=1,
        properties=ORIGINAL,
        limit=256 * 1024,
    )
    assert len(plan) == plan.total > 20_000_000
    check_plan(plan, 256 * 1024)


def test_limits_that_cannot_work() -> None:
    with pytest.raises(MessageTooLarge):  # no room for the headers at all
        plan_chunks(
            topic="t",
            payload_size=10,
            sha256_hex=SHA_ABC,
            message_id=ID,
            qos=1,
            properties=ORIGINAL,
            limit=100,
        )
    with pytest.raises(MessageTooLarge):  # would need more than 2**32-1 chunks
        plan_chunks(
            topic="t",
            payload_size=2**40,
            sha256_hex=SHA_ABC,
            message_id=ID,
            qos=0,
            properties=None,
            limit=200,
        )


@settings(deadline=None)
@given(
    payload_size=st.integers(0, 10**9),
    limit=st.integers(170, 70_000),
    qos=st.sampled_from([0, 1, 2]),
    topic=st.text(st.characters(codec="utf-8"), min_size=1, max_size=30),
)
def test_plans_fit_and_are_tight(payload_size: int, limit: int, qos: int, topic: str) -> None:
    try:
        plan = plan_chunks(
            topic=topic,
            payload_size=payload_size,
            sha256_hex=SHA_ABC,
            message_id=ID,
            qos=qos,
            properties=None,
            limit=limit,
        )
    except MessageTooLarge:
        # Only when the largest first-chunk header leaves no room, or too many chunks.
        return
    check_plan(plan, limit)


# ----------------------------------------------------------------------- the reference


def test_reference_reassembles_hand_written_chunks() -> None:
    msgs = [(c.payload, list(c.properties.user_properties)) for c in abc_chunks()]
    assert reassemble(msgs) == b"abc"
    assert reassemble([msgs[2], msgs[0], msgs[1], msgs[2]]) == b"abc"
    with pytest.raises(ReassemblyFailed, match="checksum"):
        reassemble([msgs[0], (b"B", msgs[1][1]), msgs[2]])
    with pytest.raises(ReassemblyFailed):
        reassemble(msgs[:2])
    with pytest.raises(ReassemblyFailed):
        reassemble(msgs[1:])


# ----------------------------------------------------------------------- reassembly


def feed_all(r: Reassembler, chunks: list[Received], now: float = 0.0) -> list[object]:
    return [r.feed(c, now) for c in chunks]


def test_hand_written_chunks_in_any_order() -> None:
    for order in ([0, 1, 2], [2, 1, 0], [1, 0, 2], [2, 0, 1]):
        r = Reassembler()
        chunks = abc_chunks()
        outcomes = feed_all(r, [chunks[i] for i in order])
        assert all(isinstance(o, Pending) for o in outcomes[:-1])
        done = outcomes[-1]
        assert isinstance(done, Complete)
        assert (done.topic, done.payload, done.message_id, done.qos) == ("t", b"abc", ID, 1)
        assert done.properties == PublishProperties()
        assert (r.partial_messages, r.buffered_bytes) == (0, 0)


def test_pending_reports_progress_and_duplicates() -> None:
    r = Reassembler()
    a, b, c = abc_chunks()
    assert r.feed(b, 0) == Pending("t", ID, 1, 1, None)
    assert r.feed(b, 0) == Pending("t", ID, 1, 1, None, duplicate=True)
    assert r.feed(a, 0) == Pending("t", ID, 0, 2, 3)
    assert r.buffered_bytes == 2
    assert isinstance(r.feed(c, 0), Complete)
    # Late duplicates of a finished message are ignored, and leave nothing to time out.
    for late in (a, b, c):
        assert r.feed(late, 1) == Pending("t", ID, late_index(late), 0, None, duplicate=True)
    assert r.partial_messages == 0
    assert r.expire(10**9) == []


def late_index(c: Received) -> int:
    header = chunk_header(c.properties)
    assert header is not None
    return header.index


def test_complete_carries_the_original_properties_of_chunk_zero() -> None:
    payload = bytes(range(256)) * 20
    chunks = split(payload, topic="x/y", qos=1, properties=ORIGINAL, limit=600, message_id=ID)
    assert len(chunks) > 10
    r = Reassembler()
    outcomes = [r.feed(Received("x/y", data, props), 5.0) for props, data in reversed(chunks)]
    done = outcomes[-1]
    assert isinstance(done, Complete)
    assert done.payload == payload
    assert done.properties == replace(ORIGINAL, payload_format_indicator=None)


def test_corrupt_chunk_is_a_checksum_mismatch_never_a_payload() -> None:
    r = Reassembler()
    a, b, c = abc_chunks()
    r.feed(a, 0)
    r.feed(replace(b, payload=b"B"), 0)
    out = r.feed(c, 0)
    assert isinstance(out, Error)
    assert isinstance(out.error, ChecksumMismatchError)
    assert out.error.expected == SHA_ABC
    assert out.error.actual == hashlib.sha256(b"aBc").hexdigest()
    assert out.message_id == ID
    assert (r.partial_messages, r.buffered_bytes) == (0, 0)
    # The correct chunk arriving afterwards cannot resurrect it.
    assert r.feed(b, 1).duplicate  # type: ignore[union-attr]


def test_timeout_from_the_first_chunks_message_expiry_interval() -> None:
    r = Reassembler(default_timeout=1000)
    a, b, _ = abc_chunks()
    r.feed(b, 100.0)  # first chunk seen: the clock starts here
    assert r.next_deadline == 1100.0
    r.feed(replace(a, properties=replace(a.properties, message_expiry_interval=10)), 105.0)
    assert r.next_deadline == 110.0  # counted from the first chunk seen, not from chunk 0
    assert r.expire(110.0) == []
    [err] = r.expire(110.5)
    assert isinstance(err.error, ChunkTimeoutError)
    assert (err.error.received, err.error.total, err.message_id) == (2, 3, ID)
    assert r.partial_messages == 0 and r.next_deadline is None


def test_default_timeout_without_chunk_zero_or_expiry() -> None:
    r = Reassembler(default_timeout=5)
    _, b, c = abc_chunks()
    r.feed(c, 0.0)
    r.feed(b, 1.0)
    [err] = r.expire(5.5)
    assert isinstance(err.error, ChunkTimeoutError)
    assert (err.error.received, err.error.total) == (2, None)


def test_forever_message_never_times_out_with_no_default() -> None:
    r = Reassembler(default_timeout=None)
    r.feed(abc_chunks()[1], 0.0)
    assert r.next_deadline is None
    assert r.expire(1e12) == []
    assert r.partial_messages == 1


def test_chunk_arriving_after_the_deadline_fails_without_a_sweep() -> None:
    r = Reassembler(default_timeout=5)
    a, b, c = abc_chunks()
    r.feed(a, 0.0)
    r.feed(b, 1.0)
    out = r.feed(c, 6.0)  # would complete, but the 5 s ran out first
    assert isinstance(out, Error) and isinstance(out.error, ChunkTimeoutError)
    assert r.feed(c, 6.0) == Pending("t", ID, 2, 0, None, duplicate=True)


def test_chunk_zero_with_an_already_expired_interval() -> None:
    r = Reassembler(default_timeout=100)
    a, b, _ = abc_chunks()
    r.feed(b, 0.0)
    out = r.feed(replace(a, properties=replace(a.properties, message_expiry_interval=2)), 3.0)
    assert isinstance(out, Error) and isinstance(out.error, ChunkTimeoutError)


def test_too_many_partial_messages_drops_the_oldest() -> None:
    r = Reassembler(max_partial_messages=2)
    ids = [ID, ID2, "00000000-0000-0000-0000-000000000003"]
    r.feed(abc_chunks(message_id=ids[0])[0], 0)
    r.feed(abc_chunks(message_id=ids[1])[0], 1)
    out = r.feed(abc_chunks(message_id=ids[2])[0], 2)
    assert isinstance(out, Pending)
    [dropped] = out.dropped
    assert dropped.message_id == ids[0] and isinstance(dropped.error, ChunkBufferOverflow)
    assert r.partial_messages == 2
    # The dropped message's remaining chunks are ignored rather than starting over.
    assert r.feed(abc_chunks(message_id=ids[0])[1], 3).duplicate  # type: ignore[union-attr]
    assert r.partial_messages == 2
    for c in abc_chunks(message_id=ids[1])[1:]:
        last = r.feed(c, 4)
    assert isinstance(last, Complete) and last.payload == b"abc"


def test_byte_limit_drops_older_messages_then_the_message_itself() -> None:
    r = Reassembler(max_buffered_bytes=4)
    r.feed(abc_chunks(message_id=ID)[0], 0)  # 1 byte
    r.feed(chunk(f"{ID2}:1", b"xyz"), 1)  # 3 bytes: 4 in all
    out = r.feed(chunk(f"{ID2}:2", b"!"), 2)  # 5 > 4: the oldest other message goes
    assert isinstance(out, Pending)
    assert [e.message_id for e in out.dropped] == [ID]
    assert r.buffered_bytes == 4
    big = r.feed(chunk(f"{ID2}:3", b"12"), 3)  # cannot fit even alone: dropped itself
    assert isinstance(big, Error) and isinstance(big.error, ChunkBufferOverflow)
    assert big.message_id == ID2
    assert (r.partial_messages, r.buffered_bytes) == (0, 0)


def test_inconsistent_chunks_are_malformed() -> None:
    r = Reassembler()
    r.feed(chunk(f"{ID}:5", b"x"), 0)
    out = r.feed(chunk(f"{ID}:0:3:{SHA_ABC}", b"a"), 0)  # index 5 >= totalChunks 3
    assert isinstance(out, Error) and isinstance(out.error, MalformedChunk)

    r = Reassembler()
    r.feed(chunk(f"{ID}:0:3:{SHA_ABC}", b"a"), 0)
    out = r.feed(chunk(f"{ID}:3", b"x"), 0)
    assert isinstance(out, Error) and isinstance(out.error, MalformedChunk)

    r = Reassembler()
    r.feed(chunk(f"{ID}:0:3:{SHA_ABC}", b"a"), 0)
    out = r.feed(chunk(f"{ID}:0:4:{SHA_ABC}", b"a"), 0)
    assert isinstance(out, Error) and isinstance(out.error, MalformedChunk)
    assert r.partial_messages == 0

    out = Reassembler().feed(chunk(f"{ID}:01", b"a"), 0)
    assert isinstance(out, Error) and out.message_id is None
    assert isinstance(out.error, MalformedChunk)
    with pytest.raises(ValueError):
        Reassembler().feed(Received("t", b"", PublishProperties()), 0)


def test_same_id_on_two_topics_are_two_messages() -> None:
    r = Reassembler()
    outs = [
        r.feed(c, 0) for pair in zip(abc_chunks("a"), abc_chunks("b"), strict=True) for c in pair
    ]
    done = [o for o in outs if isinstance(o, Complete)]
    assert sorted(d.topic for d in done) == ["a", "b"]


class SpoolStore:
    """A ChunkStore that keeps chunks in files: proves the store can be swapped."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, key: PartialKey) -> Path:
        return self.root / hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]

    def put(self, key: PartialKey, index: int, data: bytes) -> None:
        self._dir(key).mkdir(exist_ok=True)
        (self._dir(key) / str(index)).write_bytes(data)

    def take(self, key: PartialKey, count: int) -> Iterator[bytes]:
        for index in range(count):
            path = self._dir(key) / str(index)
            data = path.read_bytes()
            path.unlink()
            yield data

    def discard(self, key: PartialKey) -> None:
        shutil.rmtree(self._dir(key), ignore_errors=True)


def test_reassembler_with_a_spooling_store(tmp_path: Path) -> None:
    r = Reassembler(store=SpoolStore(tmp_path))
    a, b, c = abc_chunks()
    r.feed(c, 0)
    r.feed(a, 0)
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["0", "2"]
    done = r.feed(b, 0)
    assert isinstance(done, Complete) and done.payload == b"abc"
    assert list(tmp_path.iterdir()) == []


def test_memory_store_forgets() -> None:
    store = MemoryChunkStore()
    store.put(("t", ID), 0, b"a")
    store.put(("t", ID), 1, b"b")
    assert list(store.take(("t", ID), 2)) == [b"a", b"b"]
    store.discard(("t", ID))
    store.discard(("t", "unknown"))


# ----------------------------------------------------------------------- properties


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    payload=st.binary(max_size=4000),
    limit=st.integers(330, 1500),
    qos=st.sampled_from([0, 1, 2]),
    extra=st.lists(st.tuples(st.text(max_size=5), st.text(max_size=5)), max_size=3),
    seed=st.integers(0, 2**32),
)
def test_split_shuffle_duplicate_reassemble(
    payload: bytes, limit: int, qos: int, extra: list[tuple[str, str]], seed: int
) -> None:
    original = replace(ORIGINAL, user_properties=ORIGINAL.user_properties + tuple(extra))
    chunks = split(payload, topic="p/q", qos=qos, properties=original, limit=limit)
    for props, data in chunks:
        assert publish_packet_size("p/q", len(data), qos=qos, properties=props) <= limit
    rng = random.Random(seed)
    received = [Received("p/q", data, props, qos) for props, data in chunks]
    received += rng.choices(received, k=rng.randint(0, len(received)))  # QoS 1 redelivery
    rng.shuffle(received)

    r = Reassembler()
    outcomes = [r.feed(m, 0.0) for m in received]
    done = [o for o in outcomes if isinstance(o, Complete)]
    assert len(done) == 1
    assert all(isinstance(o, Pending) for o in outcomes if o is not done[0])
    assert done[0].payload == payload
    assert done[0].properties == replace(original, payload_format_indicator=None)
    assert (r.partial_messages, r.buffered_bytes) == (0, 0)
    # And the independent reading of ADR 23 agrees.
    assert (
        reassemble([(m.payload, list(m.properties.user_properties)) for m in received]) == payload
    )


@settings(deadline=None)
@given(
    payload=st.binary(min_size=1, max_size=600),
    flip=st.integers(0, 10**6),
    seed=st.integers(0, 2**32),
)
def test_any_single_bit_flip_is_caught(payload: bytes, flip: int, seed: int) -> None:
    chunks = split(payload, topic="t", qos=1, properties=None, limit=200)
    index = flip % len(chunks)
    props, data = chunks[index]
    if not data:
        return
    bit = (flip // len(chunks)) % (len(data) * 8)
    corrupted = bytearray(data)
    corrupted[bit // 8] ^= 1 << (bit % 8)
    chunks[index] = (props, bytes(corrupted))
    random.Random(seed).shuffle(chunks)
    r = Reassembler()
    outcomes = [r.feed(Received("t", d, p), 0) for p, d in chunks]
    assert not any(isinstance(o, Complete) for o in outcomes)
    assert isinstance(outcomes[-1], Error)
    assert isinstance(outcomes[-1].error, ChecksumMismatchError)


def test_max_payload_agrees_with_plan_for_single_chunk() -> None:
    # A payload that fits one chunk is planned as one chunk of exactly its size.
    cap = max_payload(
        "t",
        qos=1,
        properties=PublishProperties(user_properties=((CHUNK_PROPERTY, f"{ID}:0:1:{SHA_ABC}"),)),
        limit=500,
    )
    plan = plan_chunks(
        topic="t",
        payload_size=cap,
        sha256_hex=SHA_ABC,
        message_id=ID,
        qos=1,
        properties=None,
        limit=500,
    )
    assert (plan.total, plan[0].length) == (1, cap)
    plan = plan_chunks(
        topic="t",
        payload_size=0,
        sha256_hex=SHA_ABC,
        message_id=ID,
        qos=1,
        properties=None,
        limit=500,
    )
    assert (plan.total, plan[0].length) == (1, 0)
