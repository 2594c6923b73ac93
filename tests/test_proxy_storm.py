"""A fleet's hard moments through offload-proxy (issue 50): every device reconnecting at
once.

Real peers only: mosquitto, `offload-proxy` as its own process for the storm (its listen
backlog, its event loop and its collector as deployed), devices as raw MQTT clients from
distinct loopback addresses (127.0.x.y, tests/_storm.py).
"""

from __future__ import annotations

import asyncio
import resource
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_proxy import start_proxy
from test_proxy_fleet_limits import ProxyProcess

from _servers import Mosquitto
from _storm import Devices, devices_for

pytestmark = pytest.mark.servers


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
