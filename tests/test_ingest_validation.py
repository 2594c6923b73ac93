"""The pure checks every upload path shares: MQTT property rules, media types, digits.

Hand-written vectors plus hypothesis: whatever the upload checks accept must be something
mosquitto accepts in a PUBLISH (the HTTP-level tests in test_ingest_broker.py show it live).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.protocol import PublishProperties
from client.protocol._props import mqtt_text_problem, publish_properties_problem
from gateway.core._errors import BadRequest
from gateway.ingest._media import is_inline, parse_content_type, served_type
from gateway.ingest._options import parse_ascii_int


@pytest.mark.parametrize(
    "props",
    [
        PublishProperties(content_type="text/plain\r\n"),
        PublishProperties(content_type="a\x00b"),
        PublishProperties(content_type="\x85"),
        PublishProperties(content_type="\ufdd0"),
        PublishProperties(content_type="x" * 65536),
        PublishProperties(response_topic="replies/#"),
        PublishProperties(response_topic=""),
        PublishProperties(response_topic="a\nb"),
        PublishProperties(correlation_data=b"x" * 65536),
        PublishProperties(user_properties=(("k", "v\r\n"),)),
        PublishProperties(user_properties=(("k\t", "v"),)),
        PublishProperties(user_properties=(("k", "\ud800"),)),
        PublishProperties(message_expiry_interval=2**32),
        PublishProperties(payload_format_indicator=2),
        PublishProperties(topic_alias=0),  # paho refused it when it packed them
        PublishProperties(topic_alias=65536),
    ],
)
def test_properties_a_broker_refuses_are_named(props: PublishProperties) -> None:
    assert publish_properties_problem(props) is not None


def test_ordinary_properties_pass() -> None:
    props = PublishProperties(
        payload_format_indicator=1,
        message_expiry_interval=2**32 - 1,
        content_type="application/json; charset=utf-8",
        response_topic="replies/1",
        correlation_data=b"\x00" * 65535,
        user_properties=(("k", "ünïcode ✓"), ("k", "dup"), ("empty", "")),
    )
    assert publish_properties_problem(props) is None
    assert mqtt_text_problem("x" * 65535, "v") is None


@given(st.text(max_size=300))
def test_an_accepted_content_type_is_a_valid_mqtt_string(raw: str) -> None:
    try:
        value = parse_content_type(raw, source="Content-Type")
    except BadRequest:
        return
    if value is not None:
        assert publish_properties_problem(PublishProperties(content_type=value)) is None
        assert len(value.encode()) <= 255


@pytest.mark.parametrize(
    "raw",
    ["text/plain", "text/plain; charset=utf-8", 'multipart/mixed; boundary="x y"',
     "application/vnd.a+json", " image/png "],
)  # fmt: skip
def test_media_types_accepted(raw: str) -> None:
    assert parse_content_type(raw, source="t") == raw.strip()


@pytest.mark.parametrize(
    "raw", ["text", "text/", "text/plain;", "text/plain; a", "te xt/plain", "text/plain\r\n",
            "text/pl\u00e4in", 'a/b; c="\\\t"', "a/b\x7f"],
)  # fmt: skip
def test_media_types_refused(raw: str) -> None:
    with pytest.raises(BadRequest):
        parse_content_type(raw, source="t")


def test_stored_types_from_before_validation_are_served_as_octet_stream() -> None:
    assert served_type("text/html\r\nX: y") == "application/octet-stream"
    assert served_type(None) == "application/octet-stream"
    assert served_type("TEXT/HTML") == "TEXT/HTML" and not is_inline("TEXT/HTML")
    assert is_inline("Image/PNG") and is_inline("video/mp4") and not is_inline("image/svg+xml")


@pytest.mark.parametrize("raw", ["0", "42", " 7 ", "00012"])
def test_ascii_integers(raw: str) -> None:
    assert parse_ascii_int(raw, "n") == int(raw)


@pytest.mark.parametrize("raw", ["", "²", "١٢", "\uff11", "-1", "+1", "1_0", "0x10", "1" * 21])
def test_other_integers_are_refused(raw: str) -> None:
    with pytest.raises(BadRequest, match="ASCII digits"):
        parse_ascii_int(raw, "n")
