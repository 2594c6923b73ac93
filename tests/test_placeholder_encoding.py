"""The placeholder's `cmp` / `enc` / `kid` members and the encryption settings' forms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from client import ConfigError
from client.config._load import load_settings
from client.protocol import MessageId, Placeholder, PublishProperties
from client.protocol._age_keys import Identity
from client.protocol._encoding import MAX_KEY_IDS, Encoding
from client.protocol._errors import MalformedPlaceholder
from client.protocol._placeholder import parse

MID = MessageId.new()
BASE = {"_format": "external", "_id": str(MID), "url": f"http://gw:1/msg/{MID}", "size": 3,
        "sha256": "a" * 64}  # fmt: skip


def _parse(**members: object) -> Placeholder:
    return parse(json.dumps({**BASE, **members}).encode(), PublishProperties())


def test_members_round_trip_and_a_plain_placeholder_has_none() -> None:
    enc = Encoding(compressed=True, encrypted=True, key_ids=("0123456789abcdef",))
    ref = Placeholder(BASE["url"], 3, "a" * 64, MID, enc)  # type: ignore[arg-type]
    body, _ = ref.encode(None, protocol=4)
    doc = json.loads(body)
    assert doc["cmp"] == "zstd" and doc["enc"] == "age-v1" and doc["kid"] == ["0123456789abcdef"]
    assert parse(body, PublishProperties()).encoding == enc
    plain, _ = Placeholder(BASE["url"], 3, "a" * 64, MID).encode(None)  # type: ignore[arg-type]
    assert not {"cmp", "enc", "kid"} & set(json.loads(plain))
    assert _parse().encoding.plain


@pytest.mark.parametrize(
    "members",
    [
        {"enc": "age-v2"},
        {"enc": 1},
        {"cmp": "gzip"},
        {"cmp": None, "enc": "pgp"},
        {"enc": "age-v1", "kid": "0123456789abcdef"},
        {"enc": "age-v1", "kid": ["0123456789ABCDEF"]},
        {"enc": "age-v1", "kid": ["0123"]},
        {"enc": "age-v1", "kid": [1]},
        {"enc": "age-v1", "kid": ["0123456789abcdef"] * (MAX_KEY_IDS + 1)},
        {"kid": ["0123456789abcdef"]},
    ],
)
def test_unknown_or_malformed_members_are_malformed_placeholders(
    members: dict[str, object],
) -> None:
    with pytest.raises(MalformedPlaceholder):
        _parse(**members)


def test_settings_forms(tmp_path: Path) -> None:
    one, two = (str(Identity.generate().recipient) for _ in range(2))
    env = {"OFFLOAD_ENCRYPT_TO": f"a/#={one},{two}; b/+/c={two}",
           "OFFLOAD_IDENTITY_FILES": "k1, k2", "OFFLOAD_COMPRESS": "off",
           "OFFLOAD_NO_COMPRESS": "logs/#"}  # fmt: skip
    s = load_settings(environ=env)
    assert s.encrypt_to == (("a/#", (one, two)), ("b/+/c", (two,)))
    assert s.identity_files == ("k1", "k2") and s.compress is False
    assert s.no_compress == ("logs/#",)
    config = tmp_path / "c.toml"
    config.write_text(
        f'[client]\nidentity_files = ["k3"]\n'
        f'[client.encrypt_to]\n"x/#" = ["{one}"]\n"y" = "{two}"\n'
    )
    s = load_settings(config_file=config)
    assert s.encrypt_to == (("x/#", (one,)), ("y", (two,)))
    assert s.identity_files == ("k3",)
    broken = one[:-1] + ("q" if one[-1] != "q" else "p")  # its last character changed
    for bad in ("a/#", "=age1x", f"a/#/b={one}", f"a/#={broken}"):
        with pytest.raises(ConfigError):
            load_settings(environ={"OFFLOAD_ENCRYPT_TO": bad})
    with pytest.raises(ConfigError, match="no recipient"):
        load_settings({"encrypt_to": {"a": []}})
