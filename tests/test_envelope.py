"""The streaming BSON envelope: encoder -> bytes -> parser, hand-written vectors, interop
with hop-client's vendored `hop.bson` and pymongo's `bson`, and property-based fuzzing."""

from __future__ import annotations

import datetime as dt
import random
import struct
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import bson
import pytest
from bson import SON, Binary, CodecOptions, Regex
from bson.objectid import ObjectId
from hop import bson as hop_bson
from hop.io import Consumer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client.core._exceptions import EnvelopeTooLarge, MalformedEnvelope
from client.protocol._envelope import (
    MAX_BSON_DOCUMENT,
    MAX_DEPTH,
    Complete,
    EnvelopeParser,
    Event,
    PayloadData,
    PayloadEnd,
    PayloadStart,
    encode_download,
    encode_upload,
)
from client.protocol._envelope_fields import (
    DownloadFields,
    UploadFields,
    download_fields,
    upload_fields,
)

LIMIT = 1 << 30
TZ_AWARE: CodecOptions[Any] = CodecOptions(tz_aware=True)


class Parsed:
    """What one parse produced, with the event order checked."""

    def __init__(self, events: Sequence[Event]) -> None:
        self.events = list(events)
        kinds = [type(e) for e in self.events]
        assert kinds.count(PayloadStart) == 1
        assert kinds.count(PayloadEnd) == 1
        assert kinds[-1] is Complete and kinds.count(Complete) == 1
        start, end = kinds.index(PayloadStart), kinds.index(PayloadEnd)
        assert all(k is PayloadData for k in kinds[start + 1 : end])
        assert PayloadData not in kinds[:start] + kinds[end:]
        first = self.events[start]
        assert isinstance(first, PayloadStart)
        self.length = first.length
        self.payload = b"".join(bytes(e.data) for e in self.events if isinstance(e, PayloadData))
        assert len(self.payload) == self.length
        # No empty slices: each PayloadData carries bytes.
        assert all(len(e.data) for e in self.events if isinstance(e, PayloadData))
        last = self.events[-1]
        assert isinstance(last, Complete)
        self.fields = dict(last.fields)
        self.fields_before_payload = dict(first.fields)


def feed_all(doc: bytes, cuts: Iterable[int] = (), **limits: int) -> Parsed:
    parser = EnvelopeParser(
        max_document=limits.get("max_document", LIMIT),
        **{k: v for k, v in limits.items() if k != "max_document"},
    )
    events: list[Event] = []
    prev = 0
    for cut in [*sorted(cuts), len(doc)]:
        events += parser.feed(doc[prev:cut])
        prev = cut
    parser.end()
    return Parsed(events)


def one_byte_feeds(doc: bytes) -> Parsed:
    return feed_all(doc, range(len(doc)))


def random_cuts(doc: bytes, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return rnd.sample(range(len(doc) + 1), k=min(len(doc) + 1, rnd.randint(1, 12)))


def parse_error(doc: bytes, **limits: int) -> MalformedEnvelope:
    """Parse `doc` whole and byte by byte; both must fail with the same message."""
    messages = []
    for cuts in ((), range(len(doc))):
        with pytest.raises(MalformedEnvelope) as info:
            feed_all(doc, cuts, **limits)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    return info.value


def upload_doc(payload: bytes, **kwargs: Any) -> bytes:
    head, tail = encode_upload(len(payload), **kwargs)
    return head + payload + tail


def download_doc(payload: bytes, **kwargs: Any) -> bytes:
    head, tail = encode_download(len(payload), **kwargs)
    return head + payload + tail


def cstr(name: bytes) -> bytes:
    return name + b"\x00"


def doc_of(*elements: bytes) -> bytes:
    body = b"".join(elements)
    return struct.pack("<i", len(body) + 5) + body + b"\x00"


def binary(name: bytes, value: bytes, subtype: int = 0) -> bytes:
    return b"\x05" + cstr(name) + struct.pack("<iB", len(value), subtype) + value


# --------------------------------------------------------------------------- vectors

# {headers: [["a", b"b"]], key: b"k", message: b"xy"}, written out byte by byte.
UPLOAD_VECTOR = bytes.fromhex(
    "48000000"  # document length 72
    "04"
    "6865616465727300"  # array "headers"
    "1f000000"  # headers array: 31 bytes
    "04"
    "3000"
    "17000000"  # [0]: array of 23 bytes
    "02"
    "3000"
    "02000000"
    "6100"  # [0][0] = "a"
    "05"
    "3100"
    "01000000"
    "00"
    "62"  # [0][1] = b"b"
    "00"  # end of pair
    "00"  # end of headers
    "05"
    "6b657900"
    "01000000"
    "00"
    "6b"  # key = b"k"
    "05"
    "6d65737361676500"
    "02000000"
    "00"  # message: binary of 2, subtype 0
    "7879"  # payload
    "00"  # end of document
)

# {metadata: {timestamp: 1, headers: [], topic: "t"}, message: b""}.
DOWNLOAD_VECTOR = bytes.fromhex(
    "50000000"  # document length 80
    "03"
    "6d6574616461746100"
    "33000000"  # document "metadata", 51 bytes
    "12"
    "74696d657374616d7000"
    "0100000000000000"  # int64 timestamp = 1
    "04"
    "6865616465727300"
    "0500000000"  # headers = []
    "02"
    "746f70696300"
    "02000000"
    "7400"  # topic = "t"
    "00"  # end of metadata
    "05"
    "6d65737361676500"
    "00000000"
    "00"  # message: empty binary
    "00"
)


def test_upload_vector_encodes_and_parses() -> None:
    assert upload_doc(b"xy", headers=[("a", b"b")], key=b"k") == UPLOAD_VECTOR
    parsed = one_byte_feeds(UPLOAD_VECTOR)
    assert parsed.payload == b"xy"
    assert parsed.fields == {"headers": [["a", b"b"]], "key": b"k"}
    assert upload_fields(parsed.fields) == UploadFields(headers=(("a", b"b"),), key=b"k")
    assert bson.decode(UPLOAD_VECTOR) == {"headers": [["a", b"b"]], "key": b"k", "message": b"xy"}


def test_download_vector_encodes_and_parses() -> None:
    doc = download_doc(b"", timestamp_ms=1, headers=[], key=None, topic="t")
    assert doc == DOWNLOAD_VECTOR
    parsed = one_byte_feeds(DOWNLOAD_VECTOR)
    assert parsed.payload == b""
    assert parsed.events[-3:-1] == [PayloadStart(0), PayloadEnd()]
    assert download_fields(parsed.fields) == DownloadFields(
        timestamp_ms=1, headers=(), key=None, topic="t"
    )


def test_head_tail_lengths_make_content_length() -> None:
    head, tail = encode_upload(10**9, headers=[("_id", bytes(16))], key=None)
    assert struct.unpack_from("<i", head)[0] == len(head) + 10**9 + len(tail)
    assert tail == b"\x00"
    # the payload length sits right before the payload
    assert struct.unpack_from("<i", head, len(head) - 5)[0] == 10**9


# --------------------------------------------------------------------------- round trips

HEADERS = [("_id", uuid.uuid4().bytes), ("_format", b"blob"), ("dup", b"1"), ("dup", b"")]


@pytest.mark.parametrize("payload", [b"", b"p", bytes(range(256)) * 40])
@pytest.mark.parametrize("key", [None, b"", b"the key"])
def test_upload_round_trip_every_slicing(payload: bytes, key: bytes | None) -> None:
    doc = upload_doc(payload, headers=HEADERS, key=key)
    expected = UploadFields(headers=tuple(HEADERS), key=key)
    runs = [one_byte_feeds(doc), feed_all(doc)]
    runs += [feed_all(doc, random_cuts(doc, seed)) for seed in range(20)]
    for parsed in runs:
        assert parsed.payload == payload
        assert upload_fields(parsed.fields) == expected
        # our encoder puts the fields first, so they are known before the payload
        assert parsed.fields_before_payload == parsed.fields


@pytest.mark.parametrize("key", [None, b"k\x00ey"])
def test_download_round_trip_every_slicing(key: bytes | None) -> None:
    payload = b"\x00\xff" * 5000
    doc = download_doc(payload, timestamp_ms=-5, headers=HEADERS, key=key, topic="a/b/€")
    expected = DownloadFields(timestamp_ms=-5, headers=tuple(HEADERS), key=key, topic="a/b/€")
    for parsed in [one_byte_feeds(doc), *(feed_all(doc, random_cuts(doc, s)) for s in range(20))]:
        assert parsed.payload == payload
        assert download_fields(parsed.fields) == expected


def test_payload_slices_view_the_fed_buffer_without_copying() -> None:
    payload = bytes(range(256)) * 4096
    head, tail = encode_upload(len(payload), headers=[], key=None)
    parser = EnvelopeParser(max_document=LIMIT)
    assert parser.feed(head) == [PayloadStart(len(payload))]
    chunk = bytearray(payload[:65536])
    events = parser.feed(chunk)
    assert len(events) == 1 and isinstance(events[0], PayloadData)
    view = events[0].data
    assert isinstance(view, memoryview) and view.readonly and view.obj is chunk
    # mixed buffer: the payload's end and the tail in one feed, sliced not copied
    rest = memoryview(payload[65536:] + tail)
    events = parser.feed(rest)
    assert isinstance(events[0], PayloadData) and isinstance(events[0].data, memoryview)
    assert events[0].data.obj is rest.obj and len(events[0].data) == len(payload) - 65536
    assert [type(e) for e in events[1:]] == [PayloadEnd, Complete]
    parser.end()


def test_payload_length_is_known_before_its_bytes_when_message_comes_first() -> None:
    doc = hop_bson.dumps({"message": b"x" * 100, "headers": [("_id", bytes(16))]})
    parser = EnvelopeParser(max_document=LIMIT)
    header_end = doc.index(b"message\x00") + 8 + 5
    assert parser.feed(doc[:header_end]) == [PayloadStart(100)]


def test_feed_accepts_non_byte_memoryviews_and_empty_feeds() -> None:
    doc = upload_doc(b"abcdefgh", headers=[], key=None)
    parser = EnvelopeParser(max_document=LIMIT)
    assert parser.feed(b"") == []
    events = parser.feed(memoryview(doc[:-9]))
    events += parser.feed(memoryview(doc[-9:-1]).cast("B", (2, 4)))  # 2-D view of the payload
    events += parser.feed(bytearray(doc[-1:]))
    parser.end()
    assert Parsed(events).payload == b"abcdefgh"


# --------------------------------------------------------------------------- hop-client interop


def hop_producer_body(message: bytes, headers: list[tuple[str, Any]], key: Any = None) -> bytes:
    """The body `hop.io.Producer._offload_message` POSTs (hop-client 0.13)."""
    data_raw: dict[str, Any] = {"message": message, "headers": headers}
    if key is not None:
        data_raw["key"] = key
    return hop_bson.dumps(data_raw)  # type: ignore[no-any-return]


@pytest.mark.parametrize("key", [None, b"kafka-key"])
def test_parses_hop_client_upload(key: bytes | None) -> None:
    msg_id = uuid.uuid4().bytes
    headers = [("_id", msg_id), ("_sender", b"alice"), ("_test", b"true"), ("_format", b"json")]
    message = b'{"content": "' + b"x" * 3000 + b'"}'
    doc = hop_producer_body(message, headers, key)
    for parsed in [one_byte_feeds(doc), *(feed_all(doc, random_cuts(doc, s)) for s in range(10))]:
        assert parsed.payload == message
        assert parsed.fields_before_payload == {}  # hop puts message first
        fields = upload_fields(parsed.fields)
        assert fields == UploadFields(headers=tuple(headers), key=key)
        assert dict(fields.headers)["_id"] == msg_id


def test_parses_hop_client_string_header_values_and_dict_headers() -> None:
    # hop's Producer.write accepts "string-like" values; its BSON writes them as strings.
    doc = hop_bson.dumps(
        {"message": b"m", "headers": {"_id": str(uuid.UUID(bytes=bytes(16))), "n": "€"}, "key": "k"}
    )
    fields = upload_fields(one_byte_feeds(doc).fields)
    assert fields.headers == (("_id", b"00000000-0000-0000-0000-000000000000"), ("n", "€".encode()))
    assert fields.key == b"k"


@pytest.mark.parametrize("key", [None, b"", b"k"])
def test_hop_client_accepts_our_download(key: bytes | None) -> None:
    headers = [("_id", uuid.uuid4().bytes), ("_format", b"blob"), ("x", b"")]
    payload = bytes(range(256)) * 10
    doc = download_doc(payload, timestamp_ms=1_700_000_000_123, headers=headers, key=key, topic="t")
    decoded = hop_bson.loads(doc)
    assert Consumer._check_bson_message_structure(decoded, "http://gw/msg/x") is None
    assert decoded["message"] == payload
    meta = decoded["metadata"]
    assert meta["timestamp"] == 1_700_000_000_123
    assert [tuple(h) for h in meta["headers"]] == headers
    assert meta.get("key", None) == key  # what hop's Consumer hands to ExternalMessage
    assert meta["topic"] == "t"


def test_hop_client_accepts_download_without_headers() -> None:
    decoded = hop_bson.loads(download_doc(b"", timestamp_ms=0, headers=[], key=None, topic="t"))
    assert Consumer._check_bson_message_structure(decoded, "u") is None
    assert decoded["metadata"]["headers"] == []


def test_hop_client_rejects_a_download_without_metadata_as_we_do() -> None:
    # the check we rely on is real: a bare upload document is not a valid download
    doc = upload_doc(b"x", headers=[], key=None)
    assert Consumer._check_bson_message_structure(hop_bson.loads(doc), "u") is not None
    with pytest.raises(MalformedEnvelope, match="'metadata' must be a document"):
        download_fields(one_byte_feeds(doc).fields)


# --------------------------------------------------------------------------- pymongo interop


def test_pymongo_reads_our_documents() -> None:
    doc = upload_doc(b"payload", headers=HEADERS, key=b"k")
    assert bson.decode(doc) == {
        "headers": [list(h) for h in HEADERS],
        "key": b"k",
        "message": b"payload",
    }
    doc = download_doc(b"p", timestamp_ms=2**40, headers=[("a", b"b")], key=b"k", topic="t")
    assert bson.decode(doc) == {
        "metadata": {"timestamp": 2**40, "headers": [["a", b"b"]], "key": b"k", "topic": "t"},
        "message": b"p",
    }


def test_parses_pymongo_documents_with_extra_fields_and_old_binary() -> None:
    when = dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=dt.UTC)
    extra = {
        "n": None,
        "t": True,
        "f": 1.5,
        "i": -7,
        "big": 2**40,
        "when": when,
        "nested": {"list": [1, "two", [b"3"]], "empty": {}},
    }
    doc = bson.encode(
        SON(
            [
                ("key", Binary(b"k", 2)),
                ("message", Binary(b"old", 2)),
                ("headers", {"_id": bytes(16)}),
                *extra.items(),
            ]
        )
    )
    parsed = one_byte_feeds(doc)
    assert parsed.payload == b"old"
    assert parsed.fields == {"key": b"k", "headers": {"_id": bytes(16)}, **extra}
    assert upload_fields(parsed.fields) == UploadFields(headers=(("_id", bytes(16)),), key=b"k")


# --------------------------------------------------------------------------- malformed input


def element_doc(*elements: bytes) -> bytes:
    """A document with `elements` and a valid one-byte message."""
    return doc_of(*elements, binary(b"message", b"m"))


MALFORMED = {
    "short length": (b"\x04\x00\x00\x00", "declared document length 4 is less than 5"),
    "negative length": (b"\xff\xff\xff\xff", "declared document length -1"),
    "no message": (doc_of(binary(b"key", b"k")), "no 'message' field"),
    "message is a string": (
        doc_of(b"\x02message\x00\x02\x00\x00\x00x\x00"),
        "'message' must be a binary, got string (0x02)",
    ),
    "message subtype": (doc_of(binary(b"message", bytes(16), 4)), "subtype 4 is not supported"),
    "message user subtype": (doc_of(binary(b"message", b"", 0x80)), "subtype 128"),
    "message negative length": (
        doc_of(b"\x05message\x00\xfe\xff\xff\xff\x00"),
        "'message' has negative binary length -2",
    ),
    "message past the end": (
        doc_of(b"\x05message\x00\x10\x00\x00\x00\x00abc"),
        "'message' of 16 bytes at byte 18 runs past the end of the 22-byte document",
    ),
    "old binary inner length": (
        doc_of(b"\x05message\x00\x05\x00\x00\x00\x02\x09\x00\x00\x00x"),
        "inner length does not match",
    ),
    "duplicate message": (
        doc_of(binary(b"message", b"a"), binary(b"message", b"b")),
        "duplicate field 'message'",
    ),
    "duplicate field": (
        element_doc(binary(b"key", b"a"), binary(b"key", b"b")),
        "duplicate field 'key'",
    ),
    "duplicate nested key": (
        element_doc(b"\x03headers\x00" + doc_of(binary(b"a", b""), binary(b"a", b""))),
        "headers: duplicate key 'a'",
    ),
    "array keys out of order": (
        element_doc(b"\x04headers\x00" + doc_of(binary(b"1", b""))),
        "array key '1' where '0' belongs",
    ),
    "document shorter than declared": (
        struct.pack("<i", 100) + binary(b"message", b"") + b"\x00" + bytes(80),
        "document ends after 19 bytes but declares 100",
    ),
    "document longer than declared": (
        struct.pack("<i", 10) + binary(b"message", b"") + b"\x00",
        "element name is not NUL-terminated within the 10-byte document",
    ),
    "no terminator": (
        struct.pack("<i", 19) + binary(b"message", b"") + b"\x01",
        "document does not end with NUL",
    ),
    "trailing bytes": (
        upload_doc(b"x", headers=[], key=None) + b"junk",
        "trailing bytes after the 34-byte document",
    ),
    "name without NUL": (
        struct.pack("<i", 9) + b"\x05abc\x00",
        "not NUL-terminated within the 9-byte",
    ),
    "invalid UTF-8 name": (element_doc(binary(b"\xff\xfe", b"")), "element name b'\\xff\\xfe'"),
    "invalid UTF-8 nested name": (
        element_doc(b"\x03m\x00" + doc_of(binary(b"\xc3", b""))),
        "m: element name b'\\xc3' is not valid UTF-8",
    ),
    "invalid UTF-8 string": (
        element_doc(b"\x02s\x00\x02\x00\x00\x00\xff\x00"),
        "s: string is not valid UTF-8",
    ),
    "string without NUL": (
        element_doc(b"\x02s\x00\x02\x00\x00\x00ab"),
        "s: string is not NUL-terminated",
    ),
    "negative string length": (
        element_doc(b"\x02s\x00\xff\xff\xff\xff"),
        "field 's': string length -1 is less than 1",
    ),
    "nested string too long": (
        element_doc(b"\x03d\x00" + doc_of(b"\x02s\x00\x40\x00\x00\x00ab\x00")),
        "d.s: string length 64 does not fit its container",
    ),
    "negative binary length": (
        element_doc(b"\x05k\x00\x80\x00\x00\x80\x00"),
        "negative binary length -2147483520",
    ),
    "subdocument too short": (element_doc(b"\x03d\x00\x04\x00\x00\x00"), "length 4 is less than 5"),
    "field past the end": (
        struct.pack("<i", 30) + b"\x05k\x00\x40\x00\x00\x00\x00" + bytes(30),
        "field 'k' needs 65 bytes at byte 11, past the end of the 30-byte document",
    ),
    "regex": (element_doc(bson.encode({"r": Regex("a")})[4:-1]), "unsupported BSON element regex"),
    "ObjectId": (
        element_doc(bson.encode({"o": ObjectId()})[4:-1]),
        "field 'o': unsupported BSON element ObjectId (0x07)",
    ),
    "nested decimal128": (
        element_doc(b"\x03d\x00" + doc_of(b"\x13x\x00" + bytes(16))),
        "d.x: unsupported BSON element decimal128 (0x13)",
    ),
    "bad bool": (element_doc(b"\x08b\x00\x02"), "b: bool byte must be 0 or 1, got 2"),
    "nested binary subtype": (
        element_doc(b"\x04h\x00" + doc_of(binary(b"0", bytes(16), 3))),
        "h[0]: binary subtype 3 is not supported",
    ),
    "datetime out of range": (
        element_doc(b"\x09w\x00" + struct.pack("<q", 2**62)),
        "w: datetime 4611686018427387904 ms is out of range",
    ),
    "nested terminator early": (
        element_doc(b"\x03d\x00\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00"),
        "d: terminator at byte 4 of 10",
    ),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_documents_fail_with_a_reason(name: str) -> None:
    doc, reason = MALFORMED[name]
    error = parse_error(doc)
    assert type(error) is MalformedEnvelope
    assert reason in str(error)


def test_nesting_is_bounded() -> None:
    inner = doc_of()
    for _ in range(MAX_DEPTH + 1):
        inner = doc_of(b"\x03d\x00" + inner)
    assert f"nested deeper than {MAX_DEPTH} levels" in str(parse_error(element_doc(inner[4:-1])))
    for _ in range(1):  # MAX_DEPTH levels are fine
        ok = doc_of()
        for _ in range(MAX_DEPTH - 1):
            ok = doc_of(b"\x03d\x00" + ok)
        assert "x" in one_byte_feeds(element_doc(b"\x03x\x00" + ok)).fields


def test_too_large_is_raised_on_the_length_alone() -> None:
    parser = EnvelopeParser(max_document=1000)
    assert parser.feed(b"\xe9\x03") == []
    with pytest.raises(EnvelopeTooLarge, match=r"document larger than 1000 bytes \(1001 bytes\)"):
        parser.feed(b"\x00\x00")  # 1001 would be legal BSON, over our limit
    with pytest.raises(EnvelopeTooLarge):  # a failed parser stays failed
        parser.feed(b"")
    with pytest.raises(EnvelopeTooLarge):
        parser.end()
    EnvelopeParser(max_document=1001).feed(b"\xe9\x03\x00\x00")  # exactly at the limit


def test_fields_are_bounded_before_they_are_buffered() -> None:
    big = upload_doc(b"x", headers=[("h", bytes(5000))], key=None)
    error = parse_error(big, max_fields=4096)
    assert isinstance(error, EnvelopeTooLarge)
    assert "fields other than message larger than 4096 bytes" in str(error)
    # the binary's declared length trips the bound before its bytes arrive
    parser = EnvelopeParser(max_document=LIMIT, max_fields=4096)
    start = big.index(b"\x051\x00") + 3
    with pytest.raises(EnvelopeTooLarge):
        parser.feed(big[: start + 4])
    # a long name is cut off too, the payload does not count
    error = parse_error(element_doc(binary(b"n" * 5000, b"")), max_fields=4096)
    assert isinstance(error, EnvelopeTooLarge)
    payload = bytes(100_000)
    assert one_byte_feeds(upload_doc(payload, headers=[], key=None)).payload == payload
    parsed = feed_all(upload_doc(payload, headers=[("h", bytes(3000))], key=None), max_fields=4096)
    assert parsed.payload == payload


@pytest.mark.parametrize(
    ("doc", "reason"),
    [
        (b"", "empty body"),
        (b"\x05\x00", "truncated before the document length"),
        (UPLOAD_VECTOR[:-1], "truncated: 71 of 72 declared bytes"),
        (UPLOAD_VECTOR[:30], "truncated: 30 of 72 declared bytes"),
    ],
)
def test_end_reports_truncation(doc: bytes, reason: str) -> None:
    assert reason in str(parse_error(doc))


def test_parser_rejects_bad_limits() -> None:
    with pytest.raises(ValueError, match="max_document"):
        EnvelopeParser(max_document=0)
    with pytest.raises(ValueError, match="max_fields"):
        EnvelopeParser(max_document=100, max_fields=True)


# --------------------------------------------------------------------------- field validation


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"headers": 3}, "headers must be an array of [string, binary] pairs, got 3"),
        ({"headers": None}, "headers must be an array"),
        ({"headers": [["a"]]}, "header 0 must be a [string, binary] pair"),
        ({"headers": [[1, b"x"]]}, "header 0 must be a [string, binary] pair"),
        ({"headers": [["a", 1]]}, "header 'a' value must be a binary or string, got int"),
        ({"headers": {"a": None}}, "header 'a' value must be a binary or string, got NoneType"),
        ({"key": 5}, "key must be a binary, got int"),
    ],
)
def test_upload_fields_reject_wrong_types(fields: dict[str, Any], reason: str) -> None:
    with pytest.raises(MalformedEnvelope) as info:
        upload_fields(fields)
    assert reason in str(info.value)


def test_upload_fields_defaults() -> None:
    assert upload_fields({}) == UploadFields(headers=(), key=None)
    assert upload_fields({"key": None, "other": 1}) == UploadFields(headers=(), key=None)


GOOD_META: dict[str, Any] = {"timestamp": 1, "headers": [], "topic": "t"}


@pytest.mark.parametrize(
    ("meta", "reason"),
    [
        (None, "'metadata' must be a document"),
        ({"headers": [], "topic": "t"}, "metadata.timestamp is missing"),
        ({**GOOD_META, "timestamp": "1"}, "metadata.timestamp must be an integer, got str"),
        ({**GOOD_META, "timestamp": True}, "metadata.timestamp must be an integer, got bool"),
        ({**GOOD_META, "timestamp": 2**63}, "metadata.timestamp must be an int64"),
        ({**GOOD_META, "headers": {"a": b""}}, "got a document"),
        ({**GOOD_META, "headers": [["a", "s"]]}, "header 'a' value must be a binary, got str"),
        ({**GOOD_META, "key": "k"}, "key must be a binary, got str"),
        ({**GOOD_META, "topic": b"t"}, "metadata.topic must be a string, got bytes"),
        ({"timestamp": 1, "headers": []}, "metadata.topic is missing"),
    ],
)
def test_download_fields_reject_wrong_types(meta: Any, reason: str) -> None:
    with pytest.raises(MalformedEnvelope) as info:
        download_fields({"metadata": meta})
    assert reason in str(info.value)


def test_field_values_validate_themselves() -> None:
    with pytest.raises(MalformedEnvelope):
        UploadFields(headers=(("a", "b"),), key=None)  # type: ignore[arg-type]
    with pytest.raises(MalformedEnvelope):
        DownloadFields(timestamp_ms=1, headers=(), key=None, topic=None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- encoder input


DOWNLOAD_ARGS: dict[str, Any] = {"timestamp_ms": 0, "headers": [], "key": None, "topic": "t"}


@pytest.mark.parametrize(
    ("encode", "args", "reason"),
    [
        (encode_upload, {"payload_len": -1, "headers": []}, "non-negative int, got -1"),
        (encode_upload, {"payload_len": True, "headers": []}, "non-negative int, got True"),
        (encode_upload, {"headers": [("a", "text")]}, "header 'a' value must be bytes"),
        (encode_upload, {"headers": [(b"a", b"")]}, "header 0 name must be a string"),
        (encode_upload, {"headers": [("a",)]}, "header 0 must be a (name, value) pair"),
        (encode_upload, {"headers": [], "key": "k"}, "key must be bytes, got str"),
        (encode_upload, {"headers": [("\ud800", b"")]}, "not valid UTF-8"),
        (encode_download, {**DOWNLOAD_ARGS, "timestamp_ms": 1.0}, "must be an int, got float"),
        (encode_download, {**DOWNLOAD_ARGS, "timestamp_ms": 2**63}, "does not fit an int64"),
        (encode_download, {**DOWNLOAD_ARGS, "topic": None}, "topic must be a string"),
        (encode_download, {**DOWNLOAD_ARGS, "topic": "\udfff"}, "topic is not valid UTF-8"),
    ],
)
def test_encoders_reject_bad_input(encode: Any, args: dict[str, Any], reason: str) -> None:
    args = {"payload_len": 0, **args}
    with pytest.raises(MalformedEnvelope) as info:
        encode(args.pop("payload_len"), **args)
    assert reason in str(info.value)


def test_encoders_refuse_what_bson_cannot_carry() -> None:
    with pytest.raises(EnvelopeTooLarge, match="BSON payload larger than 2147483647"):
        encode_upload(MAX_BSON_DOCUMENT + 1, headers=[])
    # length 4 + empty headers 14 + message header 14 + terminator 1
    largest = MAX_BSON_DOCUMENT - 33
    with pytest.raises(EnvelopeTooLarge, match="BSON document larger than 2147483647"):
        encode_upload(largest + 1, headers=[])
    head, tail = encode_upload(largest, headers=[])
    assert len(head) + largest + len(tail) == MAX_BSON_DOCUMENT
    assert struct.unpack_from("<i", head)[0] == MAX_BSON_DOCUMENT


def test_encoders_accept_bytes_like_values() -> None:
    loose: Any = {"headers": [("a", bytearray(b"v"))], "key": memoryview(b"k")}
    head, _ = encode_upload(0, **loose)
    assert head == encode_upload(0, headers=[("a", b"v")], key=b"k")[0]


# --------------------------------------------------------------------------- properties

header_lists = st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=24)), max_size=5)
keys = st.none() | st.binary(max_size=16)
cut_lists = st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=8)


@settings(max_examples=200, deadline=None)
@given(payload=st.binary(max_size=300), headers=header_lists, key=keys, cuts=cut_lists)
def test_property_upload_round_trip(
    payload: bytes, headers: list[tuple[str, bytes]], key: bytes | None, cuts: list[int]
) -> None:
    doc = upload_doc(payload, headers=headers, key=key)
    parsed = feed_all(doc, {c % (len(doc) + 1) for c in cuts})
    assert parsed.payload == payload
    assert upload_fields(parsed.fields) == UploadFields(headers=tuple(headers), key=key)
    # and hop-client's own encoding of the same upload parses alike
    hop_parsed = feed_all(hop_producer_body(payload, headers, key), cuts=())
    assert upload_fields(hop_parsed.fields) == UploadFields(headers=tuple(headers), key=key)


@settings(max_examples=200, deadline=None)
@given(
    payload=st.binary(max_size=300),
    ts=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    headers=header_lists,
    key=keys,
    topic=st.text(max_size=20),
    cuts=cut_lists,
)
def test_property_download_round_trip(
    payload: bytes,
    ts: int,
    headers: list[tuple[str, bytes]],
    key: bytes | None,
    topic: str,
    cuts: list[int],
) -> None:
    doc = download_doc(payload, timestamp_ms=ts, headers=headers, key=key, topic=topic)
    parsed = feed_all(doc, {c % (len(doc) + 1) for c in cuts})
    expected = DownloadFields(timestamp_ms=ts, headers=tuple(headers), key=key, topic=topic)
    assert parsed.payload == payload
    assert download_fields(parsed.fields) == expected
    assert Consumer._check_bson_message_structure(hop_bson.loads(doc), "u") is None


# Values of every supported type, as pymongo encodes and decodes them.
bson_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=10)
    | st.binary(max_size=10)
    | st.datetimes(
        min_value=dt.datetime(1, 1, 1),
        max_value=dt.datetime(9999, 12, 31),
        timezones=st.just(dt.UTC),
    ).map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000))
)
bson_values = st.recursive(
    bson_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=6).filter(lambda s: "\x00" not in s), inner, max_size=4)
    ),
    max_leaves=12,
)
field_names = st.text(max_size=8).filter(lambda s: "\x00" not in s and s != "message")


@settings(max_examples=200, deadline=None)
@given(
    fields=st.dictionaries(field_names, bson_values, max_size=5),
    position=st.integers(min_value=0, max_value=5),
    payload=st.binary(max_size=50),
    seed=st.integers(min_value=0, max_value=1000),
)
def test_property_matches_pymongo_on_any_supported_document(
    fields: dict[str, Any], position: int, payload: bytes, seed: int
) -> None:
    items = list(fields.items())
    items.insert(min(position, len(items)), ("message", payload))
    doc = bson.encode(SON(items))
    parsed = feed_all(doc, random_cuts(doc, seed))
    assert parsed.payload == payload
    expected = bson.decode(doc, codec_options=TZ_AWARE)
    del expected["message"]
    assert parsed.fields == expected


def valid_documents() -> st.SearchStrategy[bytes]:
    return st.builds(
        lambda p, h, k: upload_doc(p, headers=h, key=k), st.binary(max_size=40), header_lists, keys
    ) | st.builds(lambda p, h: hop_producer_body(p, h), st.binary(max_size=40), header_lists)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    doc=valid_documents(),
    edits=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), max_size=4),
    cut=st.integers(min_value=0),
    extra=st.binary(max_size=4),
)
def test_property_corrupted_documents_only_raise_malformed(
    doc: bytes, edits: list[tuple[int, int]], cut: int, extra: bytes
) -> None:
    data = bytearray(doc)
    for where, value in edits:
        data[where % len(data)] = value
    data = data[: cut % (len(data) + 1)] + extra if cut % 3 == 0 else data
    assert_only_malformed(bytes(data))


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200), cuts=cut_lists)
def test_property_arbitrary_bytes_only_raise_malformed(data: bytes, cuts: list[int]) -> None:
    assert_only_malformed(data, [c % (len(data) + 1) for c in cuts])


def assert_only_malformed(data: bytes, cuts: Iterable[int] = ()) -> None:
    """Any outcome is fine except another exception type, a hang, or a wrong success."""
    try:
        parsed = feed_all(data, cuts, max_document=1 << 16, max_fields=1 << 12)
    except MalformedEnvelope:
        return
    # When it parses, pymongo agrees it is one BSON document with this payload.
    decoded = bson.decode(data, codec_options=TZ_AWARE)
    assert decoded.pop("message") in (parsed.payload, Binary(parsed.payload, 2))


def test_fuzz_corpus_replays_cleanly() -> None:
    # The atheris harness's committed corpus: its inputs reach every parser state.
    from fuzz.fuzz_envelope import replay

    assert replay() > 100
