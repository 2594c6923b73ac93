"""A running gateway on mosquitto's dynamic security file: logins and rules as mosquitto_ctrl
leaves them, seen without a restart; a file that goes bad keeps the last good one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from client import ScramAuth
from client.http._scram import ScramFailure

from _dynsec import DynsecBroker, directory, plugin_path, start_dynsec_broker
from _gateway import GatewayServer

__all__ = ["directory"]  # the shared fixture

pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(plugin_path() is None, reason="mosquitto's dynsec plugin missing"),
]


@pytest.fixture
def setup(
    directory: Path,
    mosquitto_factory: Callable[..., Any],
    gateway_factory: Callable[..., GatewayServer],
) -> tuple[DynsecBroker, GatewayServer]:
    broker = start_dynsec_broker(mosquitto_factory, directory)
    # OFFLOAD_TLS: as behind a TLS-terminating proxy, so HTTP Basic is taken.
    gw = gateway_factory(dynsec_file=broker.file, tls=True, auth_secret="s" * 32)
    broker.ctrl("createRole", "writer")
    broker.ctrl("addRoleACL", "writer", "publishClientSend", "up/#", "allow")
    return broker, gw


def put(gw: GatewayServer, topic: str, auth: httpx.Auth | None) -> int:
    answer = httpx.put(
        f"{gw.url}/msg/{uuid.uuid4()}", params={"topic": topic}, content=b"x" * 100, auth=auth
    )
    return answer.status_code


def mosquitto_accepts(port: int, user: str, password: str) -> bool:
    done, accepted = threading.Event(), []
    c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    c.username_pw_set(user, password)
    c.on_connect = lambda cl, u, f, rc, p: (accepted.append(not rc.is_failure), done.set())
    c.connect("127.0.0.1", port)
    c.loop_start()
    assert done.wait(10)
    c.disconnect()
    c.loop_stop()
    return accepted[0]


def add_scram_client(file: Path, user: str, password: str, role: str) -> None:
    """What an administrator importing users does: a 4096-iteration entry the plugin loads."""
    salt = os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, 4096)
    doc = json.loads(file.read_text())
    doc["clients"].append(
        {
            "username": user,
            "password": base64.b64encode(digest).decode(),
            "salt": base64.b64encode(salt).decode(),
            "iterations": 4096,
            "roles": [{"rolename": role}],
        }
    )
    fresh = file.with_suffix(".new")
    fresh.write_text(json.dumps(doc))
    fresh.chmod(0o666)
    fresh.replace(file)


def test_logins_and_rules_follow_mosquitto_ctrl_without_restart(
    setup: tuple[DynsecBroker, GatewayServer],
) -> None:
    broker, gw = setup
    basic = httpx.BasicAuth("dev1", "pw-dev1")
    assert put(gw, "up/a", basic) == 401  # no such client yet
    broker.ctrl("createClient", "dev1", "-p", "pw-dev1")
    assert put(gw, "up/a", basic) == 403  # in, but no role grants it
    broker.ctrl("addClientRole", "dev1", "writer")
    assert put(gw, "up/a", basic) == 201
    assert put(gw, "down/a", basic) == 403
    broker.ctrl("disableClient", "dev1")
    assert put(gw, "up/a", basic) == 401
    broker.ctrl("enableClient", "dev1")
    assert put(gw, "up/a", basic) == 201

    # mosquitto_ctrl hashes with 101 iterations, too few for SCRAM (scramp refuses < 4096
    # on either side). A 4096-iteration entry added to the file while mosquitto is down is
    # loaded by the plugin, and by the running gateway, which serves SCRAM for it.
    broker.broker.stop()
    add_scram_client(broker.file, "dev2", "pw-dev2", "writer")
    broker.broker.start()
    assert mosquitto_accepts(broker.port, "dev2", "pw-dev2")
    assert put(gw, "up/b", ScramAuth("dev2", "pw-dev2")) == 201
    assert put(gw, "down/b", ScramAuth("dev2", "pw-dev2")) == 403
    with pytest.raises(ScramFailure, match="invalid-proof"):
        put(gw, "up/b", ScramAuth("dev2", "wrong"))


def test_a_bad_file_keeps_the_last_good_one(setup: tuple[DynsecBroker, GatewayServer]) -> None:
    broker, gw = setup
    broker.ctrl("createClient", "dev1", "-p", "pw-dev1")
    broker.ctrl("addClientRole", "dev1", "writer")
    basic = httpx.BasicAuth("dev1", "pw-dev1")
    assert put(gw, "up/a", basic) == 201
    good = broker.file.read_text()
    assert httpx.get(f"{gw.url}/healthz").json()["auth"]["problems"] == []
    for bad in (good[: len(good) // 2], "not json at all", "", "[1, 2]"):
        broker.file.write_text(bad)
        assert put(gw, "up/a", basic) == 201, bad[:20]  # the last good version serves
        health = httpx.get(f"{gw.url}/healthz")
        assert health.status_code == 200
        (problem,) = health.json()["auth"]["problems"]
        assert "keeping the last good version" in problem, problem
    broker.file.write_text(good)
    assert put(gw, "up/a", basic) == 201
    assert httpx.get(f"{gw.url}/healthz").json()["auth"]["problems"] == []


def test_a_file_rewritten_under_requests(setup: tuple[DynsecBroker, GatewayServer]) -> None:
    """Rewritten in place (truncate, then write) and swapped by rename as fast as it goes,
    while logins and uploads go on: every answer is the one a whole version gives."""
    broker, gw = setup
    broker.ctrl("createClient", "dev1", "-p", "pw-dev1")
    broker.ctrl("addClientRole", "dev1", "writer")
    allowed = broker.file.read_text()
    doc = json.loads(allowed)
    for client in doc["clients"]:
        if client["username"] == "dev1":
            client["roles"] = []
    denied = json.dumps(doc)  # dev1 still logs in, may upload nowhere
    # The gateway read the version with dev1 in it: the last good one from here on.
    assert put(gw, "up/a", httpx.BasicAuth("dev1", "pw-dev1")) == 201
    stop = threading.Event()

    def churn() -> None:
        spare = broker.file.with_suffix(".swap")
        while not stop.is_set():
            for text in (allowed, denied):
                broker.file.write_text(text)  # in place: readers may see it half written
                spare.write_text(text)
                spare.replace(broker.file)

    writer = threading.Thread(target=churn, daemon=True)
    writer.start()
    try:
        with httpx.Client(auth=httpx.BasicAuth("dev1", "pw-dev1")) as http:
            codes = [
                http.put(f"{gw.url}/msg/{uuid.uuid4()}", params={"topic": "up/a"}, content=b"x")
                for _ in range(60)
            ]
    finally:
        stop.set()
        writer.join(10)
    seen = {answer.status_code for answer in codes}
    assert seen <= {201, 403}, seen


def test_a_disabled_client_is_refused_with_its_static_bearer_token(
    directory: Path,
    mosquitto_factory: Callable[..., Any],
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    """`mosquitto_ctrl dynsec disableClient` shuts a client out whatever it logs in with:
    its password, and a bearer token of the tokens file too (401, as for a JWT: the token
    path checks it itself, not only the topic rules, which answered 403)."""
    broker = start_dynsec_broker(mosquitto_factory, directory)
    token = "a-static-token-of-dev1"
    tokens = directory / "tokens"
    tokens.write_text(f"dev1:{hashlib.sha256(token.encode()).hexdigest()}\n")
    gw = gateway_factory(
        dynsec_file=broker.file, tokens_file=tokens, tls=True, auth_secret="s" * 32
    )
    broker.ctrl("createRole", "writer")
    broker.ctrl("addRoleACL", "writer", "publishClientSend", "up/#", "allow")
    broker.ctrl("createClient", "dev1", "-p", "pw-dev1")
    broker.ctrl("addClientRole", "dev1", "writer")
    bearer = {"Authorization": f"Bearer {token}"}

    def put_with_token() -> httpx.Response:
        return httpx.put(
            f"{gw.url}/msg/{uuid.uuid4()}", params={"topic": "up/a"}, content=b"x", headers=bearer
        )

    assert put_with_token().status_code == 201
    broker.ctrl("disableClient", "dev1")
    refused = put_with_token()
    assert refused.status_code == 401, refused.text
    assert put(gw, "up/a", httpx.BasicAuth("dev1", "pw-dev1")) == 401
    broker.ctrl("enableClient", "dev1")
    assert put_with_token().status_code == 201
