"""The envelope parser's and the value codec's dispatch tables are complete.

A parser state without a reader, or a fixed-size state without a step, would escape
`EnvelopeParser.feed` as a KeyError, which the gateway answers with a 500 instead of a 400;
a type byte without a reader, as an IndexError. These checks fail as soon as a state or a
type is added to one table and not the other. The last test pins the one path that goes
around the tables, the payload fast path in `feed`.
"""

from __future__ import annotations

import pytest

from client.core._exceptions import MalformedEnvelope
from client.protocol._bson_values import FIXED_SIZE, VARIABLE, read_value
from client.protocol._envelope import Complete, PayloadData, PayloadEnd, encode_upload
from client.protocol._envelope_parse import _READERS, _STEPS, EnvelopeParser, _State


def test_every_parser_state_has_a_reader() -> None:
    assert set(_READERS) == set(_State)


def test_exactly_the_fixed_size_states_have_a_step() -> None:
    fixed = {state for state, reader in _READERS.items() if reader is EnvelopeParser._read_fixed}
    assert set(_STEPS) == fixed
    assert _State.PAYLOAD not in fixed and _State.NAME not in fixed


@pytest.mark.parametrize("etype", range(1, 256))
def test_every_type_byte_decodes_or_fails_with_a_reason(etype: int) -> None:
    buf = b"\x05\x00\x00\x00\x00" + b"\x00" * 11
    try:
        _value, end = read_value(etype, buf, 0, len(buf), "f", 0)
    except MalformedEnvelope as exc:
        if etype in FIXED_SIZE or etype in VARIABLE:
            assert "unsupported" not in str(exc)
        else:
            assert "f: unsupported BSON element" in str(exc)
            assert f"(0x{etype:02x})" in str(exc)
        return
    assert etype in FIXED_SIZE or etype in VARIABLE
    assert 0 <= end <= len(buf)


def test_the_payload_fast_path_keeps_event_order_and_ignores_empty_feeds() -> None:
    # A feed wholly inside the payload skips the state tables; it must still report exactly
    # what the tables would: one view per non-empty feed, nothing for an empty one.
    head, tail = encode_upload(10, headers=[])
    parser = EnvelopeParser(max_document=1 << 20)
    parser.feed(head)
    first = parser.feed(b"01234")
    assert [bytes(e.data) for e in first if isinstance(e, PayloadData)] == [b"01234"]
    assert len(first) == 1
    assert parser.feed(b"") == []
    assert parser.feed(memoryview(b"")) == []
    last = parser.feed(b"56789" + tail)
    assert [type(e) for e in last] == [PayloadData, PayloadEnd, Complete]
    assert bytes(last[0].data) == b"56789"  # type: ignore[union-attr]
    parser.end()
