"""The W3C Trace Context codec (client/protocol/_tracecontext.py): vectors, bounds, round trips.

Every `traceparent` and `tracestate` the library, the gateway and the proxy read came from
a peer (an HTTP client, any publisher): what W3C calls invalid is no context, never an
error, and nothing is ever echoed back as it came.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.protocol import (
    Manifest,
    MessageId,
    ProtocolError,
    Topic,
    TraceContext,
    parse_tracestate,
)

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_w3c_example_parses_and_is_written_back_the_same() -> None:
    ctx = TraceContext.parse(VALID, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
    assert ctx is not None
    assert ctx.trace_id_hex == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert ctx.span_id_hex == "00f067aa0ba902b7"
    assert ctx.sampled
    assert ctx.traceparent == VALID
    assert ctx.pairs() == (
        ("traceparent", VALID),
        ("tracestate", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
    )


@pytest.mark.parametrize(
    "value",
    [
        "",
        "00",
        VALID.upper(),  # W3C: lowercase hex only
        VALID[:-1],  # one character short
        VALID + "-",  # version 00 has nothing after its flags
        VALID + "0",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # the forbidden version
        "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",  # later version, no `-`
        VALID + "-" + "a" * 10_000,  # 10 KB: refused before it is scanned
        "cc" + VALID[2:] + "-" + "a" * 10_000,  # a later version would be read: not this long
        "a" * 10_000,
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nX-Injected: 1",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-\uff10\uff10f067aa0ba902b7-01",  # fullwidth 0
    ],
)
def test_what_w3c_calls_invalid_is_no_context(value: str) -> None:
    assert TraceContext.parse(value) is None
    assert TraceContext.parse(value.encode("utf-8")) is None


def test_a_later_version_is_read_by_its_first_55_characters() -> None:
    ctx = TraceContext.parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-new-field")
    assert ctx is not None
    # Written back as version 00 with the flags this codec knows (sampled, random).
    assert ctx.traceparent == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_spaces_around_the_value_are_optional_whitespace() -> None:
    assert TraceContext.parse(f" \t{VALID}\t ") == TraceContext.parse(VALID)


def test_bytes_that_are_not_ascii_are_no_context() -> None:
    assert TraceContext.parse(VALID.encode() + b"\xff") is None
    assert TraceContext.parse(b"\xff" * 55) is None


@pytest.mark.parametrize(
    ("state", "kept"),
    [
        ("rojo=00f067aa0ba902b7", "rojo=00f067aa0ba902b7"),
        (" rojo=1 ,, congo=2\t", "rojo=1,congo=2"),  # optional whitespace, empty members
        ("tenant1@vendor=x", "tenant1@vendor=x"),
        ("Rojo=1", ""),  # keys are lowercase
        ("rojo", ""),
        ("rojo=1,rojo=2", ""),  # a key twice
        ("rojo=a b ", "rojo=a b"),  # the space before the end is whitespace, not the value
        ("rojo=a=b", ""),
        ("rojo=caf\u00e9", ""),
        ("rojo=a,b", ""),
        ("rojo=\x01", ""),
        (",".join(f"k{i}=v" for i in range(33)), ""),  # more than 32 members
        ("k=" + "v" * 600, ""),  # longer than kept
    ],
)
def test_tracestate_is_kept_canonical_or_dropped_whole(state: str, kept: str) -> None:
    assert parse_tracestate(state) == kept
    ctx = TraceContext.parse(VALID, state)
    assert ctx is not None and ctx.tracestate == kept  # the traceparent holds regardless


def test_pairs_from_headers_and_user_properties() -> None:
    assert TraceContext.from_pairs([("TraceParent", VALID)]) == TraceContext.parse(VALID)
    assert TraceContext.from_pairs([("traceparent", VALID), ("traceparent", VALID)]) is None
    assert TraceContext.from_pairs([("tracestate", "a=1")]) is None
    both = TraceContext.from_pairs(
        [("traceparent", VALID.encode()), ("tracestate", b"a=1"), ("tracestate", b"b=2")]
    )
    assert both is not None and both.tracestate == "a=1,b=2"
    huge = TraceContext.from_pairs([("traceparent", VALID)] + [("tracestate", "a=1" * 400)] * 2)
    assert huge is not None and huge.tracestate == ""


@given(
    trace_id=st.integers(1, 2**128 - 1),
    span_id=st.integers(1, 2**64 - 1),
    flags=st.integers(0, 3),
    members=st.lists(
        st.tuples(st.from_regex(r"[a-z][a-z0-9_*/-]{0,10}", fullmatch=True),
                  st.from_regex(r"[!-+\--<>-~]{1,10}", fullmatch=True)),
        max_size=5, unique_by=lambda m: m[0],
    ),
)  # fmt: skip
def test_write_then_parse_is_the_same_context(
    trace_id: int, span_id: int, flags: int, members: list[tuple[str, str]]
) -> None:
    state = ",".join(f"{k}={v}" for k, v in members)
    ctx = TraceContext(trace_id, span_id, flags, state)
    assert TraceContext.from_pairs(ctx.pairs()) == ctx


@given(st.text(max_size=300) | st.binary(max_size=300))
def test_any_input_parses_to_a_context_or_none(value: str | bytes) -> None:
    ctx = TraceContext.parse(value, value)
    if ctx is not None:  # what comes out is the grammar's, whatever came in
        assert TraceContext.parse(ctx.traceparent, ctx.tracestate) == ctx


def test_the_manifest_keeps_a_traceparent_and_reads_a_bad_one_as_none() -> None:
    manifest = Manifest(
        id=MessageId.new(),
        topic=Topic("a/b"),
        timestamp=1,
        size=0,
        sha256="0" * 64,
        data_key="data/a/b/x",
        traceparent=VALID,
    )
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert manifest.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    stored = manifest.to_json().replace(VALID.encode(), b"00-zz")
    assert Manifest.from_json(stored).traceparent is None
    with pytest.raises(ProtocolError):
        Manifest(
            id=MessageId.new(), topic=Topic("a"), timestamp=1, size=0, sha256="0" * 64,
            data_key="data/a/x", traceparent="garbage",
        )  # fmt: skip
