"""A gateway, or the store it redirects to, that trickles its answers to offload-proxy's
fetches: each byte comes well within `http_timeout` of the last, so no read ever times out,
and a fetch had no bound as a whole (issue 51 §1: nothing waits for ever): it held its
devices, its fetch slot and a shared payload's spool for as long as the trickle lasted. Now
each HEAD and GET keeps the library's fetch pace (client/http/_deadline.py):
`fetch_deadline` seconds of grace, then `fetch_min_rate` on average, else its connection is
shut down (`offload_proxy_fetches_cut_off{request}`).

Real mosquitto (256 KiB), gateway and SeaweedFS; the gateway or the store behind a relay
that sends the answers to the proxy's payload requests a byte every 0.2 s
(tests/_trickle.py), which would take minutes; devices are plain paho clients through the
proxy. The floor is 1 s and the rate high here, so that the floor decides: every device
gets the placeholder as the broker sent it soon after, and the fetch slots, the shared
bytes and the flights come back.
"""

from __future__ import annotations

import json
import random
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_proxy import MiB, PahoPeer, start_proxy

from client import Client

from _fleet import Behaviour, Fleet, address
from _gateway import GatewayServer
from _proxy import ProxyServer
from _servers import Mosquitto, SeaweedFS, wait_until
from _trickle import TricklingRelay

pytestmark = pytest.mark.servers

FLOOR = 1.0
RATE = 16 * MiB  # far above what the relay lets through: the floor decides
SIZE = 300 * 1024  # over the broker's 256 KiB: the proxy offloads it
#: Seconds every device has to get its placeholder after the publish: the floor and a
#: watchdog's look (0.25 s), with room for a loaded machine. The relay would take minutes.
WITHIN = 12


@pytest.fixture
def relayed() -> Iterator[list[TricklingRelay]]:
    made: list[TricklingRelay] = []
    yield made
    for relay in made:
        relay.close()


def paced_proxy(broker: Mosquitto, endpoint: str, **settings: Any) -> ProxyServer:
    paced: dict[str, Any] = {"fetch_deadline": FLOOR, "fetch_min_rate": RATE}
    return start_proxy(broker, None, endpoint=endpoint, **(paced | settings))


def trickling_gateway(
    factory: Callable[..., GatewayServer], broker: Mosquitto, relay: TricklingRelay
) -> GatewayServer:
    """A real gateway whose placeholders name the relay in front of it."""
    gw = factory(broker, public_url=relay.url)
    relay.upstream_port = gw.port
    return gw


def placeholders_handed_on(proxy: ProxyServer, topic: str, devices: list[PahoPeer]) -> None:
    """An unmodified publisher sends SIZE bytes through the proxy; every device gets the
    placeholder as it is (nothing of the payload was written to it), within WITHIN s."""
    pub = subprocess.run(
        ["mosquitto_pub", "-p", str(proxy.port), "-t", topic, "-q", "1", "-s"],
        input=bytes(SIZE), capture_output=True, timeout=60,
    )  # fmt: skip
    assert pub.returncode == 0, pub.stderr.decode()
    wait_until(lambda: all(device.messages for device in devices), "every device's message", WITHIN)
    for device in devices:
        assert json.loads(device.messages[0].payload)["size"] == SIZE  # the placeholder
    passed = proxy.metric("offload_proxy_placeholders_passed_total", why="fetch-failed")
    assert passed == len(devices)
    wait_until(lambda: proxy.metric("offload_proxy_fetches") == 0, "the fetch slots back", 5)


def cut_off(proxy: ProxyServer, request: str) -> float:
    """The requests of a kind (head, payload, record) the proxy's pace cut off."""
    return proxy.metric("offload_proxy_fetches_cut_off_total", request=request)


def subscribers(proxy: ProxyServer, broker: Mosquitto, topic: str, n: int) -> list[PahoPeer]:
    """`n` devices, each from a loopback address of its own."""
    devices = [PahoPeer(proxy.port, bind_address=address(i)) for i in range(n)]
    for device in devices:
        device.subscribe(broker, topic, qos=1)
    return devices


def test_a_devices_own_fetch_whose_body_trickles_is_cut_off_at_its_pace(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto,
    unique_topic: Callable[[str], str], relayed: list[TricklingRelay],
) -> None:  # fmt: skip
    """No sharing (`max_shared_bytes` 0): the payload is fetched for the device alone; the
    gateway's answer head comes at once, its body a byte every 0.2 s."""
    relay = TricklingRelay(methods=frozenset({"GET"}), head_at_once=True)
    relayed.append(relay)
    trickling_gateway(gateway_factory, broker, relay)
    proxy = paced_proxy(broker, relay.url, max_shared_bytes=0)
    topic = unique_topic("trickled-get")
    devices = subscribers(proxy, broker, topic, 1)
    try:
        placeholders_handed_on(proxy, topic, devices)
        wait_until(lambda: relay.seen.hung_up == relay.seen.started == 1,
                   "the proxy hung up on the trickle", 5)  # fmt: skip
        assert cut_off(proxy, "payload") == 1
    finally:
        for device in devices:
            device.close()
        proxy.stop()


def test_a_shared_fetch_that_trickles_frees_every_joined_device_its_slot_and_spool(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto,
    unique_topic: Callable[[str], str], relayed: list[TricklingRelay],
) -> None:  # fmt: skip
    """Three devices from three addresses get the same placeholder: one GET for all of
    them (two join it), whose answer trickles from its status line on. Each device gets
    the placeholder; the GET's fetch slot, the spool's bytes and the flight come back."""
    relay = TricklingRelay(methods=frozenset({"GET"}))
    relayed.append(relay)
    trickling_gateway(gateway_factory, broker, relay)
    proxy = paced_proxy(broker, relay.url)
    topic = unique_topic("trickled-shared")
    devices = subscribers(proxy, broker, topic, 3)
    try:
        placeholders_handed_on(proxy, topic, devices)
        assert proxy.metric("offload_proxy_fetches_joined_total") == 2  # one GET for three
        assert relay.seen.started == 1
        wait_until(lambda: proxy.call(lambda: proxy.proxy.services.shared.flights) == 0,
                   "the flight ended", 5)  # fmt: skip
        assert proxy.metric("offload_proxy_shared_bytes") == 0
        wait_until(lambda: relay.seen.hung_up == 1, "the proxy hung up on the trickle", 5)
        assert cut_off(proxy, "payload") == 1  # one GET cut off, three devices told
    finally:
        for device in devices:
            device.close()
        proxy.stop()


def test_a_head_that_trickles_is_cut_off_at_the_pace(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto,
    unique_topic: Callable[[str], str], relayed: list[TricklingRelay],
) -> None:  # fmt: skip
    """The gateway's answer to each device's HEAD (what it holds, asked with the device's
    login before anything is written) trickles: both devices get the placeholder, and no
    GET is made."""
    relay = TricklingRelay(methods=frozenset({"HEAD"}))
    relayed.append(relay)
    trickling_gateway(gateway_factory, broker, relay)
    proxy = paced_proxy(broker, relay.url)
    topic = unique_topic("trickled-head")
    devices = subscribers(proxy, broker, topic, 2)
    try:
        placeholders_handed_on(proxy, topic, devices)
        assert relay.seen.started == 2  # two HEADs, nothing else trickled
        wait_until(lambda: relay.seen.hung_up == 2, "the proxy hung up on both", 5)
        assert proxy.call(lambda: proxy.proxy.services.shared.flights) == 0
        assert (cut_off(proxy, "head"), cut_off(proxy, "payload")) == (2, 0)
    finally:
        for device in devices:
            device.close()
        proxy.stop()


def test_a_store_that_trickles_a_redirected_fetch_is_cut_off_at_the_pace(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto, seaweed: SeaweedFS,
    unique_topic: Callable[[str], str], relayed: list[TricklingRelay],
) -> None:  # fmt: skip
    """Direct transfers: the gateway redirects the GET to the store it declares, which
    trickles its answer (the GET's pace goes on across the redirect)."""
    relay = TricklingRelay(methods=frozenset({"GET"}), path="/")
    relay.upstream_port = seaweed.s3_port
    relayed.append(relay)
    gw = gateway_factory(broker, s3_public_url=relay.url)
    proxy = paced_proxy(broker, gw.url, max_shared_bytes=0)
    topic = unique_topic("trickled-store")
    devices = subscribers(proxy, broker, topic, 1)
    try:
        placeholders_handed_on(proxy, topic, devices)
        wait_until(lambda: relay.seen.hung_up == relay.seen.started == 1,
                   "the proxy hung up on the store", 5)  # fmt: skip
        assert cut_off(proxy, "payload") == 1
        assert cut_off(proxy, "record") == 0  # the gateway's own record came at once
    finally:
        for device in devices:
            device.close()
        proxy.stop()


def test_a_device_that_reads_slowly_is_not_charged_to_the_gateways_pace(
    gateway: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    """A payload fetched for one device alone waits for it to take each piece: that time
    is the device's, bounded by `idle_timeout`, not the gateway's. 16 MiB to a device
    reading 4 MB/s (some 4 s) under a pace that wants them within 2 s: delivered whole."""
    payload = bytes(range(256)) * (16 * MiB // 256)
    proxy = paced_proxy(broker, gateway.url, max_shared_bytes=0, fetch_min_rate=16 * MiB)
    topic = unique_topic("slow-reader")
    try:
        fleet = Fleet(proxy.port, topic, 1, payload, behaviours={0: Behaviour(rate=4e6)})
        fleet.start()
        pub = subprocess.run(
            ["mosquitto_pub", "-p", str(proxy.port), "-t", topic, "-q", "1", "-s"],
            input=payload, capture_output=True, timeout=60,
        )  # fmt: skip
        assert pub.returncode == 0, pub.stderr.decode()
        took = fleet.results()[0]
        assert took.exact and took.done is not None and took.received == len(payload), took
        assert cut_off(proxy, "payload") == 0
    finally:
        proxy.stop()


def test_a_body_cut_short_is_a_failed_fetch_not_the_publishers_lie(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto,
    unique_topic: Callable[[str], str], relayed: list[TricklingRelay],
) -> None:  # fmt: skip
    """The gateway's answer ends cleanly 1,000 bytes into its body (what a connection the
    pace shut down also gives a read): the fetch broke off, which says nothing about the
    placeholder, so it is not remembered as a lie (a redelivery is fetched again)."""
    relay = TricklingRelay(methods=frozenset({"GET"}), cut_after=1000)
    relayed.append(relay)
    trickling_gateway(gateway_factory, broker, relay)
    proxy = paced_proxy(broker, relay.url, max_shared_bytes=0)
    topic = unique_topic("cut-short")
    devices = subscribers(proxy, broker, topic, 1)
    try:
        pub = subprocess.run(
            ["mosquitto_pub", "-p", str(proxy.port), "-t", topic, "-q", "1", "-s"],
            input=bytes(SIZE), capture_output=True, timeout=60,
        )  # fmt: skip
        assert pub.returncode == 0, pub.stderr.decode()
        wait_until(lambda: relay.seen.started == 1, "the GET", WITHIN)
        wait_until(lambda: proxy.metric("offload_proxy_fetches") == 0, "the fetch slot back", 5)
        assert proxy.call(lambda: len(proxy.proxy.services.poisoned)) == 0
        assert proxy.metric("offload_proxy_placeholders_passed_total", why="mismatch") == 0
        assert cut_off(proxy, "payload") == 0  # broke off, not slow
    finally:
        for device in devices:
            device.close()
        proxy.stop()


def test_another_devices_fetch_goes_on_while_one_trickles(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto,
    unique_topic: Callable[[str], str], relayed: list[TricklingRelay],
) -> None:  # fmt: skip
    """The first GET trickles (its head at once), the later ones pass at once. While the
    first device's fetch trickles, a second device (another address, another topic) gets
    its own payload whole; the first then gets its placeholder, cut off at the floor (5 s
    here, so that the second fetch falls within it)."""
    relay = TricklingRelay(methods=frozenset({"GET"}), head_at_once=True, trickled=1)
    relayed.append(relay)
    trickling_gateway(gateway_factory, broker, relay)
    proxy = paced_proxy(broker, relay.url, max_shared_bytes=0, fetch_deadline=5.0)
    slow_topic, other_topic = unique_topic("trickled-one"), unique_topic("whole-other")
    slow = subscribers(proxy, broker, slow_topic, 1)[0]
    other = PahoPeer(proxy.port, bind_address=address(1))
    other.subscribe(broker, other_topic, qos=1)
    payload = random.randbytes(SIZE)
    try:
        for topic, body in ((slow_topic, bytes(SIZE)), (other_topic, payload)):
            pub = subprocess.run(
                ["mosquitto_pub", "-p", str(proxy.port), "-t", topic, "-q", "1", "-s"],
                input=body, capture_output=True, timeout=60,
            )  # fmt: skip
            assert pub.returncode == 0, pub.stderr.decode()
            wait_until(lambda: relay.seen.started == 1, "the trickled GET", WITHIN)
        wait_until(lambda: other.messages, "the other device's payload", WITHIN)
        assert other.messages[0].payload == payload
        assert not slow.messages and relay.seen.hung_up == 0  # still trickling meanwhile
        wait_until(lambda: slow.messages, "the placeholder", WITHIN)
        assert json.loads(slow.messages[0].payload)["size"] == SIZE
        assert cut_off(proxy, "payload") == 1
    finally:
        slow.close()
        other.close()
        proxy.stop()


def test_a_decoded_fetch_that_trickles_is_cut_off_at_its_pace(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto,
    unique_topic: Callable[[str], str], relayed: list[TricklingRelay],
) -> None:  # fmt: skip
    """A compressed payload (zstd, published by the library straight on the broker) is
    fetched whole and decoded before anything is written to the device (proxy/_unseal.py),
    never shared: its GET keeps the same pace. The body trickles: the device gets the
    placeholder as it was, the fetch slot comes back, and no decode spool is left."""
    relay = TricklingRelay(methods=frozenset({"GET"}), head_at_once=True)
    relayed.append(relay)
    trickling_gateway(gateway_factory, broker, relay)
    proxy = paced_proxy(broker, relay.url)
    topic = unique_topic("trickled-decoded")
    devices = subscribers(proxy, broker, topic, 1)
    # Through the relay, as the proxy's devices see the gateway (it trickles GETs only).
    publisher = Client(broker.url, endpoint=relay.url, compress=True, discovery_wait=10.0)
    try:
        publisher.connect()
        # Hex text: zstd halves it, still over the broker's 256 KiB (offloaded, compressed).
        publisher.publish(topic, random.randbytes(SIZE).hex().encode(), qos=1)
        wait_until(lambda: devices[0].messages, "the device's message", WITHIN)
        placeholder = json.loads(devices[0].messages[0].payload)
        assert placeholder["cmp"] == "zstd" and placeholder["size"] > 256 * 1024
        assert proxy.metric("offload_proxy_placeholders_passed_total", why="fetch-failed") == 1
        wait_until(lambda: relay.seen.hung_up == relay.seen.started == 1,
                   "the proxy hung up on the trickle", 5)  # fmt: skip
        assert cut_off(proxy, "payload") == 1
        wait_until(lambda: proxy.metric("offload_proxy_fetches") == 0, "the fetch slot back", 5)
        assert proxy.metric("offload_proxy_resolved_total") == 0
    finally:
        publisher.close()
        for device in devices:
            device.close()
        proxy.stop()
