"""Pure parts of the identity sources: the client's JWT shape check and login choice, the
dynamic security file's reading (as cJSON and the plugin read it) and its pattern matching,
and parsers that take anything without raising anything but ValueError."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client import BearerAuth, ScramAuth, gateway_auth
from client.http._bearer import looks_like_jwt
from gateway.auth import Event, parse_claim_acl, parse_dynsec
from gateway.auth._dynsec import DynamicSecurity, sub_acl_check

HEADER = base64.urlsafe_b64encode(b'{"alg":"ES256","typ":"JWT"}').rstrip(b"=").decode()
JWT = f"{HEADER}.eyJzdWIiOiJkIn0.c2ln"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (JWT, True),
        (f"{HEADER}.eyJzdWIiOiJkIn0.", True),  # unsigned: still a JWT's shape (refused later)
        ("correct horse battery staple", False),
        ("a.b.c", False),  # the header is no JSON
        (f"{HEADER}.eyJzdWIiOiJkIn0", False),  # two parts
        (f"{HEADER}.e+J9.c2ln", False),  # not base64url
        (base64.urlsafe_b64encode(b'{"typ":"JWT"}').decode().rstrip("=") + ".e30.x", False),
        ("", False),
        (None, False),
    ],
)
def test_a_jwt_is_told_by_its_shape(text: str | None, expected: bool) -> None:
    assert looks_like_jwt(text) is expected


def test_the_login_the_gateway_gets() -> None:
    def kind(**kw: Any) -> type | None:
        auth = gateway_auth(**{"username": "u", "password": "pw", "token": None, **kw})
        return type(auth) if auth is not None else None

    assert kind() is ScramAuth
    # auto: Basic where an https:// gateway says SCRAM cannot serve the user; scram: never.
    auto, scram = (
        gateway_auth(username="u", password="pw", token=None),
        gateway_auth(username="u", password="pw", token=None, scheme="scram"),
    )
    assert isinstance(auto, ScramAuth) and auto.basic_fallback
    assert isinstance(scram, ScramAuth) and not scram.basic_fallback
    assert kind(password=JWT) is BearerAuth  # the device's own token
    assert kind(password=JWT, scheme="scram") is ScramAuth
    assert kind(scheme="bearer") is BearerAuth
    assert kind(scheme="basic") is httpx.BasicAuth
    assert kind(token="t", password=JWT) is BearerAuth
    assert kind(username=None, password=JWT) is BearerAuth  # a token needs no user name
    assert kind(username=None) is None
    with pytest.raises(ValueError):
        kind(scheme="digest")


def test_the_file_is_read_as_the_plugin_reads_it() -> None:
    doc = {
        "DefaultACLAccess": {"publishClientSend": True, "subscribe": "yes"},  # keys: any case
        "roles": [
            {"rolename": "r", "acls": [{"acltype": "PUBLISHCLIENTSEND", "topic": "a/#"}]},
            {"rolename": 7},  # skipped
        ],
        "clients": [
            {"username": "u", "roles": [{"rolename": "r"}, {"rolename": "missing"}]},
            {"username": "", "roles": []},  # skipped
            {"username": "bad", "salt": "x", "password": "y", "iterations": 0},  # skipped
        ],
        "anonymousGroup": "nobody",
    }
    rules = parse_dynsec(json.dumps(doc))
    assert set(rules.clients) == {"u"}
    assert rules.defaults[Event.PUBLISH_SEND] and not rules.defaults[Event.SUBSCRIBE]
    assert not rules.allows("u", "a/b", Event.PUBLISH_SEND)  # allow defaults to false
    assert rules.allows("u", "c", Event.PUBLISH_SEND)  # the default
    assert not rules.allows("u", "$CONTROL/x", Event.PUBLISH_SEND)  # never by default
    assert not rules.allows("u", "$SYS/x", Event.PUBLISH_SEND)  # the broker's own rule
    assert not rules.allows("nobody", "c", Event.PUBLISH_SEND)  # unknown user: deferred
    assert rules.anonymous is None
    assert len(rules.problems) == 3
    # cJSON takes the first of a repeated key.
    first = parse_dynsec('{"defaultACLAccess": {"subscribe": true}, "defaultACLAccess": {}}')
    assert first.defaults[Event.SUBSCRIBE]
    for bad in ("", "  ", "[]", '{"clients": {}}', '{"roles": 1}', '{"clients": ['):
        with pytest.raises(ValueError):
            parse_dynsec(bad)


def test_pattern_acls_match_as_mosquitto_2_0() -> None:
    assert sub_acl_check("#", "$SYS/x")  # no $ rule in sub_acl_check
    assert sub_acl_check("a/#", "a") and sub_acl_check("a/+", "a/")
    assert not sub_acl_check("a/b", "a/#") and sub_acl_check("a/#", "a/#")
    assert not sub_acl_check("a/+/c", "a/b") and not sub_acl_check("a/b/c", "a/b/c/d")


def test_substitution_as_mosquitto_2_1() -> None:
    doc = {
        "roles": [
            {
                "rolename": "r",
                "acls": [
                    {"acltype": "publishClientSend", "topic": "x/%c/deny", "allow": False},
                    {"acltype": "publishClientSend", "topic": "x/%c/#", "allow": True},
                    {"acltype": "publishClientSend", "topic": "u/%u/#", "allow": True},
                ],
            }
        ],
        "clients": [
            {"username": "pinned", "clientid": "cam", "roles": [{"rolename": "r"}]},
            {"username": "free", "roles": [{"rolename": "r"}]},
        ],
    }
    rules = parse_dynsec(json.dumps(doc))
    send = Event.PUBLISH_SEND
    assert rules.allows("pinned", "x/cam/a", send, substitute=True)
    assert not rules.allows("pinned", "x/cam/deny", send, substitute=True)
    assert not rules.allows("pinned", "x/cam/a", send)  # 2.0: %c is text
    assert not rules.allows("free", "x/anything/a", send, substitute=True)  # no id: no grant
    assert rules.allows("free", "u/free/a", send, substitute=True)
    assert not rules.allows("free", "u/other/a", send, substitute=True)


KEYS = [
    "clients",
    "roles",
    "groups",
    "username",
    "rolename",
    "groupname",
    "acls",
    "acltype",
    "topic",
    "allow",
    "priority",
    "password",
    "salt",
    "iterations",
    "anonymousGroup",
    "defaultACLAccess",
    "disabled",
    "clientid",
    "x",
    "pub",
    "sub",
    "all",
    "permission",
    "action",
    "topics",
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_is_a_file_or_a_value_error(value: Any) -> None:
    try:
        rules = parse_dynsec(json.dumps(value))
    except ValueError:
        return
    assert isinstance(rules, DynamicSecurity)
    for user in (None, *list(rules.clients)[:3]):
        for event in Event:
            rules.allows(user, "a/b", event)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_acl_claim_is_rules_or_a_value_error(value: Any) -> None:
    try:
        acl = parse_claim_acl(value)
    except ValueError:
        return
    acl.allows("u", "a/b", write=True, client_id=None)
