"""offload-proxy with one identity: the client's CONNECT credentials go to the broker and,
for the payload, to the gateway, which checks the same password and ACL files. A client can
never store a payload under a topic it could not publish to. Real mosquitto (password file,
ACL), gateway, SeaweedFS; the endpoint comes from the discovery record."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_e2e_auth import ACL, USERS
from test_proxy import MiB, PahoPeer, start_proxy

from _auth import broker_readable_dir, secured_pair, write_acl_file, write_password_file
from _gateway import GatewayServer
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers


@pytest.fixture
def files() -> Iterator[Path]:
    path = broker_readable_dir("offload-proxy-auth-")
    write_password_file(path / "passwd", [(u, p, 4096) for u, p in USERS.items()])
    write_acl_file(path / "acl", ACL)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def login(port: int, user: str) -> PahoPeer:
    return PahoPeer(port, credentials=(user, USERS[user]))


def test_the_gateway_stores_only_what_the_client_may_publish(
    files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    broker, _gw = secured_pair(
        files, mosquitto_factory, gateway_factory, gateway_password=USERS["gateway"]
    )
    server = start_proxy(
        broker, None, discovery_username="reader", discovery_password=USERS["reader"]
    )
    try:
        wait_until(lambda: server.call(server.proxy._endpoint) is not None, "discovery", 30)
        reader = login(server.port, "reader")
        reader.subscribe(broker, "data/#")
        writer = login(server.port, "writer")
        acks: list[Any] = []
        writer.client.on_publish = lambda _c, _u, mid, rc, _p: acks.append(rc)
        payload = os.urandom(MiB)
        writer.client.publish("other/x", payload, qos=1)  # the ACL says no: never stored
        writer.client.publish("data/x", payload, qos=1)
        wait_until(lambda: len(acks) == 2, "two PUBACKs", 60)
        assert [rc.value for rc in acks] == [0x87, 0]  # Not authorized, then Success
        got = reader.wait(1)
        assert [(m.topic, m.payload) for m in got] == [("data/x", payload)]
        failed = server.metric("offload_proxy_offload_failures_total", why="403")
        assert failed == 1 and server.metric("offload_proxy_offloaded_total") == 1
        reader.close()
        writer.close()
    finally:
        server.stop()
