"""Pure parts of the client: routing, placeholder format, settings layering, payload source."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from client import (
    BrokerUrl,
    ClientSettings,
    ConfigError,
    MessageTooLarge,
    PublishProperties,
    Route,
    load_settings,
)
from client.core._exceptions import MalformedPlaceholder
from client.core._source import PayloadSource
from client.protocol import MessageId
from client.protocol._placeholder import Placeholder, is_tagged, original_properties, parse
from client.publish._router import choose_route

# -- routing ------------------------------------------------------------------------------


def route(**kw: object) -> Route:
    args: dict[str, object] = {
        "packet_size": 100,
        "payload_size": 90,
        "limit": 1000,
        "offload_threshold": None,
        "endpoint_known": True,
        "automatic_offload": True,
        "chunking": True,
    }
    args.update(kw)
    return choose_route(**args)  # type: ignore[arg-type]


def test_fitting_message_goes_direct_even_with_an_endpoint() -> None:
    assert route() is Route.DIRECT
    assert route(packet_size=1000) is Route.DIRECT  # exactly at the limit


def test_one_byte_over_the_limit_is_offloaded_or_chunked() -> None:
    assert route(packet_size=1001) is Route.OFFLOADED
    assert route(packet_size=1001, endpoint_known=False) is Route.CHUNKED
    assert route(packet_size=1001, automatic_offload=False) is Route.CHUNKED


def test_threshold_offloads_fitting_payloads_only_when_an_endpoint_exists() -> None:
    assert route(offload_threshold=50) is Route.OFFLOADED
    assert route(offload_threshold=90) is Route.DIRECT
    assert route(offload_threshold=50, endpoint_known=False) is Route.DIRECT


def test_nothing_usable_raises_with_size_and_limit() -> None:
    with pytest.raises(MessageTooLarge) as info:
        route(packet_size=5000, endpoint_known=False, chunking=False)
    assert (info.value.size, info.value.limit) == (5000, 1000)
    assert "chunking is disabled" in str(info.value)


# -- placeholder --------------------------------------------------------------------------

MID = MessageId.parse("0f8fad5b-d9cb-469f-a165-70867728950e")
SHA = hashlib.sha256(b"x").hexdigest()
REF = Placeholder(f"https://gw:8443/msg/{MID}", 123, SHA, MID)


def test_mqtt5_placeholder_keeps_original_properties_after_its_tags() -> None:
    original = PublishProperties(
        content_type="image/png",
        user_properties=(("a", "1"), ("_format", "json")),
        message_expiry_interval=60,
        topic_alias=3,
    )
    body, props = REF.encode(original)
    assert props is not None
    # The body carries the tag and id too: a 3.1.1 receiver sees no user properties.
    assert json.loads(body) == {
        "_format": "external",
        "_id": str(MID),
        "url": REF.url,
        "size": 123,
        "sha256": SHA,
    }
    assert props.user_properties == (("_format", "external"), ("_id", str(MID)), ("a", "1"))
    assert props.content_type == "image/png" and props.message_expiry_interval == 60
    assert props.topic_alias is None
    assert is_tagged(body, props)
    assert parse(body, props) == REF
    assert original_properties(props).user_properties == (("a", "1"),)


def test_mqtt311_placeholder_is_detected_from_its_payload() -> None:
    body, props = REF.encode(None, protocol=4)
    assert props is None
    doc = json.loads(body)
    assert doc["_format"] == "external" and doc["_id"] == str(MID)
    assert is_tagged(body, PublishProperties())
    assert parse(body, PublishProperties()) == REF


def test_mqtt5_placeholder_body_alone_is_recognised() -> None:
    # What a 3.1.1 subscriber gets from an MQTT 5 producer: the payload, no properties.
    body, _ = REF.encode(None)
    assert is_tagged(body, PublishProperties())
    assert parse(body, PublishProperties()) == REF


@pytest.mark.parametrize("protocol", [4, 5])
def test_hop_client_reads_the_placeholder_body(protocol: int) -> None:
    # hop-client's consumers read `url` from the JSON: the tag and id beside it are ignored.
    from hop.models import ExternalMessage

    body, _ = REF.encode(None, protocol=protocol)
    assert ExternalMessage.load(body).url == REF.url


def test_untagged_json_and_other_formats_are_not_placeholders() -> None:
    body, _ = REF.encode(None)
    untagged = json.dumps({"url": REF.url, "size": 123, "sha256": SHA}).encode()
    assert not is_tagged(untagged, PublishProperties())
    assert not is_tagged(body, PublishProperties(user_properties=(("_format", "json"),)))
    assert not is_tagged(b"\x00binary", PublishProperties())


@pytest.mark.parametrize(
    "body",
    [
        b"nope",
        b"[1]",
        b'{"url": "ftp://x/msg/0f8fad5b-d9cb-469f-a165-70867728950e", "size": 1, "sha256": "'
        + SHA.encode()
        + b'"}',
        b'{"url": "http://x/msg/1", "size": 1, "sha256": "' + SHA.encode() + b'"}',
        b'{"url": "http://x/msg/0f8fad5b-d9cb-469f-a165-70867728950e", "size": -1, "sha256": "'
        + SHA.encode()
        + b'"}',
        b'{"url": "http://x/msg/0f8fad5b-d9cb-469f-a165-70867728950e", "size": 1, "sha256": "AB"}',
    ],
)
def test_unreadable_tagged_placeholder_is_malformed(body: bytes) -> None:
    tagged = PublishProperties(user_properties=(("_format", "external"),))
    with pytest.raises(MalformedPlaceholder):
        parse(body, tagged)


# -- settings -----------------------------------------------------------------------------


def test_precedence_keyword_over_environment_over_file_over_default(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text('chunking = false\nmax_packet_size = 1000\nendpoint = "http://file:1"\n')
    env = {"OFFLOAD_MAX_PACKET_SIZE": "2000", "OFFLOAD_AUTOMATIC_OFFLOAD": "no"}
    s = load_settings({"max_packet_size": 3000, "endpoint": None}, environ=env, config_file=conf)
    assert s.max_packet_size == 3000  # keyword
    assert s.automatic_offload is False  # environment
    assert s.chunking is False and s.endpoint == "http://file:1"  # file
    assert s.fetch_external is True  # default
    s = load_settings(environ={**env, "OFFLOAD_CONFIG": str(conf)})
    assert s.max_packet_size == 2000


def test_client_table_in_config_file_and_protocol_spelling(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text('[client]\nprotocol = "3.1.1"\noffload_threshold = 10\n')
    s = load_settings(config_file=conf)
    assert s.protocol == 4 and s.offload_threshold == 10


@pytest.mark.parametrize(
    ("env", "config"),
    [
        ({"OFFLOAD_CHUNKING": "maybe"}, ""),
        ({"OFFLOAD_MAX_PACKET_SIZE": "big"}, ""),
        ({"OFFLOAD_PROTOCOL": "6"}, ""),
        ({}, "no_such_setting = 1\n"),
        ({}, "chunking = 1\n"),
        ({}, "not toml ["),
        ({"OFFLOAD_ENDPOINT": "gw:80"}, ""),
        ({"OFFLOAD_UNTRUSTED_ENDPOINT": "send-anyway"}, ""),
        ({"OFFLOAD_SPOOL_DIR": "/nonexistent/spool"}, ""),
    ],
)
def test_bad_settings_are_config_errors(tmp_path: Path, env: dict[str, str], config: str) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text(config)
    with pytest.raises(ConfigError):
        load_settings(environ=env, config_file=conf)


def test_broker_url_and_secret_hidden_from_repr() -> None:
    url = BrokerUrl.parse("mqtts://us%40r:p%3Ass@broker.example")
    assert (url.host, url.port, url.tls, url.username, url.password) == (
        "broker.example", 8883, True, "us@r", "p:ss",
    )  # fmt: skip
    assert "p:ss" not in repr(url)
    assert BrokerUrl.parse("localhost").port == 1883
    settings = ClientSettings(broker="mqtt://u:urlpw@h:1", password="flagpw")
    assert settings.broker_url.password == "flagpw" and settings.broker_url.username == "u"
    assert "flagpw" not in repr(settings)
    with pytest.raises(ConfigError):
        BrokerUrl.parse("http://h")


def test_from_config_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from client import Client

    monkeypatch.setenv("OFFLOAD_CONFIG", os.devnull)
    monkeypatch.setenv("OFFLOAD_BROKER", "mqtt://envhost:1999")
    monkeypatch.setenv("OFFLOAD_FETCH_EXTERNAL", "false")
    client = Client.from_config(fetch_external=True)
    assert client.settings.broker == "mqtt://envhost:1999"
    assert client.settings.fetch_external is True  # keyword wins
    plain = Client("mqtt://h:1")  # the library itself never reads the environment
    assert plain.settings.broker == "mqtt://h:1"
    assert plain.settings.fetch_external is True


def test_readme_settings_table_is_the_declared_one() -> None:
    """One declaration: docs/settings.md's table is generated from the settings' fields."""
    from client.config._settings import settings_table

    readme = (Path(__file__).parents[1] / "docs" / "settings.md").read_text()
    start = readme.index("<!-- client-settings:")
    block = readme[readme.index("\n", start) + 1 : readme.index("<!-- /client-settings -->")]
    assert block == settings_table(), "run `python -m client.config._settings` and paste the table"
    for name in ("client_id", "password", "max_chunk_timeout", "ca_file"):
        assert f"| `{name}` | `OFFLOAD_{name.upper()}` |" in block


def test_keyword_overrides_mirror_the_declared_fields() -> None:
    """`SettingsOverrides` exists only for mypy's sake: it must name every field, typed alike."""
    import dataclasses
    import typing

    from client.config._overrides import SettingsOverrides

    fields = {f.name: f.type for f in dataclasses.fields(ClientSettings)}
    overrides = SettingsOverrides.__annotations__
    assert set(overrides) == set(fields) - {"broker"}  # broker is the positional argument
    assert typing.get_type_hints(SettingsOverrides) == {
        k: v for k, v in typing.get_type_hints(ClientSettings).items() if k != "broker"
    }


def test_every_declared_setting_reads_its_default_back_from_the_environment() -> None:
    """Each field's own parser (no switching on annotations) takes the text of its default."""
    import dataclasses

    env = {}
    for f in dataclasses.fields(ClientSettings):
        default = f.default
        if isinstance(default, tuple):
            text = ",".join(default)
        elif isinstance(default, bool):
            text = "true" if default else "false"
        else:
            text = "" if default is None else str(default)
        env[f"OFFLOAD_{f.name.upper()}"] = text
    assert load_settings(environ=env) == ClientSettings()
    assert load_settings(environ={"OFFLOAD_OFFLOAD_THRESHOLD": "10"}).offload_threshold == 10
    assert load_settings(environ={"OFFLOAD_DISCOVERY_WAIT": "0.5"}).discovery_wait == 0.5


# -- payload source -----------------------------------------------------------------------


def test_sources_agree_on_size_hash_and_ranges(tmp_path: Path) -> None:
    data = os.urandom(3 * (1 << 20) + 7)
    path = tmp_path / "p.bin"
    path.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    buf = io.BytesIO(b"skip" + data)
    buf.seek(4)  # a file object is read from its current position
    for payload in (data, path, buf):
        with PayloadSource(payload) as src:
            assert src.size == len(data)
            assert src.sha256 == expected
            assert src.read_at(len(data) - 5, 100) == data[-5:]
            assert b"".join(src.pieces()) == data
    assert PayloadSource("héllo").read_all() == "héllo".encode()


def test_a_pipe_is_spooled_in_spool_dir(tmp_path: Path) -> None:
    """A non-seekable stream is copied to an (unnamed) file first: in `spool_dir` if set."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"piped payload")
    os.close(write_end)
    with open(read_end, "rb") as pipe, PayloadSource(pipe, spool_dir=str(tmp_path)) as src:
        assert src.read_all() == b"piped payload"
        spool = src._file
        assert spool is not None
        assert os.readlink(f"/proc/self/fd/{spool.fileno()}").startswith(f"{tmp_path}/")
