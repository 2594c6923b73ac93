"""The pure parts of retention by group and one object per payload: manifest fields, group
names, confirmation keys (client/protocol/_retention.py, _layout.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.protocol import (
    GROUP_PATTERN,
    Manifest,
    MessageId,
    ProtocolError,
    Topic,
    ack_key,
    check_group,
    data_key,
    meta_key,
    parse_ack_key,
)

TOKEN = "c" * 32
KEY = data_key(Topic("a/b"), 1_700_000_000_000, TOKEN)

groups = st.from_regex(GROUP_PATTERN, fullmatch=True)


def manifest(**fields: object) -> Manifest:
    return Manifest(MessageId.new(), Topic("a/b"), 1, 2, "ab" * 32, KEY, **fields)  # type: ignore[arg-type]


def test_a_manifest_without_the_new_fields_is_written_as_before() -> None:
    """Absent, not null: a reader from before the fields reads the same JSON as ever."""
    doc = manifest().to_json()
    assert b"filed_at" not in doc and b"groups" not in doc and b"blob" not in doc
    assert manifest().home == KEY and manifest().token == TOKEN


@given(st.lists(groups, max_size=5), st.booleans())
def test_the_new_fields_round_trip(names: list[str], linked: bool) -> None:
    home = data_key(Topic("c"), 1_700_000_000_000, "d" * 32) if linked else None
    m = manifest(filed_at=home, groups=tuple(names), blob="blobs/x/y.json")
    assert Manifest.from_json(m.to_json()) == m
    assert meta_key(m.home) == meta_key(home or KEY)


@pytest.mark.parametrize(
    "raw",
    [
        b'"groups":["bad name"]',
        b'"groups":"archive"',
        b'"groups":[7]',
        b'"filed_at":7',
        b'"blob":["x"]',
    ],
)
def test_a_malformed_new_field_is_a_malformed_manifest(raw: bytes) -> None:
    doc = manifest().to_json()[:-1] + b"," + raw + b"}"
    with pytest.raises(ProtocolError):
        Manifest.from_json(doc)


@pytest.mark.parametrize("name", ["", "-a", ".a", "a/b", "a b", "é", "x" * 65, "a\x00"])
def test_group_names_are_key_safe(name: str) -> None:
    with pytest.raises(ProtocolError):
        check_group(name)


@given(groups)
def test_confirmation_keys_round_trip(group: str) -> None:
    message_id = MessageId.new()
    key = ack_key(message_id, TOKEN, group)
    parsed = parse_ack_key(key)
    assert parsed is not None
    assert (parsed.message_id, parsed.token, parsed.group) == (message_id, TOKEN, group)
    assert key.startswith(parsed.prefix)


FIXED_ID = "0b7e1f9c-3a52-4d6e-8f10-2c4b6a8d9e01"


@pytest.mark.parametrize(
    "key",
    [
        "ids/x.json",
        "acks/",
        "acks/not-an-id.tok/g",
        # fixed ids: a test id must be the same on every pytest-xdist worker
        f"acks/{FIXED_ID}/g",
        f"acks/{FIXED_ID}.{TOKEN}/bad name",
        f"acks/{FIXED_ID}.{TOKEN}/g/extra",
    ],
)
def test_other_keys_are_no_confirmation(key: str) -> None:
    assert parse_ack_key(key) is None
