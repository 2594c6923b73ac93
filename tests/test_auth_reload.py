"""A large dynamic security file changing under a running gateway: parsed on a thread of its
own while every request goes on, decided by the last version until the new one is in force.

Before, the request that noticed the change parsed the file on the event loop: a 30 MB file
(100,000 clients, rewritten by mosquitto at every `mosquitto_ctrl` change) stalled every
request, `/healthz` included, for 2.9 s after each change. Nothing here measures time: the
test asks `/healthz` while the reload thread is alive and checks it still is once answered.
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
import pytest

from gateway.auth._files import WAIT_BYTES

from _gateway import GatewayServer

pytestmark = pytest.mark.servers

CLIENTS = 50_000  # about 11 MB: a second or more to parse, on any machine


def client(user: str, password: str | None = None, roles: tuple[str, ...] = ()) -> dict[str, Any]:
    """A client as `mosquitto_ctrl dynsec createClient` writes it (101 iterations)."""
    salt = os.urandom(12)
    digest = (
        hashlib.pbkdf2_hmac("sha512", password.encode(), salt, 101)
        if password is not None
        else os.urandom(64)
    )
    return {
        "username": user,
        "textname": "",
        "password": base64.b64encode(digest).decode(),
        "salt": base64.b64encode(salt).decode(),
        "iterations": 101,
        "roles": [{"rolename": role, "priority": -1} for role in roles],
        "groups": [],
    }


def write_as_mosquitto(path: Path, doc: dict[str, Any]) -> None:
    """A new version written beside the file and renamed over it, as the plugin does."""
    fresh = path.with_suffix(".new")
    fresh.write_text(json.dumps(doc))
    fresh.replace(path)


def reloading() -> bool:
    return any(t.name.startswith("reload-dynamic-security") for t in threading.enumerate())


def put(http: httpx.Client, user: str) -> int:
    auth = httpx.BasicAuth(user, f"pw-{user}")
    answer = http.put(f"/msg/{uuid.uuid4()}", params={"topic": "up/a"}, content=b"x", auth=auth)
    return answer.status_code


def test_a_large_file_is_parsed_off_the_event_loop(
    tmp_path: Path, gateway_factory: Callable[..., GatewayServer]
) -> None:
    writer = {
        "rolename": "writer",
        "acls": [{"acltype": "publishClientSend", "topic": "up/#", "priority": 0, "allow": True}],
    }
    fleet = client("fleet")  # they never log in here: one hash for all
    clients = [{**fleet, "username": f"fleet-{n}"} for n in range(CLIENTS)]
    clients.append(client("dev-old", "pw-dev-old", ("writer",)))
    doc = {"clients": clients, "groups": [], "roles": [writer], "defaultACLAccess": {}}
    file = tmp_path / "dynamic-security.json"
    write_as_mosquitto(file, doc)
    assert file.stat().st_size > 40 * WAIT_BYTES  # not one a request waits for
    gw = gateway_factory(dynsec_file=file, tls=True, auth_secret="s" * 32)
    with httpx.Client(base_url=gw.url, timeout=60) as http:
        assert put(http, "dev-old") == 201
        assert put(http, "dev-new") == 401  # no such client yet
        assert not reloading()
        # mosquitto_ctrl dynsec createClient dev-new; addClientRole dev-new writer
        doc["clients"].append(client("dev-new", "pw-dev-new", ("writer",)))
        write_as_mosquitto(file, doc)
        # The request that notices the change starts the reload and is decided by the
        # version in force: dev-new is not in it yet.
        assert put(http, "dev-new") == 401
        assert reloading()
        healthz = http.get("/healthz")
        assert healthz.status_code == 200
        assert reloading(), "the reload ended before /healthz was answered: not shown"
        assert put(http, "dev-old") == 201  # requests go on, by the last version
        while reloading():
            threading.Event().wait(0.05)
        assert put(http, "dev-new") == 201  # in force once parsed


def test_the_collector_resumes_after_a_large_parse(tmp_path: Path) -> None:
    """Collection is off only while a large file is parsed (bench/auth_reload.py: it made
    the parse four times as slow and stopped the event loop), and it stays off when the
    process had switched it off."""
    import gc

    from gateway.auth._files import WatchedFile

    file = tmp_path / "big"
    file.write_text("x" * (WAIT_BYTES + 1))
    seen: list[bool] = []

    def parse(text: str) -> int:
        seen.append(gc.isenabled())
        return len(text)

    assert gc.isenabled()
    watched = WatchedFile(file, parse, fallback=0)
    assert seen == [False] and gc.isenabled()
    file.write_text("y" * (WAIT_BYTES + 2))
    assert watched.get() in (WAIT_BYTES + 1, WAIT_BYTES + 2)  # the last, or the new one
    while watched.busy:
        threading.Event().wait(0.01)
    assert watched.get() == WAIT_BYTES + 2 and seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        file.write_text("z" * 10)  # small: parsed with the collector as it is
        assert watched.get() == 10 and seen[-1] is False and not gc.isenabled()
    finally:
        gc.enable()
