"""The retention state as values: an account's ledger, a stored payload's record, the groups
file (gateway/retention/_ledger.py, _records.py, _groups.py). Pure: no store."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.protocol import Topic
from gateway.retention import GroupRules, Record, parse_groups
from gateway.retention._ledger import LedgerDoc, Refused
from gateway.retention._records import MAX_REFS, record_account, record_key

MiB = 1024 * 1024


def test_a_hold_is_refused_when_it_would_pass_the_cap() -> None:
    doc = LedgerDoc(user="alice", stored=40 * MiB)
    held = doc.reserve("a", 8 * MiB, until=1, cap=50 * MiB)
    assert isinstance(held, LedgerDoc) and held.used == 48 * MiB
    refused = held.reserve("b", 8 * MiB, until=1, cap=50 * MiB)
    assert isinstance(refused, Refused)
    assert "OFFLOAD_MAX_STORED_BYTES_PER_USER=52428800" in refused.reason()
    assert "'alice'" in refused.reason()
    assert isinstance(held.reserve("b", 2 * MiB, until=1, cap=50 * MiB), LedgerDoc)
    assert isinstance(held.reserve("b", 80 * MiB, until=1, cap=0), LedgerDoc)  # no cap


def test_a_charge_counts_a_hold_once() -> None:
    doc = LedgerDoc().reserve("h", 10, until=1, cap=0)
    assert isinstance(doc, LedgerDoc)
    charged = doc.charge("h", 7)  # the hold becomes what was stored
    assert (charged.stored, charged.held) == (7, 0)
    assert charged.charge("h", 7) == charged  # repeated: the hold is gone, nothing counts


def test_an_uncharge_gives_bytes_back_once_per_event() -> None:
    doc = LedgerDoc(stored=100)
    once = doc.uncharge("e", 30, "blobs/a/b.json", at=5)
    assert once.stored == 70 and "e" in once.journal
    assert once.uncharge("e", 30, "blobs/a/b.json", at=6) == once
    settled = once.settle("e")
    assert settled.journal == {} and settled.stored == 70


def test_holds_lapse_after_their_until() -> None:
    doc = LedgerDoc(holds={"old": (5, 10), "new": (5, 100)})
    assert set(doc.lapse(before=50).holds) == {"new"}
    assert doc.refresh("old", 200).lapse(before=50).holds["old"] == (5, 200)
    assert doc.refresh("gone", 200) == doc


@given(
    st.integers(0, 2**40),
    st.dictionaries(
        st.text(min_size=1, max_size=8), st.tuples(st.integers(0, 2**40), st.integers(0, 2**45))
    ),
)
def test_a_ledger_round_trips(stored: int, holds: dict[str, tuple[int, int]]) -> None:
    doc = LedgerDoc("bob", stored, holds, {"e": (-3, "blobs/x.json", 7)})
    assert LedgerDoc.from_json(doc.to_json()) == doc
    assert doc.to_json() != doc.to_json()  # a nonce: equal ledgers, different versions


@pytest.mark.parametrize(
    "raw", [b"", b"[]", b'{"stored":"x"}', b'{"holds":{}}', b'{"stored":1,"user":3}']
)
def test_a_malformed_ledger_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        LedgerDoc.from_json(raw)


def test_a_record_dies_with_its_last_message_and_is_never_linked_again() -> None:
    record = Record("data/a/x", 3, "ab" * 32, {"m1.t": 1})
    two = record.with_ref("m2.t", 2)
    assert two.linkable and two.without_ref("m1.t", 3).state == "live"
    dying = two.without_ref("m1.t", 3).without_ref("m2.t", 4)
    assert dying.state == "dying" and dying.event and dying.at == 4 and not dying.linkable
    assert Record.from_json(dying.to_json()) == dying


def test_a_full_record_takes_no_more_messages() -> None:
    record = Record("k", 1, "ab" * 32, {f"m{i}.t": 1 for i in range(MAX_REFS)})
    assert record.full and not record.linkable


def test_record_keys_name_their_account() -> None:
    key = record_key("a" * 32, "ab" * 32, 1234, 2)
    assert key.endswith("-1234.2.json") and record_account(key) == "a" * 32
    assert record_account("blobs/x/not-a-record.json") is None
    assert record_account("ids/x.json") is None


GROUPS = """
[topics]
"cameras/#" = ["archive", "analytics"]
"cameras/+/raw" = ["archive", "ml"]

[members]
archive = ["archiver-1"]
"""


def test_the_groups_file_names_every_group_of_every_matching_filter() -> None:
    rules = parse_groups(GROUPS)
    assert rules.groups_for(Topic("cameras/7/raw")) == ("analytics", "archive", "ml")
    assert rules.groups_for(Topic("cameras/7")) == ("analytics", "archive")
    assert rules.groups_for(Topic("sensors/1")) == ()
    assert rules.may_confirm("archive", "archiver-1")
    assert not rules.may_confirm("archive", "mallory")
    assert not rules.may_confirm("archive", None)
    assert rules.may_confirm("analytics", None)  # no members listed: any reader
    assert GroupRules().groups_for(Topic("a")) == ()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[topics]\n'a/#' = 'archive'", "list of names"),
        ("[topics]\n'a/#' = ['bad name']", "group"),
        ("[topics]\n'a/#/b' = ['x']", "a/#/b"),
        ("[users]\nx = 1", "unknown tables"),
        ("topics = 3", "must be a table"),
        ("[topics\n", "Expected"),
        ("[topics]\n" + "\n".join(f"'t/{i}' = ['g{i}']" for i in range(65)), "at most 64"),
    ],
)
def test_a_bad_groups_file_is_refused_naming_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_groups(text)
