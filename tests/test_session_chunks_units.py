"""Issue 29, the pure halves: the reassembly clock that follows the session
(`Reassembler.keep_waiting`) and the held chunk acknowledgements (`ChunkAcks`).

The broker-backed halves are in test_session_chunks.py.
"""

from __future__ import annotations

from dataclasses import replace

from test_chunk_codec import ID, ID2, abc_chunks

from client.core._exceptions import ChunkBufferOverflow, ChunkTimeoutError
from client.mqtt._acks import InOrder
from client.protocol._reassembly import Complete, Error, Pending, Reassembler
from client.receive._session_acks import ChunkAcks

# ------------------------------------------------------------------ the reassembly clock


def test_keep_waiting_restarts_the_default_timeout_from_now() -> None:
    r = Reassembler(default_timeout=10)
    a, b, c = abc_chunks()
    r.feed(a, 0.0)
    assert r.next_deadline == 10.0
    for now in (9.0, 18.0, 27.0):  # the session keeps delivering (a backlog, a reconnect)
        r.keep_waiting(now)
        assert r.expire(now + 9.5) == []
    assert r.next_deadline == 37.0
    r.feed(b, 30.0)
    assert isinstance(r.feed(c, 36.0), Complete)  # 36 s after chunk 0, timeout 10 s


def test_without_keep_waiting_the_clock_runs_from_the_first_chunk() -> None:
    r = Reassembler(default_timeout=10)
    a, b, _ = abc_chunks()
    r.feed(a, 0.0)
    r.keep_waiting(-5.0)  # a call from before the message changes nothing
    [err] = r.expire(10.5)
    assert isinstance(err.error, ChunkTimeoutError)
    # A chunk coming after the deadline fails its message even if no sweep ran.
    r2 = Reassembler(default_timeout=10)
    r2.feed(a, 0.0)
    out = r2.feed(b, 10.5)
    assert isinstance(out, Error) and isinstance(out.error, ChunkTimeoutError)


def test_keep_waiting_never_extends_chunk_zeros_message_expiry() -> None:
    """ADR 23: once chunk 0's interval passed, the broker discarded the other chunks."""
    r = Reassembler(default_timeout=1000)
    a, b, _ = abc_chunks()
    r.feed(replace(a, properties=replace(a.properties, message_expiry_interval=5)), 0.0)
    r.keep_waiting(4.0)
    assert r.next_deadline == 5.0
    out = r.feed(b, 5.5)
    assert isinstance(out, Error) and isinstance(out.error, ChunkTimeoutError)


def test_a_busy_session_does_not_lift_the_bounds() -> None:
    """A hostile publisher keeping the connection busy while it opens partials: the oldest
    are still evicted at `max_partial_messages`, each with its own error."""
    r = Reassembler(default_timeout=1, max_partial_messages=2)
    ids = [ID, ID2, "1b4e28ba-2fa1-11d2-883f-0016d3cca427"]
    outcomes = []
    for i, message_id in enumerate(ids):
        r.keep_waiting(float(i))
        outcomes.append(r.feed(abc_chunks(message_id=message_id)[0], float(i)))
    assert [type(o) for o in outcomes] == [Pending, Pending, Pending]
    [evicted] = outcomes[-1].dropped
    assert evicted.message_id == ID and isinstance(evicted.error, ChunkBufferOverflow)
    assert r.partial_messages == 2


# ------------------------------------------------------------------ held acknowledgements


def test_chunks_are_held_until_their_message_is_done() -> None:
    made: list[str] = []
    acks = ChunkAcks(limit=4)
    key = ("t", ID)
    acks.hold(key, 0, lambda: made.append("c0"), 3)
    acks.hold(key, 1, lambda: made.append("c1"), 3)
    assert made == [] and acks.held == 2
    done = acks.done(key, lambda: made.append("c2"))  # chunk 2 completed the message
    assert done is not None and made == [] and acks.held == 0
    done()  # the application took the message
    assert made == ["c0", "c1", "c2"]
    assert acks.done(key, None) is not None and made == ["c0", "c1", "c2"]  # nothing twice


def test_held_chunks_never_fill_the_window() -> None:
    """More held than the limit: the oldest message's chunks go at once (all of them)."""
    made: list[str] = []
    acks = ChunkAcks(limit=3)
    a, b = ("t", ID), ("t", ID2)
    acks.hold(a, 0, lambda: made.append("a0"), 2)
    acks.hold(b, 0, lambda: made.append("b0"), 2)
    acks.hold(b, 1, lambda: made.append("b1"), None)
    assert made == []
    acks.hold(a, 1, lambda: made.append("a1"), None)  # 4 > 3: `a` (the oldest) gives up
    assert made == ["a0", "a1"] and acks.held == 2
    acks.hold(a, 2, lambda: made.append("a2"), None)  # given up: at once from now on
    assert made == ["a0", "a1", "a2"] and acks.held == 2
    b_done = acks.done(b, None)
    assert b_done is not None and acks.held == 0
    b_done()
    assert made == ["a0", "a1", "a2", "b0", "b1"]


def test_a_message_of_more_chunks_than_the_limit_is_not_held() -> None:
    made: list[str] = []
    acks = ChunkAcks(limit=3)
    key = ("t", ID)
    acks.hold(key, 2, lambda: made.append("c2"), None)  # before chunk 0: held
    acks.hold(key, 0, lambda: made.append("c0"), 4)  # 4 chunks cannot all be held
    assert made == ["c2", "c0"] and acks.held == 0


def test_a_chunk_sent_again_keeps_the_new_ack_and_makes_the_old() -> None:
    """After a reconnect the broker sends held chunks again with new packet ids."""
    made: list[str] = []
    acks = ChunkAcks(limit=4)
    key = ("t", ID)
    acks.hold(key, 0, lambda: made.append("old"), 2)
    acks.hold(key, 0, lambda: made.append("new"), 2)
    assert made == ["old"] and acks.held == 1
    done = acks.done(key, None)
    assert done is not None
    done()
    assert made == ["old", "new"]


def test_a_finished_messages_chunk_sent_again_waits_for_its_delivery() -> None:
    """The connection dropped while the whole message waited for the application: the
    broker sends its chunks again; acknowledged only once the application took it (a
    process that dies before gets the message again), later ones at once."""
    made: list[str] = []
    acks = ChunkAcks(limit=4)
    key = ("t", ID)
    acks.hold(key, 0, lambda: made.append("c0"), 2)
    done = acks.done(key, lambda: made.append("c1"))
    acks.late(key, lambda: made.append("c0 again"))
    assert made == []
    assert done is not None
    done()
    assert made == ["c0", "c1", "c0 again"]
    acks.late(key, lambda: made.append("c1 again"))  # taken already: at once
    assert made[-1] == "c1 again"


def test_limit_zero_holds_nothing() -> None:
    made: list[str] = []
    acks = ChunkAcks(limit=0)
    acks.hold(("t", ID), 0, lambda: made.append("c0"), None)
    acks.hold(("t", ID), 1, None, None)  # nothing to acknowledge (QoS 0)
    assert made == ["c0"] and acks.held == 0


def test_keep_waiting_extends_at_most_to_max_timeout_from_the_first_chunk() -> None:
    """A sender that died after chunk 0 on a topic that never goes quiet: still an error."""
    r = Reassembler(default_timeout=10, max_timeout=100)
    a, _, _ = abc_chunks()
    r.feed(a, 0.0)
    r.keep_waiting(95.0)
    assert r.next_deadline == 100.0
    [err] = r.expire(100.5)
    assert isinstance(err.error, ChunkTimeoutError)
    # A default longer than max_timeout is not shortened by it.
    r2 = Reassembler(default_timeout=10, max_timeout=5)
    r2.feed(a, 0.0)
    r2.keep_waiting(3.0)
    assert r2.next_deadline == 10.0


# ------------------------------------------------------------ acknowledgements in order


def test_acknowledgements_go_out_in_arrival_order_whatever_order_they_are_made_in() -> None:
    """MQTT 5 4.6.0-2: the adapter's InOrder sends each only once every earlier one is."""
    sent: list[tuple[int, int]] = []
    acks = InOrder(lambda mid, qos: sent.append((mid, qos)))
    for mid in (7, 3, 9, 4):  # packet ids in the order the PUBLISHes came
        acks.received(1, mid, 2 if mid == 9 else 1)
    acks.made(1, 9)
    acks.made(1, 3)
    assert sent == [] and acks.backlog == 4  # 7 came first and is not made
    acks.made(1, 7)
    assert sent == [(7, 1), (3, 1), (9, 2)] and acks.backlog == 1
    acks.made(1, 4)
    acks.made(1, 4)  # twice, or unknown: nothing more
    acks.made(1, 5)
    assert sent[3:] == [(4, 1)] and acks.backlog == 0
    acks.received(1, 8, 1)
    acks.received(2, 8, 1)  # a new connection: the old one's are the broker's to resend
    acks.made(1, 8)  # made for the old connection's message 8: not this one's
    assert acks.backlog == 1 and sent[4:] == []
    acks.made(2, 8)
    assert sent[4:] == [(8, 1)]


def test_release_oldest_gives_up_the_oldest_held_message_first() -> None:
    made: list[str] = []
    acks = ChunkAcks(limit=10)
    acks.hold(("t", "old"), 0, lambda: made.append("old-0"), None)
    acks.hold(("t", "new"), 0, lambda: made.append("new-0"), None)
    acks.hold(("t", "old"), 1, lambda: made.append("old-1"), None)
    assert acks.release_oldest() and made == ["old-0", "old-1"] and acks.held == 1
    assert acks.release_oldest() and made[2:] == ["new-0"] and acks.held == 0
    assert not acks.release_oldest()
