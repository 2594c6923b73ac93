"""A fleet's hard moments through offload-proxy (issue 50): every device reconnecting at
once, and one account taking the connections the others need.

Real peers only: mosquitto, `offload-proxy` as its own process for the storm (its listen
backlog, its event loop and its collector as deployed), devices as raw MQTT clients from
distinct loopback addresses (127.0.x.y, tests/_storm.py).
"""

from __future__ import annotations

import asyncio
import resource
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_proxy import PahoPeer, start_proxy
from test_proxy_fleet import USERS, connect_packet, delivered, files  # noqa: F401 - the fixture
from test_proxy_fleet_limits import ProxyProcess
from test_proxy_hostile import until_closed

from _servers import Mosquitto
from _storm import Devices, devices_for

pytestmark = pytest.mark.servers

QUOTA_EXCEEDED = b"\x20\x03\x00\x97\x00"  # CONNACK, Quota exceeded
SERVER_UNAVAILABLE_311 = b"\x20\x02\x00\x03"


def listen_queue(port: int) -> int:
    """The most connections the kernel queues for the listener on `port` (`ss`'s Send-Q)."""
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[2])


@pytest.fixture
def descriptors() -> Iterator[int]:
    """The soft open-file limit raised to the hard one for the test (and the servers it
    starts): a storm holds thousands of sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_storm_of_2000_devices_from_40_addresses_every_connack_accepts(
    descriptors: int, tmp_path: Path
) -> None:
    """2,000 devices from 40 addresses connect through one proxy process, 500 at a time,
    and stay: every CONNACK accepts. The listener queues what the system allows
    (`net.core.somaxconn`): before, asyncio's 100, and a storm of 5,000 devices 1,000 at a
    time met 7,911 listen-queue overflows, each a device's SYN retried a second or more
    later (bench/proxy_storm.py)."""
    assert descriptors >= 4 * 2000 + 1000, f"a storm needs more descriptors ({descriptors})"
    broker = Mosquitto().start()  # after the limit was raised: it holds 2,000 links
    proxy = ProxyProcess(broker, "http://127.0.0.1:9", tmp_path / "proxy.log")
    devices = Devices()
    try:
        somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
        assert listen_queue(proxy.port) == somaxconn
        storm = asyncio.run(devices.storm(proxy.port, devices_for(2000, 40, "t"), 500))
        assert (storm.accepted, storm.refused, storm.failed) == (2000, {}, 0)
        assert not [line for line in proxy.lines() if line["level"] in ("WARNING", "ERROR")]
    finally:
        asyncio.run(devices.release())
        proxy.stop()
        broker.close()


def test_the_listen_backlog_is_a_setting(broker: Mosquitto) -> None:
    """`OFFLOAD_PROXY_BACKLOG` sets the listen queue (asyncio's server listens again with
    its own: it is handed the setting)."""
    proxy = start_proxy(broker, None, endpoint="http://127.0.0.1:9", backlog=77)
    try:
        assert listen_queue(proxy.port) == 77
    finally:
        proxy.stop()


@pytest.fixture
def accounts(
    files: Path,  # noqa: F811
    mosquitto_factory: Callable[..., Mosquitto],
) -> Mosquitto:
    """A broker that checks passwords (the users of test_proxy_fleet: writer, writer2,
    reader, ...)."""
    return mosquitto_factory(
        extra_config=f"allow_anonymous false\npassword_file {files / 'passwd'}\n"
        f"acl_file {files / 'acl'}\n"
    )


def login(
    port: int,
    source: str,
    user: str,
    *,
    password: str | None = None,
    level: int = 5,
    will: tuple[str, bytes] | None = None,
) -> tuple[socket.socket, bytes]:
    """A raw MQTT client from `source` logging in as `user`: its socket and the CONNACK."""
    sock = socket.socket()
    sock.settimeout(30)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    secret = USERS[user] if password is None else password
    client_id = f"acct-{uuid.uuid4().hex[:10]}"
    sock.sendall(connect_packet(client_id, level=level, user=user, password=secret, will=will))
    expected = 5 if level == 5 else 4
    answer = b""
    while len(answer) < expected:
        piece = sock.recv(expected - len(answer))
        if not piece:
            break
        answer += piece
    return sock, answer


def test_one_account_holds_at_most_its_share_of_the_connections(accounts: Mosquitto) -> None:
    """`writer` logs in from 10 addresses: beyond its share (an eighth of max_connections)
    each login, accepted by the broker, is refused with CONNACK 0x97 (3.1.1: 3), and its
    Will is never published. Another account logs in; a wrong password for `writer` costs
    its share nothing; once one of its connections leaves, `writer` logs in again. Before,
    one account logged in 500 connections from 9 addresses and another account got 0x89."""
    proxy = start_proxy(accounts, None, endpoint="http://127.0.0.1:9", max_connections=16)
    share = proxy.proxy.settings.connection_shares(16).per_user
    assert share == 2
    watcher = PahoPeer(accounts.port, credentials=("reader", USERS["reader"]))
    held: list[socket.socket] = []
    try:
        watcher.subscribe(accounts, "data/storm-will/#", qos=1)
        for i in range(share):
            sock, answer = login(proxy.port, f"127.0.40.{i + 1}", "writer")
            assert answer[:1] == b"\x20" and answer[3] == 0, answer
            held.append(sock)
        will = ("data/storm-will/over", b"must never be published")
        over, answer = login(proxy.port, "127.0.40.9", "writer", will=will)
        assert answer == QUOTA_EXCEEDED and until_closed(over) == b""
        old, answer = login(proxy.port, "127.0.40.10", "writer", level=4)
        assert answer == SERVER_UNAVAILABLE_311 and until_closed(old) == b""
        why = "max-connections-per-user"
        assert proxy.metric("offload_proxy_refused_connections_total", why=why) == 2
        wrong, answer = login(proxy.port, "127.0.40.11", "writer", password="wrong")
        assert answer[3] in (0x86, 0x87)  # the broker's refusal, the share untouched
        wrong.close()
        other, answer = login(proxy.port, "127.0.40.12", "writer2")
        assert answer[3] == 0  # another account: its own share
        held.append(other)
        held.pop(0).close()  # one of writer's leaves: its share has room again
        again = None
        for _ in range(50):  # (the proxy sees the close a moment later)
            again, answer = login(proxy.port, "127.0.40.13", "writer")
            if answer[3] == 0:
                break
            again.close()
            time.sleep(0.1)
        assert answer[3] == 0
        held.append(again)
        marker = PahoPeer(accounts.port, credentials=("writer2", USERS["writer2"]))
        marker.client.publish("data/storm-will/marker", b"marker", qos=1).wait_for_publish(10)
        marker.close()
        assert [m.payload for m in delivered(watcher)] == [b"marker"]  # no Will before it
    finally:
        for sock in held:
            sock.close()
        watcher.close()
        proxy.stop()
