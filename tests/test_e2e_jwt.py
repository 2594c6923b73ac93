"""A device's JWT is its one identity: the broker takes it as the MQTT password (here a
mosquitto whose password file holds the token as that user's password, as a JWT-checking
broker would take it), and the `offload` CLI and offload-proxy hand the same token to the
gateway as a bearer token, whose ``acl`` claim decides what is stored and served. An expired
token gets the answers of a refused login: exit 6 from the CLI, PUBACK 0x87 through the proxy.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_proxy import MiB, PahoPeer, start_proxy

from _auth import broker_readable_dir
from _gateway import GatewayServer
from _jwt_helpers import AUDIENCE, ISSUER, claims, jwks, make_key
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers

OFFLOAD = shutil.which("offload") or "offload"
ACL = {"pub": ["dev/${username}/#"], "sub": ["dev/${username}/#"]}


@dataclass(frozen=True)
class Fleet:
    broker: Mosquitto
    gateway: GatewayServer
    tokens: dict[str, str]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    from gateway import Settings

    key = make_key("ES256", "fleet-1")
    tokens = {
        "dev-1": key.sign(claims("dev-1", ttl=3600, acl=ACL)),
        "dev-2": key.sign(claims("dev-2", ttl=-120, acl=ACL)),  # expired two minutes ago
    }
    files = broker_readable_dir("offload-jwt-")
    passwd = files / "passwd"
    for index, (user, token) in enumerate(tokens.items()):
        create = ["-c"] if index == 0 else []
        subprocess.run(
            ["mosquitto_passwd", *create, "-b", str(passwd), user, token],
            check=True,
            capture_output=True,
        )
    passwd.chmod(0o644)
    (files / "jwks.json").write_text(jwks(key))
    broker = Mosquitto(
        max_packet_size=262144, extra_config=f"allow_anonymous false\npassword_file {passwd}\n"
    ).start()
    store = tmp_path_factory.mktemp("jwt-store")
    gw = GatewayServer(
        Settings(  # type: ignore[call-arg]
            storage_url=f"file://{store}",
            jwks_file=files / "jwks.json",
            jwt_issuer=ISSUER,
            jwt_audience=AUDIENCE,
            tls=True,  # as behind a TLS-terminating proxy: bearer tokens are taken
        )
    ).start()
    try:
        yield Fleet(broker, gw, tokens)
    finally:
        gw.stop()
        broker.close()
        shutil.rmtree(files, ignore_errors=True)


def offload(fleet: Fleet, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env.update(
        OFFLOAD_CONFIG=os.devnull,
        OFFLOAD_BROKER=fleet.broker.url,
        OFFLOAD_ENDPOINT=fleet.gateway.url,
        OFFLOAD_USERNAME=user,
        OFFLOAD_PASSWORD=fleet.tokens[user],
    )
    return subprocess.run([OFFLOAD, *args], capture_output=True, text=True, timeout=120, env=env)


def test_the_cli_presents_the_device_token(fleet: Fleet, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(400_000))  # over the broker's 256 KiB: offloaded
    sent = offload(fleet, "dev-1", "publish", "-t", "dev/dev-1/pic", "-f", str(big))
    assert sent.returncode == 0, sent.stderr
    doc = json.loads(sent.stdout)
    assert doc["route"] == "offloaded"
    fetched = offload(fleet, "dev-1", "fetch", doc["url"], "-o", str(tmp_path / "got"))
    assert fetched.returncode == 0, fetched.stderr
    assert (tmp_path / "got").read_bytes() == big.read_bytes()
    # The token's claim does not grant this topic: refused like a forbidden login.
    other = offload(fleet, "dev-1", "publish", "-t", "dev/dev-2/pic", "-f", str(big))
    assert other.returncode == 6 and "HTTP 403" in other.stderr, other.stderr
    # The cause named: the token's claim decided, not a broker ACL.
    assert "(decided by the token's 'acl' claim)" in other.stderr, other.stderr
    assert "ACL" not in other.stderr, other.stderr
    # The broker still takes dev-2's expired token; the gateway does not: exit 6, saying
    # the token expired (not "log in with --username and --password": it did).
    expired = offload(fleet, "dev-2", "publish", "-t", "dev/dev-2/pic", "-f", str(big))
    assert expired.returncode == 6, expired.stderr
    assert expired.stderr.startswith("offload: access refused"), expired.stderr
    assert "the bearer token (a JWT) was refused: it has expired" in expired.stderr
    assert "--username" not in expired.stderr, expired.stderr
    assert "Traceback" not in expired.stderr and fleet.tokens["dev-2"] not in expired.stderr


def test_the_proxy_presents_the_device_token(fleet: Fleet) -> None:
    server = start_proxy(fleet.broker, fleet.gateway)
    try:
        viewer = PahoPeer(server.port, credentials=("dev-1", fleet.tokens["dev-1"]))
        viewer.subscribe(fleet.broker, "dev/dev-1/#")
        payload = os.urandom(MiB)
        results: dict[str, int] = {}
        for user, topic in (
            ("dev-1", "dev/dev-1/x"),  # granted by the claim
            ("dev-1", "dev/dev-2/x"),  # not in the claim
            ("dev-2", "dev/dev-2/x"),  # expired token: the broker takes it, the gateway not
        ):
            peer = PahoPeer(server.port, credentials=(user, fleet.tokens[user]))
            acks: list[Any] = []
            peer.client.on_publish = lambda _c, _u, mid, rc, _p, acks=acks: acks.append(rc)
            peer.client.publish(topic, payload, qos=1)
            wait_until(lambda acks=acks: len(acks) == 1, "PUBACK", 60)  # type: ignore[misc]
            results[f"{user} {topic}"] = acks[0].value
            peer.close()
        assert results == {
            "dev-1 dev/dev-1/x": 0x00,
            "dev-1 dev/dev-2/x": 0x87,
            "dev-2 dev/dev-2/x": 0x87,
        }
        got = viewer.wait(1)
        assert [(m.topic, hashlib.sha256(m.payload).hexdigest()) for m in got] == [
            ("dev/dev-1/x", hashlib.sha256(payload).hexdigest())
        ]
        assert server.metric("offload_proxy_offloaded_total") == 1
        assert server.metric("offload_proxy_offload_failures_total", why="401") == 1
        assert server.metric("offload_proxy_offload_failures_total", why="403") == 1
        viewer.close()
    finally:
        server.stop()


def test_a_device_token_counts_against_its_own_account_not_the_name_it_gives(
    tmp_path: Path,
) -> None:
    """A JWT-checking broker may take a valid token whatever user name comes with it (here
    a mosquitto that checks nothing, the gateway checking each token). `mallory`, holding
    her own token, connects naming `victim` and stalls an upload: her share is spent, not
    the victim's (before, the proxy counted shares by the CONNECT's user name, and the
    victim's publish got 0x97 while hers hung)."""
    from test_proxy_fleet import connect_packet, publish_head
    from test_proxy_hostile import _read

    from gateway import Settings

    key = make_key("ES256", "accounts-1")
    tokens = {user: key.sign(claims(user, ttl=3600, acl=ACL)) for user in ("victim", "mallory")}
    (tmp_path / "jwks.json").write_text(jwks(key))
    broker = Mosquitto(max_packet_size=262144, extra_config="allow_anonymous true\n").start()
    gw = GatewayServer(
        Settings(  # type: ignore[call-arg]
            storage_url=f"file://{tmp_path / 'store'}",
            jwks_file=tmp_path / "jwks.json",
            jwt_issuer=ISSUER,
            jwt_audience=AUDIENCE,
            tls=True,
        )
    ).start()
    server = start_proxy(
        broker, gw, max_uploads=8, max_uploads_per_user=1, max_uploads_per_address=8
    )
    mallory = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    try:
        mallory.sendall(connect_packet("m-1", user="victim", password=tokens["mallory"]))
        first, body = _read(mallory)
        assert first == 0x20 and body[1] == 0
        mallory.sendall(publish_head("dev/mallory/big", 4 * MiB) + bytes(300_000))  # stalls
        wait_until(lambda: server.metric("offload_proxy_uploads") == 1, "her upload", 30)
        victim = PahoPeer(server.port, credentials=("victim", tokens["victim"]))
        acks: list[Any] = []
        victim.client.on_publish = lambda _c, _u, _mid, rc, _p: acks.append(rc.value)
        victim.client.publish("dev/victim/pic", os.urandom(MiB), qos=1)
        wait_until(lambda: bool(acks), "the victim's PUBACK", 30)
        # Accepted (0x10: no subscriber yet): her stall holds her own account's share only.
        assert acks[0] in (0x00, 0x10), hex(acks[0])
        victim.close()
    finally:
        mallory.close()
        server.stop()
        gw.stop()
        broker.close()
