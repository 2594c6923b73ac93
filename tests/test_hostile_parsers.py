"""The first parsers hostile bytes meet: they fail with their own error, whatever the input.

Pure property tests (no servers): the end-to-end proof is tests/test_hostile_publisher.py;
these pin the contract of each parser so that a change cannot quietly let another exception
type out (paho's thread dies on any exception a callback raises).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client import ChunkBufferOverflow, ChunkTimeoutError, MalformedPlaceholder
from client.core._exceptions import MalformedDiscoveryRecord
from client.protocol import ChunkFailure, PublishProperties, Reassembler, mqtt_string_problem
from client.protocol._bounded import http_origin, json_depth_exceeds, loads_object
from client.protocol._placeholder import MAX_PLACEHOLDER_BYTES, is_tagged, parse
from client.protocol._reassembly import Pending, chunk_bounds
from discovery import DiscoveryRecord

TAGGED = PublishProperties(user_properties=(("_format", "external"),))
SHA = hashlib.sha256(b"x").hexdigest()

nested = st.integers(0, 40000).flatmap(
    lambda n: st.sampled_from([b"[" * n, b'{"a":' * n, b'{"_format":"external","x":' + b"[" * n])
)
hostile_bytes = st.one_of(st.binary(max_size=400), nested)


@settings(max_examples=200, deadline=None)
@given(data=hostile_bytes)
def test_placeholder_parsing_fails_only_as_malformed(data: bytes) -> None:
    is_tagged(data, PublishProperties())  # never raises at all
    with contextlib.suppress(MalformedPlaceholder):
        parse(data, TAGGED)


@settings(max_examples=200, deadline=None)
@given(data=hostile_bytes)
def test_discovery_record_parsing_fails_only_as_malformed(data: bytes) -> None:
    with contextlib.suppress(MalformedDiscoveryRecord):
        DiscoveryRecord.from_json(data)


@settings(max_examples=300, deadline=None)
@given(
    url=st.text(max_size=300) | st.sampled_from(["http://[gw/", "http://gw:99999/", "http://g\tw/"])
)
def test_url_checks_fail_only_as_value_error(url: str) -> None:
    try:
        origin = http_origin(url)
    except ValueError:
        return
    assert origin.scheme in ("http", "https") and origin.host and 0 < origin.port < 65536


@pytest.mark.parametrize("depth", [16, 17, 32000])
def test_depth_is_checked_before_decoding(depth: int) -> None:
    doc = b'{"a":' * depth + b"1" + b"}" * depth
    assert json_depth_exceeds(doc, 16) is (depth > 16)
    if depth > 16:
        with pytest.raises(ValueError, match="nested deeper"):
            loads_object(doc, max_bytes=1 << 20)
    # Brackets inside strings are text, not nesting.
    assert loads_object(json.dumps({"s": "[" * depth}).encode(), max_bytes=1 << 20)


def test_oversized_placeholder_is_not_decoded() -> None:
    body = b'{"_format":"external","pad":"' + b" " * MAX_PLACEHOLDER_BYTES + b'"}'
    assert not is_tagged(body, PublishProperties())
    with pytest.raises(MalformedPlaceholder, match="more than"):
        parse(body, TAGGED)


class _Chunk:
    def __init__(self, value: str, payload: bytes = b"", expiry: int | None = None) -> None:
        self.topic = "t"
        self.payload = payload
        self.qos = 0
        self.properties = PublishProperties(
            user_properties=(("__chunk", value),), message_expiry_interval=expiry
        )


def test_reassembly_bounds_chunk_count_entries_and_timeout() -> None:
    per_message, tracked = chunk_bounds(
        max_buffered_bytes=8 << 20, packet_limit=262144, ram_budget=1 << 16
    )
    assert (per_message, tracked) == (132, 256)
    r = Reassembler(
        max_buffered_bytes=8 << 20,
        max_chunks_per_message=per_message,
        max_tracked_chunks=tracked,
        max_timeout=5.0,
    )
    mid = str(uuid.uuid4())
    out = r.feed(_Chunk(f"{mid}:0:{2**32 - 1}:{SHA}", expiry=2**32 - 1), 0.0)
    assert isinstance(out, ChunkFailure) and isinstance(out.error, ChunkBufferOverflow)
    assert r.partial_messages == 0
    later = r.feed(_Chunk(f"{mid}:5"), 0.0)
    assert isinstance(later, Pending) and later.duplicate  # its later chunks are ignored
    # Empty chunks cost entries: the tracked bound evicts the oldest message.
    ids = [str(uuid.uuid4()) for _ in range(3)]
    dropped = []
    for index in range(1, 101):
        for other in ids:
            dropped.extend(r.feed(_Chunk(f"{other}:{index}"), 0.0).dropped)
            assert r.tracked_chunks <= tracked
    assert dropped and all("chunks tracked" in str(d.error) for d in dropped)
    # A chunk 0 asking for 136 years gets max_timeout.
    first = str(uuid.uuid4())
    r.feed(_Chunk(f"{first}:0:2:{SHA}", b"x", expiry=2**32 - 1), 100.0)
    expired = r.expire(106.0)
    assert any(isinstance(e.error, ChunkTimeoutError) and e.message_id == first for e in expired)


def _refused_by_rule(code: int) -> bool:
    """MQTT 5 1.5.4 as written: controls, surrogates, non-characters."""
    return (
        code < 0x20
        or 0x7F <= code <= 0x9F
        or 0xD800 <= code <= 0xDFFF
        or 0xFDD0 <= code <= 0xFDEF
        or (code & 0xFFFE) == 0xFFFE
    )


def test_mqtt_string_check_refuses_exactly_the_disallowed_code_points() -> None:
    """Every code point, alone and after an allowed prefix: the check is the rule."""
    for code in range(0x110000):
        expected = _refused_by_rule(code)
        problem = mqtt_string_problem(f"a/{chr(code)}")
        assert (problem is not None) == expected, hex(code)
        if expected:
            assert f"U+{code:04X}" in problem
