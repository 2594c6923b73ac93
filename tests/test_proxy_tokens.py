"""A JWT device's shares count against its token's account only once the gateway accepted
the token, and a refused login holds no upload slot while its body would drain (issue 50).

The broker here accepts any login (a broker that checks nothing, or not a JWT's signature);
the gateway verifies every token (JWKS). Before: the proxy charged a device to its token's
`sub` unverified, so 10 forged tokens naming `victim` held all of the victim's upload slots
(its own upload got 0x97), each for as long as the gateway drained the refused body.

Real mosquitto, `offload-gateway` in its own process (frozen with SIGSTOP where a test needs
uploads to stay under way), raw MQTT devices from distinct loopback addresses and paho.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from test_proxy import MiB, PahoPeer, start_proxy
from test_proxy_fleet import connect_packet, publish_head
from test_proxy_hostile import _read

from _frozen import frozen
from _gateway import GatewayProcess
from _jwt_helpers import AUDIENCE, ISSUER, claims, jwks, make_key
from _proxy import ProxyServer
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers

ACL = {"pub": ["dev/${username}/#"], "sub": ["dev/${username}/#"]}
FORGED = 10


@dataclass
class Tokens:
    victim: str
    forged: list[str]  # `sub` victim, signed with a key the gateway does not know


@dataclass
class Stack:
    broker: Mosquitto
    gateway: GatewayProcess
    tokens: Tokens

    @property
    def pid(self) -> int:
        assert self.gateway.proc is not None
        return self.gateway.proc.pid


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    files = tmp_path_factory.mktemp("tokens")
    key, forger = make_key("ES256", "k1"), make_key("ES256", "k1")  # the same kid
    (files / "jwks.json").write_text(jwks(key))
    tokens = Tokens(
        key.sign(claims("victim", ttl=3600, acl=ACL)),
        [forger.sign(claims("victim", ttl=3600, acl=ACL, n=i)) for i in range(FORGED)],
    )
    broker = Mosquitto(max_packet_size=262144, extra_config="allow_anonymous true\n").start()
    gw = GatewayProcess(
        {
            "OFFLOAD_STORAGE_URL": f"file://{files / 'store'}",
            "OFFLOAD_JWKS_FILE": str(files / "jwks.json"),
            "OFFLOAD_JWT_ISSUER": ISSUER,
            "OFFLOAD_JWT_AUDIENCE": AUDIENCE,
            "OFFLOAD_TLS": "true",  # TLS ends in front of it: bearer tokens are taken
            "OFFLOAD_SWEEP_INTERVAL": "0",
            "OFFLOAD_LOG_LEVEL": "WARNING",
        }
    ).start()
    try:
        yield Stack(broker, gw, tokens)
    finally:
        gw.kill()
        broker.close()


@pytest.fixture
def proxy(stack: Stack) -> Iterator[ProxyServer]:
    server = start_proxy(
        stack.broker,
        stack.gateway,  # type: ignore[arg-type]
        max_uploads_per_user=1,  # one account, one upload at once
        max_uploads_per_address=8,
        http_timeout=30,
    )
    yield server
    server.stop()


def _device(port: int, source: str, token: str) -> socket.socket:
    """A raw MQTT 5 device from `source` logging in as `victim` with `token`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(60)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.sendall(connect_packet(f"t-{uuid.uuid4().hex[:10]}", user="victim", password=token))
    first, body = _read(sock)
    assert first == 0x20 and body[1] == 0, f"CONNACK {body.hex()}"
    return sock


def _puback(sock: socket.socket) -> int:
    first, body = _read(sock)
    assert first == 0x40, hex(first)
    return body[2] if len(body) > 2 else 0


def _uploads(server: ProxyServer) -> float:
    return server.metric("offload_proxy_uploads")


def _acked(victim: PahoPeer) -> Callable[[], int]:
    codes: list[int] = []
    victim.client.on_publish = lambda _c, _u, _mid, rc, _p: codes.append(rc.value)
    victim.client.publish("dev/victim/pic", os.urandom(MiB), qos=1)

    def code() -> int:
        wait_until(lambda: bool(codes), "the victim's PUBACK", 60)
        return codes.pop()

    return code


def test_forged_tokens_charge_nobody_and_the_real_device_uploads_beside_them(
    stack: Stack, proxy: ProxyServer
) -> None:
    """10 devices with forged tokens naming `victim` have uploads under way (the gateway is
    frozen: they wait for its word) while the victim, whose account may hold one upload,
    uploads too: the forged ones charge no account, so the victim's upload goes ahead
    (before: the second forged device and the victim got 0x97). The gateway resumes: the
    forged ones are refused (0x87), the victim's is stored. From then on its token is known
    to be genuine and its account counts: a second upload of it beside a stalled one gets
    0x97."""
    watcher = PahoPeer(stack.broker.port)
    watcher.subscribe(stack.broker, "dev/victim/#")
    forged: list[socket.socket] = []
    victim = PahoPeer(proxy.port, credentials=("victim", stack.tokens.victim))
    try:
        with frozen(stack.pid):
            for i, token in enumerate(stack.tokens.forged):
                sock = _device(proxy.port, f"127.0.7.{10 + i}", token)
                sock.sendall(publish_head("dev/victim/forged", 512 * 1024) + bytes(512 * 1024))
                forged.append(sock)
            wait_until(lambda: _uploads(proxy) == FORGED, "the forged uploads under way", 20)
            code = _acked(victim)
            wait_until(lambda: _uploads(proxy) == FORGED + 1, "the victim's upload", 20)
        assert code() in (0x00, 0x10)
        assert [_puback(sock) for sock in forged] == [0x87] * FORGED
        assert proxy.metric("offload_proxy_offload_failures_total", why="401") == FORGED
        wait_until(lambda: len(watcher.messages) >= 1, "the victim's message", 20)
        assert [m.topic for m in watcher.messages] == ["dev/victim/pic"]
        # Verified now: the account's one upload at once holds for every device with it.
        stalled = _device(proxy.port, "127.0.7.3", stack.tokens.victim)
        stalled.sendall(publish_head("dev/victim/slow", 4 * MiB) + bytes(300_000))
        wait_until(lambda: _uploads(proxy) == 1, "the stalled upload", 20)
        assert _acked(victim)() == 0x97
        stalled.close()
    finally:
        for sock in forged:
            sock.close()
        victim.close()
        watcher.close()


def test_a_refused_login_holds_no_upload_slot_while_its_device_stalls(
    stack: Stack, proxy: ProxyServer
) -> None:
    """A forged token's PUBLISH of 4 MiB stops after 300 KB. The gateway refuses the token
    at once (the proxy asks `Expect: 100-continue`, so it does not wait to drain the body
    first) and the proxy stops feeding that upload when it sees the answer: the slot is
    free while the device still sits on its PUBLISH (before: held until the gateway's
    drain gave up, `OFFLOAD_BODY_IDLE_TIMEOUT`, 30 s); the rest of it, when it comes, is
    read and dropped, never sent to the gateway, and the device gets 0x87."""
    sock = _device(proxy.port, "127.0.7.4", stack.tokens.forged[0])
    try:
        sock.sendall(publish_head("dev/victim/stall", 4 * MiB) + bytes(300_000))
        wait_until(lambda: proxy.metric("offload_proxy_uploaded_bytes_total") > 0, "upload", 20)
        wait_until(lambda: _uploads(proxy) == 0, "the refused upload's slot given back", 5)
        sock.sendall(bytes(4 * MiB - 300_000))  # the rest, read and dropped: then its answer
        assert _puback(sock) == 0x87
        assert proxy.metric("offload_proxy_uploaded_bytes_total") < 4 * MiB
    finally:
        sock.close()
