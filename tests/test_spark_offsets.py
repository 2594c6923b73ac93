"""The streaming source's offsets (client.spark._offsets): pure, no Spark needed."""

from __future__ import annotations

import pytest

from client.core._exceptions import ConfigError
from client.spark._offsets import Candidate, StreamOffset, advance, initial_offset, positive_ms


def c(token: str, ts: int) -> Candidate:
    return Candidate(f"data/t/date=2026-11-23/hour=10/{token}", token, ts)


def test_a_batch_takes_the_oldest_pending_messages_up_to_the_limit() -> None:
    start = initial_offset(None)
    listed = [c("b", 20), c("a", 10), c("c", 30)]
    first = advance(start, listed, max_files=2, lateness=1000)
    assert [k.rpartition("/")[2] for k in first.batch] == ["a", "b"]
    second = advance(first, listed, max_files=2, lateness=1000)
    assert [k.rpartition("/")[2] for k in second.batch] == ["c"]
    assert advance(second, listed, max_files=2, lateness=1000) is second  # nothing new


def test_a_late_commit_within_lateness_is_delivered_once() -> None:
    offset = advance(initial_offset(None), [c("a", 5_000)], max_files=None, lateness=1000)
    assert offset.floor == 4_000
    # Stamped before the newest delivered message but committed after it.
    late = [c("a", 5_000), c("late", 4_500)]
    offset = advance(offset, late, max_files=None, lateness=1000)
    assert [k.rpartition("/")[2] for k in offset.batch] == ["late"]
    assert advance(offset, late, max_files=None, lateness=1000) is offset


def test_the_floor_never_passes_a_message_still_waiting() -> None:
    listed = [c("a", 0), c("b", 10_000)]
    offset = advance(initial_offset(None), listed, max_files=1, lateness=0)
    assert offset.floor == 0  # "b" is still pending; "a" stays in seen
    offset = advance(offset, listed, max_files=1, lateness=0)
    assert [k.rpartition("/")[2] for k in offset.batch] == ["b"]
    assert offset.floor == 10_000 and set(offset.seen) == {"b"}  # "a" forgotten: below floor


def test_offsets_round_trip_and_foreign_json_is_refused() -> None:
    offset = StreamOffset(5, 9, {"a": 7}, ("data/x",))
    assert StreamOffset.from_json(offset.to_json()) == offset
    for bad in ({}, {"v": 2}, {"v": 1, "floor": "x", "max": 0, "seen": {}, "batch": []}):
        with pytest.raises(ConfigError):
            StreamOffset.from_json(bad)


def test_since_starts_a_new_stream_there() -> None:
    assert initial_offset(1234).floor == 1234


@pytest.mark.parametrize("text", ["-1", "nan", "inf", "soon"])
def test_lateness_must_be_seconds(text: str) -> None:
    with pytest.raises(ConfigError, match="lateness"):
        positive_ms(text, "lateness")


def test_an_undecodable_message_is_batched_once_and_never_moves_the_floor() -> None:
    hour = 1_800_000_000_000 - 1_800_000_000_000 % 3_600_000
    bad = Candidate("data/t/date=x/hour=10/bad", "bad", hour, ("malformed", "sidecar: not JSON"))
    listed = [c("a", hour + 5_000), bad]
    first = advance(initial_offset(hour + 4_000), listed, max_files=1, lateness=1000)
    # Reported first, whatever its hour and the floor; the good message waits its turn.
    assert (first.batch, dict(first.bad)) == ((bad.key,), {bad.key: bad.problem})
    assert (first.floor, first.max, first.skipped) == (hour + 4_000, hour + 4_000, {"bad": hour})
    second = advance(first, listed, max_files=1, lateness=1000)
    assert [k.rpartition("/")[2] for k in second.batch] == ["a"] and not second.bad
    assert advance(second, listed, max_files=1, lateness=1000) is second  # reported once
    assert StreamOffset.from_json(second.to_json()) == second
    # Forgotten once its hour can no longer be listed (the listing starts key_lead below floor).
    later = advance(second, [c("b", hour + 3 * 3_600_000)], max_files=None, lateness=0)
    assert later.skipped == {}
    kept = advance(
        second, [c("b", hour + 3 * 3_600_000)], max_files=None, lateness=0, key_lead=3 * 3_600_000
    )
    assert kept.skipped == {"bad": hour}
