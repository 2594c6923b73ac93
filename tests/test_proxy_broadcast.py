"""A fleet's broadcast through offload-proxy (issue 50): one fetch of the payload for every
device behind the proxy that gets the same placeholder meanwhile (proxy/_flights.py), each
device fed at its own pace; and a placeholder that lies about its payload costs its
subscribers nothing (proxy/_stat.py).

Real mosquitto (256 KiB), gateway and SeaweedFS; devices are raw MQTT clients, each from a
loopback address of its own (tests/_fleet.py). What the gateway served is counted at the
gateway, by its own metrics (`offload_http_requests_total`, `_sent_bytes_total` of the
payload route), not inside the proxy.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from test_proxy import MiB, PahoPeer, start_proxy
from test_proxy_fleet import device
from test_proxy_fleet_limits import ProxyProcess
from test_proxy_hostile import _packet, _read, _text

from _auth import credential_files, secured_pair
from _fleet import Behaviour, Fleet
from _gateway import GatewayServer
from _proxy import ProxyServer
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers

PAYLOAD_ROUTE = "/msg/{message_id}/payload"


def served() -> tuple[float, float]:
    """Whole payload GETs the gateway answered 200 so far, and the bytes it sent on them."""
    gets = REGISTRY.get_sample_value(
        "offload_http_requests_total", {"method": "GET", "route": PAYLOAD_ROUTE, "status": "200"}
    )
    sent = REGISTRY.get_sample_value("offload_http_sent_bytes_total", {"route": PAYLOAD_ROUTE})
    return gets or 0.0, sent or 0.0


def publish(port: int, topic: str, payload: bytes, *login: str) -> None:
    """An unmodified publisher: `mosquitto_pub` through `port`, QoS 1."""
    pub = subprocess.run(
        ["mosquitto_pub", "-p", str(port), "-t", topic, "-q", "1", "-s", *login],
        input=payload, capture_output=True, timeout=120,
    )  # fmt: skip
    assert pub.returncode == 0, pub.stderr.decode()


def test_a_broadcast_is_fetched_once_and_each_device_fed_at_its_own_pace(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    """102 devices from 102 addresses get one 6 MiB message: the gateway serves it once,
    each device gets it byte-exact; one reading at 2 MB/s (more than the socket buffers
    hold, so the proxy waits on it) finishes last and held nobody, one leaving at 1 MiB
    costs the others nothing. Before, the gateway served it once per device (issue 50:
    200 times for 200)."""
    proxy = start_proxy(broker, gateway)
    topic = unique_topic("firmware")
    payload = os.urandom(6 * MiB)
    slow, leaver = 100, 101
    behaviours = {slow: Behaviour(rate=2_000_000), leaver: Behaviour(leave_at=MiB)}
    try:
        fleet = Fleet(proxy.port, topic, 102, payload, behaviours=behaviours).start()
        gets, sent = served()
        publish(proxy.port, topic, payload)
        results = fleet.results()
        normal = results[:slow]
        assert all(r.exact and r.received == len(payload) and r.done for r in normal), [
            r for r in normal if not r.done
        ][:3]
        assert results[slow].exact and results[slow].done  # slowly, but whole
        assert max(r.done or 0 for r in normal) < (results[slow].done or 0)  # nobody waited
        assert results[leaver].done is None and MiB <= results[leaver].received < len(payload)
        after = served()
        assert after[0] - gets == 1  # one GET of the payload for 102 devices
        assert after[1] - sent == len(payload)
        assert proxy.metric("offload_proxy_fetches_joined_total") == 101
        wait_until(lambda: proxy.call(lambda: proxy.proxy.services.shared.flights) == 0,
                   "the flight ended", 10)  # fmt: skip
        assert proxy.metric("offload_proxy_shared_bytes") == 0
        assert proxy.metric("offload_proxy_fetches") == 0
    finally:
        proxy.stop()


class Subscriber(PahoPeer):
    """A plain paho subscriber through the proxy that counts the times it was cut off (it
    reconnects, as paho does)."""

    def __init__(self, port: int, **kw: Any) -> None:
        self.disconnects = 0
        super().__init__(port, **kw)
        self.client.on_disconnect = self._dropped

    def _dropped(self, *_: Any) -> None:
        self.disconnects += 1


def test_false_digests_cost_the_subscriber_nothing(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    """A device uploads one payload of its own, then 20 placeholders naming it with fresh
    false SHA-256s (and 2 with a false size) are published, each followed by a true message.
    Before, the unmodified subscriber was disconnected at each (20 times in 10 s). Now the
    proxy asks the gateway what it holds before writing anything: the subscriber gets each
    lie as the placeholder it is, and every true message, and is never cut off; the
    failed-message memory and the metric grow by a bounded amount."""
    proxy = start_proxy(broker, gateway)
    topic = unique_topic("lies")
    spy = PahoPeer(broker.port)
    spy.subscribe(broker, topic, qos=1)
    sub = Subscriber(proxy.port)
    sub.subscribe(broker, topic, qos=1)
    try:
        own = os.urandom(MiB)
        publish(proxy.port, topic, own)
        ref = json.loads(spy.wait(1)[0].payload)
        assert sub.wait(1)[0].payload == own
        lies = [{**ref, "sha256": hashlib.sha256(os.urandom(8)).hexdigest()} for _ in range(20)]
        lies += [{**ref, "size": ref["size"] + 1}, {**ref, "size": ref["size"] - 1}]
        for i, lie in enumerate(lies):
            spy.client.publish(topic, json.dumps(lie), qos=1).wait_for_publish(30)
            spy.client.publish(topic, f"true {i}", qos=1).wait_for_publish(30)
        got = [m.payload for m in sub.wait(1 + 2 * len(lies))[1:]]
        assert got[1::2] == [f"true {i}".encode() for i in range(len(lies))]
        assert [json.loads(p) for p in got[::2]] == lies  # each lie handed on as it is
        assert sub.disconnects == 0
        assert proxy.metric("offload_proxy_placeholders_passed_total", why="mismatch") == 22
        samples = why_labels(proxy, "offload_proxy_placeholders_passed_total")
        assert set(samples) == {"mismatch"}  # one label, however many lies
        assert proxy.call(lambda: len(proxy.proxy.services.poisoned)) == 22
        spy.client.publish(topic, json.dumps(lies[0]), qos=1).wait_for_publish(30)
        assert json.loads(sub.wait(len(got) + 2)[-1].payload) == lies[0]  # not asked again
        assert proxy.metric("offload_proxy_placeholders_passed_total", why="failed-before") == 1
    finally:
        for peer in (spy, sub):
            peer.close()
        proxy.stop()


def why_labels(proxy: ProxyServer, name: str) -> dict[str, float]:
    """The `why` labels of a proxy counter and their values."""
    out: dict[str, float] = {}
    for metric in proxy.proxy.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == name:
                out[sample.labels["why"]] = sample.value
    return out


USERS = {
    "writer": "w-secret-1",
    "reader": "r-secret-1",
    "outsider": "o-secret-1",
    "gateway": "g-secret-1",
}
ACL = """\
pattern read sys/metadata
user writer
topic readwrite data/#
topic readwrite other/#
user reader
topic read data/#
user outsider
topic read other/#
user gateway
topic readwrite sys/metadata
topic readwrite data/#
topic readwrite other/#
"""


@pytest.fixture
def files() -> Iterator[Path]:
    with credential_files("offload-broadcast-", USERS, ACL) as path:
        yield path


def test_no_device_gets_bytes_through_the_shared_copy_it_could_not_fetch_itself(
    files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    """A payload on data/ is being fed to a reader (slowly: its flight stays open). A copy
    of its placeholder published on other/, where an outsider that may not read data/
    subscribes: the outsider's own HEAD is refused, so it gets the placeholder, never the
    bytes the proxy holds for the reader; the gateway served the payload once."""
    broker, gw = secured_pair(
        files, mosquitto_factory, gateway_factory, gateway_password=USERS["gateway"],
        trusted_proxies="127.0.0.1",
    )  # fmt: skip
    proxy = start_proxy(broker, gw)
    payload = os.urandom(6 * MiB)  # more than the socket buffers hold: the flight stays
    spy = PahoPeer(broker.port, credentials=("writer", USERS["writer"]))
    spy.subscribe(broker, "data/fw", qos=1)
    reader = Fleet(
        proxy.port, "data/fw", 1, payload, behaviours={0: Behaviour(rate=1_000_000)},
        login=("reader", USERS["reader"]),
    ).start()  # fmt: skip
    outsider = PahoPeer(proxy.port, credentials=("outsider", USERS["outsider"]))
    outsider.subscribe(broker, "other/fw", qos=1)
    try:
        gets, _ = served()
        publish(proxy.port, "data/fw", payload, "-u", "writer", "-P", USERS["writer"])
        ref = spy.wait(1)[0].payload
        wait_until(lambda: proxy.metric("offload_proxy_shared_bytes") == len(payload),
                   "the reader's flight", 20)  # fmt: skip
        spy.client.publish("other/fw", ref, qos=1).wait_for_publish(30)
        got = outsider.wait(1)[0].payload
        assert got == ref  # the placeholder, not the payload
        assert proxy.metric("offload_proxy_placeholders_passed_total", why="fetch-failed") == 1
        assert proxy.metric("offload_proxy_fetches_joined_total") == 0
        took = reader.results()[0]
        assert took.exact and took.done  # the reader's own payload, whole
        assert served()[0] - gets == 1
    finally:
        for peer in (spy, outsider):
            peer.close()
        proxy.stop()


def test_a_payload_with_no_room_to_share_is_fetched_for_each_device_alone(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    """`max_shared_bytes` smaller than the payload: nothing is held for sharing, each of the
    4 devices gets the payload fetched for it alone (as before sharing), byte-exact."""
    shares = {"max_shared_bytes_per_user": 64 * MiB, "max_shared_bytes_per_address": 64 * MiB}
    proxy = start_proxy(broker, gateway, max_shared_bytes=MiB, **shares)
    topic = unique_topic("unshared")
    payload = os.urandom(2 * MiB)
    try:
        fleet = Fleet(proxy.port, topic, 4, payload, first_address=200).start()
        gets, _ = served()
        publish(proxy.port, topic, payload)
        assert all(r.exact and r.done for r in fleet.results())
        assert served()[0] - gets == 4
        assert proxy.metric("offload_proxy_fetches_joined_total") == 0
    finally:
        proxy.stop()


def _spooled(directory: Path) -> int:
    """Files in `directory` this process holds open (unlinked once made: no names)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        count += target.startswith(f"{directory}/offload-proxy-shared-")
    return count


def test_a_shared_payload_beyond_the_memory_bound_waits_in_a_file(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    """`shared_memory_bytes` 0: the payload shared by 3 devices (one reading slowly, so it
    is held a while) waits in one temporary file in `spool_dir`, never a copy per device;
    the file is gone once the last of them has it."""
    proxy = start_proxy(broker, gateway, shared_memory_bytes=0, spool_dir=tmp_path)
    topic = unique_topic("spooled")
    payload = os.urandom(6 * MiB)
    try:
        fleet = Fleet(
            proxy.port, topic, 3, payload, behaviours={2: Behaviour(rate=2_000_000)},
            first_address=210,
        ).start()  # fmt: skip
        publish(proxy.port, topic, payload)
        wait_until(lambda: _spooled(tmp_path) == 1, "the payload in a file", 20)
        assert proxy.metric("offload_proxy_shared_bytes") == len(payload)
        assert all(r.exact and r.done for r in fleet.results())
        wait_until(lambda: _spooled(tmp_path) == 0, "the file closed", 10)
        assert proxy.metric("offload_proxy_fetches_joined_total") == 2
        assert list(tmp_path.iterdir()) == []
    finally:
        proxy.stop()


def _held_open(port: int, source: str) -> int:
    """The proxy's connections on `port` from `source` that the kernel still holds open."""
    out = subprocess.run(
        ["ss", "-tnH", "state", "established", f"sport = :{port} and dst {source}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return len(out.splitlines())


def test_devices_that_stop_reading_a_shared_payload_are_closed_not_held(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    """Three devices join one shared fetch of 8 MiB; two take the PUBLISH's first bytes
    and then read nothing, ever, and stay connected. After `idle_timeout` without progress
    the proxy ends their sessions, and then their sockets: before, it closed each one
    gracefully and waited for the buffered megabytes to be flushed to a peer that never
    reads, so the socket (a file descriptor, the unsent bytes, under uvloop the whole
    spool they were a view of) outlived the session for as long as the device kept it
    open, uncounted (its connection slot was already given back). The third device gets
    the payload whole."""
    proxy = start_proxy(broker, gateway, idle_timeout=1)
    topic = unique_topic("stalled")
    payload = os.urandom(8 * MiB)  # more than the kernel's buffers take for a device
    stalled = ["127.0.5.1", "127.0.5.2"]
    sockets = [device(proxy.port, source, rcvbuf=4096) for source in stalled]
    try:
        for sock in sockets:
            sock.sendall(_packet(0x82, b"\x00\x01\x00" + _text(topic) + b"\x01"))
            assert _read(sock)[0] == 0x90  # SUBACK; then only the PUBLISH's first byte
        fleet = Fleet(proxy.port, topic, 1, payload, first_address=600).start()
        publish(proxy.port, topic, payload)
        for sock in sockets:
            assert sock.recv(1)[0] >> 4 == 3  # the PUBLISH has begun; nothing more is read
        took = fleet.results()[0]
        assert took.exact and took.done
        wait_until(lambda: proxy.metric("offload_proxy_connections") == 0, "cut off", 30)
        wait_until(
            lambda: sum(_held_open(proxy.port, source) for source in stalled) == 0,
            "their sockets closed", 10,
        )  # fmt: skip
        assert proxy.metric("offload_proxy_shared_bytes") == 0
    finally:
        for sock in sockets:
            sock.close()
        proxy.stop()


def test_devices_cut_off_inside_shared_payloads_leave_nothing_resident(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    """`offload-proxy` (its own process, its collector paced as deployed): four devices,
    each the only reader of its own 8 MiB broadcast, take the PUBLISH's first byte and
    read nothing more; at `idle_timeout` each is cut off and its spool given back, and the
    process's resident size returns to what it was. Before, the error that ended each
    relay was in a reference cycle with its task (through `asyncio.timeout`), and its
    traceback kept the frame writing the payload, whose piece was a view of the whole
    spool: 8 MiB stayed resident per device until a full collection, which the proxy runs
    rarely (+33 MiB here; +101 MiB after twelve such devices one after the other)."""
    proxy = ProxyProcess(broker, gateway.url, tmp_path / "proxy.log", idle_timeout="1")
    topics = [unique_topic("cut-off") for _ in range(4)]
    stalled = [f"127.0.6.{n + 1}" for n in range(len(topics))]
    payload = os.urandom(8 * MiB)
    try:
        warm = Fleet(proxy.port, topics[0], 1, payload, first_address=700).start()
        publish(proxy.port, topics[0], payload)  # a first spool and fetch, read whole
        assert warm.results()[0].done
        before = proxy.rss
        sockets = [device(proxy.port, source, rcvbuf=4096) for source in stalled]
        for sock, topic in zip(sockets, topics, strict=True):
            sock.sendall(_packet(0x82, b"\x00\x01\x00" + _text(topic) + b"\x01"))
            assert _read(sock)[0] == 0x90
        for sock, topic in zip(sockets, topics, strict=True):
            publish(proxy.port, topic, os.urandom(8 * MiB))
            assert sock.recv(1)[0] >> 4 == 3  # the PUBLISH has begun; nothing more is read
        wait_until(
            lambda: sum(_held_open(proxy.port, source) for source in stalled) == 0,
            "the devices cut off", 30,
        )  # fmt: skip
        grown = proxy.rss - before
        assert grown < 12 * MiB, f"{grown / MiB:.1f} MiB still resident"
        for sock in sockets:
            sock.close()
    finally:
        proxy.stop()
