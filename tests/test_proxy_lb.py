"""offload-proxy behind a real HAProxy (TCP mode) that sends PROXY protocol headers
(`send-proxy-v2`, `send-proxy`): the device's address is the header's, on the MQTT and the
WebSocket listener and over TLS; a header from an address not in `OFFLOAD_PROXY_TRUSTED_LBS`
is refused, and so is a trusted peer that sends none. Devices are told apart by their
loopback source address (127.0.0.2, .3, ...: `mosquitto_pub -A`)."""

from __future__ import annotations

import ipaddress
import logging
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from test_gateway_forwarded import _upload_limits
from test_proxy import MiB, start_proxy
from test_proxy_fleet import device, publish_head
from test_proxy_hostile import _read
from test_tls import pki  # noqa: F401 - the fixture

from _gateway import GatewayServer
from _haproxy import HAProxy, Route
from _proxy import ProxyServer
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers

SIG = b"\r\n\r\n\x00\r\nQUIT\n"
MQTT5_CONNECT = bytes([0x10, 13, 0, 4, *b"MQTT", 5, 0x02, 0, 60, 0, 0, 0])


def v2_header(source: str, port: int) -> bytes:
    block = ipaddress.ip_address(source).packed + bytes([127, 0, 0, 1])
    block += port.to_bytes(2, "big") + (1883).to_bytes(2, "big")
    return SIG + b"\x21\x11" + len(block).to_bytes(2, "big") + block


@pytest.fixture
def fleet(broker: Mosquitto) -> Iterator[tuple[ProxyServer, HAProxy]]:
    """The proxy trusting 127.0.0.1 only, and HAProxy routes to it from 127.0.0.1 (v2, v1,
    no header, WebSocket) and from 127.0.0.5 (v2: an address the proxy does not trust)."""
    proxy = start_proxy(broker, None, trusted_lbs="127.0.0.1", ws_port=0, connect_timeout=2)
    lb = HAProxy(
        {
            "v2": Route((proxy.port,), "send-proxy-v2"),
            "v1": Route((proxy.port,), "send-proxy"),
            "none": Route((proxy.port,)),
            "spoof": Route((proxy.port,), "send-proxy-v2 source 127.0.0.5"),
            "ws": Route((proxy.proxy.ws_port,), "send-proxy-v2"),
        }
    ).start()
    yield proxy, lb
    lb.close()
    proxy.stop()


def peers(proxy: ProxyServer) -> list[str]:
    return sorted(proxy.call(lambda: [s.peer for s in proxy.proxy._sessions.values()]))


def refused(proxy: ProxyServer, why: str) -> float:
    return proxy.metric("offload_proxy_refused_connections_total", why=why)


def pub(port: int, topic: str, source: str, *extra: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-A", source, "-t", topic,
         "-m", "hello", "-q", "1", "-V", "5", *extra],
        capture_output=True, timeout=30,
    )  # fmt: skip


def delivered(
    sub: subprocess.Popen[bytes], port: int, topic: str, source: str, *extra: str
) -> None:
    """`mosquitto_pub` from `source` through `port`; `sub` (`-C 1`) gets its message."""
    sent = pub(port, topic, source, *extra)
    assert sent.returncode == 0, sent.stderr
    out, _ = sub.communicate(timeout=30)
    assert out == b"hello\n"


def _connack(raw: socket.socket) -> bytes:
    """The first bytes the proxy answers; b"" when it closed (a reset: it left bytes unread)."""
    raw.settimeout(10)
    try:
        return raw.recv(4)
    except ConnectionResetError:
        return b""


def test_behind_haproxy_the_device_address_is_the_proxy_headers(
    fleet: tuple[ProxyServer, HAProxy],
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="proxy")
    proxy, lb = fleet
    topic = unique_topic("lb")
    sub = subprocess.Popen(
        ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(lb.ports["v1"]), "-A", "127.0.0.3",
         "-t", topic, "-C", "1", "-q", "1", "-V", "5", "-i", "lb-sub"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    wait_until(lambda: "Sending SUBACK to lb-sub" in broker.log(), "subscribed", 20)
    ws = paho.Client(CallbackAPIVersion.VERSION2, "lb-ws", transport="websockets")
    ws.connect("127.0.0.1", lb.ports["ws"], bind_address="127.0.0.4")
    ws.loop_start()
    try:
        wait_until(ws.is_connected, "WebSocket client connected", 20)
        assert peers(proxy) == ["127.0.0.3", "127.0.0.4"]  # not HAProxy's 127.0.0.1
        delivered(sub, lb.ports["v2"], topic, "127.0.0.2")
    finally:
        ws.disconnect()
        ws.loop_stop()
        if sub.poll() is None:
            sub.kill()
    accepted = [r for r in caplog.records if r.getMessage() == "connection accepted"]
    assert sorted(getattr(r, "peer", "") for r in accepted) == [
        "127.0.0.2",
        "127.0.0.3",
        "127.0.0.4",
    ]  # fmt: skip: never HAProxy's own 127.0.0.1


def test_a_header_from_an_untrusted_address_and_a_trusted_peer_without_one_are_refused(
    fleet: tuple[ProxyServer, HAProxy], unique_topic: Callable[[str], str]
) -> None:
    proxy, lb = fleet
    topic = unique_topic("lb")
    before = refused(proxy, "proxy-header-untrusted"), refused(proxy, "proxy-header")
    spoofed = pub(lb.ports["spoof"], topic, "127.0.0.2")  # HAProxy from 127.0.0.5, header v2
    assert spoofed.returncode != 0
    bare = pub(lb.ports["none"], topic, "127.0.0.2")  # HAProxy from 127.0.0.1, no header
    assert bare.returncode != 0
    # At least once each: HAProxy retries a server that closes before taking its bytes
    # (retry-on conn-failure), and the proxy counts each refusal before it closes.
    assert refused(proxy, "proxy-header-untrusted") >= before[0] + 1
    assert refused(proxy, "proxy-header") >= before[1] + 1
    untrusted = refused(proxy, "proxy-header-untrusted")
    # A device straight on the proxy (no balancer, no header) is served as before ...
    direct = pub(proxy.port, topic, "127.0.0.2")
    assert direct.returncode == 0, direct.stderr
    # ... and may not say it is someone else.
    with socket.create_connection(
        ("127.0.0.1", proxy.port), 10, source_address=("127.0.0.2", 0)
    ) as raw:
        raw.sendall(b"PROXY TCP4 6.6.6.6 127.0.0.1 1 1883\r\n" + MQTT5_CONNECT)
        assert _connack(raw) == b""  # closed, no CONNACK
    assert refused(proxy, "proxy-header-untrusted") == untrusted + 1


def test_a_header_split_across_reads_is_read_and_a_stalled_or_huge_one_is_refused(
    fleet: tuple[ProxyServer, HAProxy],
) -> None:
    proxy, _ = fleet
    header = v2_header("198.51.100.7", 40000)
    with socket.create_connection(("127.0.0.1", proxy.port), 10) as raw:  # from 127.0.0.1
        for piece in (header[:5], header[5:17], header[17:], MQTT5_CONNECT):
            raw.sendall(piece)
            time.sleep(0.05)
        assert _connack(raw)[:1] == b"\x20"
        assert "198.51.100.7" in peers(proxy)
    before = refused(proxy, "proxy-header-timeout")
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", proxy.port), 10) as raw:
        raw.sendall(header[:20])  # then nothing: connect_timeout is 2 s
        assert _connack(raw) == b""
    assert 1.5 < time.monotonic() - start < 8
    assert refused(proxy, "proxy-header-timeout") == before + 1
    before = refused(proxy, "proxy-header")
    socket.create_connection(("127.0.0.1", proxy.port), 10).close()  # a health check: quiet
    with socket.create_connection(("127.0.0.1", proxy.port), 10) as raw:
        raw.sendall(b"PROXY TCP4 " + b"1" * 200)  # no end of line within 107 bytes
        assert _connack(raw) == b""
    assert refused(proxy, "proxy-header") == before + 1


def test_tls_listener_behind_haproxy_send_proxy_v2(
    pki: Path,  # noqa: F811
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
) -> None:
    """HAProxy passes TLS through; the proxy reads the header, then does the handshake."""
    proxy = start_proxy(
        broker, None, trusted_lbs="127.0.0.1", tls_cert_file=pki / "server.pem",
        tls_key_file=pki / "server.key",
    )  # fmt: skip
    lb = HAProxy({"tls": Route((proxy.port,), "send-proxy-v2")}).start()
    try:
        topic = unique_topic("lbtls")
        tls: list[Any] = ["--cafile", str(pki / "ca.pem")]
        sub = subprocess.Popen(
            ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(lb.ports["tls"]), *tls, "-A",
             "127.0.0.6", "-t", topic, "-C", "1", "-q", "1", "-V", "5", "-i", "lbtls-sub"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        wait_until(lambda: "Sending SUBACK to lbtls-sub" in broker.log(), "subscribed", 20)
        assert peers(proxy) == ["127.0.0.6"]
        delivered(sub, lb.ports["tls"], topic, "127.0.0.7", *tls)
    finally:
        lb.close()
        proxy.stop()


def silent(port: int, source: str, count: int) -> list[socket.socket]:
    """`count` connections from `source` that say nothing."""
    return [
        socket.create_connection(("127.0.0.1", port), 10, source_address=(source, 0))
        for _ in range(count)
    ]


def test_the_gate_keeps_each_address_to_its_share_and_room_for_the_balancer(
    broker: Mosquitto,
) -> None:
    """Silent connections at the PROXY-protocol gate. Before, the gate had only a total
    (max_connections): one address reopening silent sockets filled it, and every device,
    the balancer's too, was reset (490,312 `gate-full` refusals in 25 s). Now one address
    holds at most its share (an eighth: 2 of 16) and the next is closed at once, so a
    device at another address connects; and addresses that are not a trusted balancer
    together hold at most half the gate, so a device behind HAProxy (send-proxy-v2, from
    the trusted 127.0.0.1) logs in even when they fill it."""
    proxy = start_proxy(broker, None, trusted_lbs="127.0.0.1", max_connections=16)
    lb = HAProxy({"v2": Route((proxy.port,), "send-proxy-v2")}).start()
    held: list[socket.socket] = []
    try:
        held += silent(proxy.port, "127.0.50.1", 10)
        wait_until(lambda: refused(proxy, "gate-full-address") == 8, "8 closed at once", 10)
        device(proxy.port, "127.0.50.2").close()  # another address: its own share
        for i in range(3, 13):  # 10 more addresses, 2 each: together at most 8 of 16
            held += silent(proxy.port, f"127.0.50.{i}", 2)
        wait_until(lambda: refused(proxy, "gate-full") == 14, "the untrusted half full", 10)
        with socket.create_connection(
            ("127.0.0.1", proxy.port), 10, source_address=("127.0.50.13", 0)
        ) as late:
            assert _connack(late) == b""  # what is not the balancer's is full
        via_lb = device(lb.ports["v2"], "127.0.50.14")  # the balancer's room: served
        assert "127.0.50.14" in peers(proxy)
        via_lb.close()
    finally:
        for raw in held:
            raw.close()
        lb.close()
        proxy.stop()


def test_without_trusted_balancers_a_proxy_header_is_refused_as_the_mqtt_it_is_not(
    broker: Mosquitto,
) -> None:
    proxy = start_proxy(broker, None)  # OFFLOAD_PROXY_TRUSTED_LBS unset: no gate
    try:
        for header in (b"PROXY TCP4 6.6.6.6 127.0.0.1 1 1883\r\n", v2_header("6.6.6.6", 1)):
            with socket.create_connection(("127.0.0.1", proxy.port), 10) as raw:
                raw.sendall(header + MQTT5_CONNECT)
                assert _connack(raw) == b""
        assert peers(proxy) == []
    finally:
        proxy.stop()


def test_behind_haproxy_the_gateway_counts_and_logs_each_device_not_the_proxy(
    broker: Mosquitto,
    gateway_factory: Callable[..., GatewayServer],
    unique_topic: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Device -> HAProxy (`send-proxy-v2`) -> offload-proxy -> gateway: the gateway, which
    trusts the proxy's address (OFFLOAD_TRUSTED_PROXIES), keys its per-address cap on the
    device's address and names the device in its log. One upload per address: a device
    whose upload stalls holds its own address's only slot; a second connection from that
    address is refused (0x97, the gateway's 429), a device at another address is served.
    Through HAProxy and the proxy every upload would otherwise come from 127.0.0.1."""
    caplog.set_level(logging.INFO, logger="gateway")
    gateway = gateway_factory(broker, trusted_proxies="127.0.0.1", max_uploads_per_client=1)
    proxy = start_proxy(broker, gateway, trusted_lbs="127.0.0.1")
    lb = HAProxy({"v2": Route((proxy.port,), "send-proxy-v2")}).start()
    port = lb.ports["v2"]
    limits = _upload_limits(gateway)
    stalled = device(port, "127.0.0.2")
    try:
        stalled.sendall(publish_head(unique_topic("lbgw"), 2 * MiB) + bytes(MiB))  # then nothing
        wait_until(lambda: limits.active == {"127.0.0.2": 1}, "the gateway counts the device", 20)
        reasons = {}
        for source in ("127.0.0.2", "127.0.0.3"):
            sock = device(port, source)
            sock.sendall(publish_head(unique_topic("lbgw"), 300 * 1024, 7) + bytes(300 * 1024))
            first, body = _read(sock)
            assert (first, body[:2]) == (0x40, b"\x00\x07")  # its PUBACK
            reasons[source] = body[2]
            sock.close()
        # Refused at the device's own cap (429: 0x97); stored (no subscriber: 0x10).
        assert reasons == {"127.0.0.2": 0x97, "127.0.0.3": 0x10}
        assert proxy.metric("offload_proxy_offloaded_total") == 1
        refusals = [r.getMessage() for r in caplog.records if r.name == "gateway"]
        refusals = [m for m in refusals if m.startswith("refused")]
        assert refusals == ["refused 127.0.0.2: too many uploads from it under way (limit 1)"]
    finally:
        stalled.close()
        lb.close()
        proxy.stop()
