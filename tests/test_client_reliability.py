"""Issue 7, client side: skipping gone payloads (ignorePayloadNotFound) and refusing
discovery records whose endpoint is not allow-listed."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import pytest

from client import Client, ConfigError, Message, Route
from client.config._load import load_settings
from client.config._settings import ClientSettings
from client.protocol import MessageId, Placeholder

from _gateway import GatewayServer


@pytest.mark.servers
def test_ignore_payload_not_found_skips_gone_objects_and_logs(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = unique_topic("gone")
    strict = clients()
    strict.subscribe(topic)
    lenient = clients(ignore_payload_not_found=True)
    lenient.subscribe(topic)
    pub = clients()
    mid = MessageId.new()
    body, props = Placeholder(f"{gateway.url}/msg/{mid}", 10, "0" * 64, mid).encode(None)
    with caplog.at_level(logging.WARNING, logger="client"):
        pub.connection.publish(topic, body, qos=1, properties=props).result(10)
        pub.publish(topic, b"after", qos=1)
        got = lenient.next_message(30)
    assert isinstance(got, Message) and got.payload == b"after"  # the gone one was skipped
    assert f"skipped message {mid}" in caplog.text
    first = strict.next_message(30)
    assert first is not None and not isinstance(first, Message)  # the default: an error


@pytest.mark.servers
def test_discovery_record_outside_the_allowlist_means_no_offload(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = unique_topic("allow")
    allowed = clients(discovery_allowlist=("http://127.0.0.1",))
    assert allowed.wait_for_endpoint(10) == gateway.url
    with caplog.at_level(logging.WARNING, logger="client"):
        refused = clients(discovery_allowlist=("https://gateway.example.com",), discovery_wait=3)
        assert refused.wait_for_endpoint(3) is None
        payload = os.urandom(400 * 1024)
        assert refused.publish(topic, payload, qos=1).route is Route.CHUNKED
    assert "not in discovery_allowlist" in caplog.text
    assert refused.endpoint is None
    assert allowed.publish(topic, payload, qos=1).route is Route.OFFLOADED


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://gw.example.com", True),
        ("https://GW.example.com:8443/base", True),
        ("http://gw.example.com", False),  # scheme differs
        ("https://evil.example.com", False),
        ("https://gw.example.com.evil.net", False),
        ("http://a.lan:8000", True),
        ("http://b.a.lan:8000", True),
        ("http://lan:8000", False),  # `*.` needs a subdomain
        ("http://a.lan:8001", False),  # port given in the entry must match
        ("http://a.lan", False),
    ],
)
def test_allowlist_matching(url: str, ok: bool) -> None:
    s = ClientSettings(discovery_allowlist=("https://gw.example.com", "http://*.lan:8000"))
    assert s.endpoint_allowed(url) is ok
    assert ClientSettings().endpoint_allowed(url)  # no list: anything goes


def test_new_settings_from_environment_and_file(tmp_path: os.PathLike[str]) -> None:
    env = {
        "OFFLOAD_DISCOVERY_ALLOWLIST": "https://a.example, http://b.example:81",
        "OFFLOAD_IGNORE_PAYLOAD_NOT_FOUND": "true",
        "OFFLOAD_MAX_PARTIAL_MESSAGES": "7",
        "OFFLOAD_MAX_BUFFERED_BYTES": "1000000",
        "OFFLOAD_HTTP_TOKEN": "tok",
    }
    s = load_settings(environ=env)
    assert s.discovery_allowlist == ("https://a.example", "http://b.example:81")
    assert s.ignore_payload_not_found and s.max_partial_messages == 7
    assert s.max_buffered_bytes == 1_000_000 and s.http_token == "tok"
    assert "tok" not in repr(s)
    path = f"{tmp_path}/c.toml"
    with open(path, "w") as f:
        f.write('discovery_allowlist = ["https://c.example"]\n')
    assert load_settings(config_file=path).discovery_allowlist == ("https://c.example",)


@pytest.mark.parametrize(
    "env",
    [
        {"OFFLOAD_DISCOVERY_ALLOWLIST": "ftp://x"},
        {"OFFLOAD_DISCOVERY_ALLOWLIST": "https://x/path"},
        {"OFFLOAD_MAX_PARTIAL_MESSAGES": "0"},
        {"OFFLOAD_MAX_BUFFERED_BYTES": "-1"},
    ],
)
def test_bad_new_settings_are_config_errors(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        load_settings(environ=env)
