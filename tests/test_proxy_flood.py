"""One account floods, another's messages pass (issue 50, "Every account gets its turn"):
a real mosquitto, the proxy, and devices from distinct loopback addresses. What is asserted
is every message, not how long it took (timings: bench/proxy_flood.py)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from test_proxy import start_proxy
from test_proxy_fleet import connect_packet
from test_proxy_fleet_limits import ProxyProcess

from _servers import Mosquitto, wait_until
from _wire import packet, read_packet, text

pytestmark = pytest.mark.servers

FLOODERS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
FLOOD_SUB, VICTIM_PUB, VICTIM_SUB = "127.0.0.6", "127.0.0.7", "127.0.0.8"
#: QoS 0 PUBLISHes each flooder writes, as fast as its socket takes them.
FLOODED = 20_000
#: QoS 1 PUBLISHes of the victim, one each 5 ms while the flood goes on.
VICTIM = 200


class Device:
    """A raw MQTT 5 client from `source`, logged in as `user` (its account)."""

    def __init__(self, port: int, source: str, user: str, client_id: str = "") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.bind((source, 0))
        self.sock.connect(("127.0.0.1", port))
        self._buf = bytearray()
        client_id = client_id or f"f-{uuid.uuid4().hex[:10]}"
        self.sock.sendall(connect_packet(client_id, user=user))
        first, body = self.read()
        assert first == 0x20 and body[1] == 0, f"CONNACK {body.hex()}"

    def read(self) -> tuple[int, bytes]:
        """The next whole packet (first byte, body)."""
        return read_packet(self.sock, self._buf, 1 << 20)

    def subscribe(self, topic: str, qos: int) -> None:
        self.sock.sendall(packet(0x82, b"\x00\x01\x00" + text(topic) + bytes([qos])))
        first, body = self.read()
        assert first == 0x90 and body[-1] == qos, body.hex()


def publish(topic: str, payload: bytes, packet_id: int = 0) -> bytes:
    ident = packet_id.to_bytes(2, "big") if packet_id else b""
    return packet(0x32 if packet_id else 0x30, text(topic) + ident + b"\x00" + payload)


def payload_of(body: bytes, qos: int) -> bytes:
    at = 2 + int.from_bytes(body[:2], "big") + (2 if qos else 0)
    return body[at + 1 + body[at] :]  # after a property block of under 128 bytes


def test_a_flood_beside_a_victim_loses_nothing_and_the_victim_passes_in_order(
    mosquitto_factory: Callable[..., Mosquitto], unique_topic: Callable[[str], str]
) -> None:
    """Account A floods 80,000 QoS 0 PUBLISHes from 4 addresses, to a subscriber of its own;
    meanwhile account B publishes 200 QoS 1 messages to its subscriber. B's subscriber gets
    all 200, in order, each once, and B's publisher a PUBACK (success) for each; A's
    subscriber gets every one of A's 80,000, in each flooder's order. A's connections take
    one turn of the proxy's loop between them (the flood waited for it), B's another."""
    broker = mosquitto_factory(max_packet_size=262144, extra_config="max_queued_messages 0")
    proxy = start_proxy(broker, None)
    flood_topic, victim_topic = unique_topic("flood"), unique_topic("victim")
    try:
        sink = Device(proxy.port, FLOOD_SUB, "account-a")
        sink.subscribe(f"{flood_topic}/#", 0)
        b_sub = Device(proxy.port, VICTIM_SUB, "account-b")
        b_sub.subscribe(victim_topic, 1)
        b_pub = Device(proxy.port, VICTIM_PUB, "account-b")
        flooders = [Device(proxy.port, a, "account-a") for a in FLOODERS]
        got: dict[str, list[int]] = {}
        victim_got: list[int] = []
        acks: list[tuple[int, bytes]] = []

        def drain() -> None:
            while sum(map(len, got.values())) < FLOODED * len(FLOODERS):
                _, body = sink.read()
                topic = body[2 : 2 + int.from_bytes(body[:2], "big")].decode()
                got.setdefault(topic, []).append(int.from_bytes(payload_of(body, 0)[:4], "big"))

        def victim_sub() -> None:
            while len(victim_got) < VICTIM:
                first, body = b_sub.read()
                assert first >> 4 == 3 and (first >> 1) & 3 == 1, hex(first)
                victim_got.append(int.from_bytes(payload_of(body, 1)[:4], "big"))
                at = 2 + int.from_bytes(body[:2], "big")
                b_sub.sock.sendall(b"\x40\x02" + body[at : at + 2])

        def victim_acks() -> None:
            while len(acks) < VICTIM:
                first, body = b_pub.read()
                acks.append((first, body))

        def flood(i: int) -> None:
            topic = f"{flood_topic}/{i}"
            flooders[i].sock.sendall(
                b"".join(publish(topic, n.to_bytes(4, "big") + bytes(28)) for n in range(FLOODED))
            )

        readers = [
            threading.Thread(target=f, daemon=True) for f in (drain, victim_sub, victim_acks)
        ]
        writers = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(4)]
        for t in readers + writers:
            t.start()
        for n in range(VICTIM):
            b_pub.sock.sendall(publish(victim_topic, n.to_bytes(4, "big") + bytes(60), n + 1))
            time.sleep(0.005)
        for t in readers + writers:
            t.join(120)
            assert not t.is_alive()
        assert victim_got == list(range(VICTIM))
        assert acks == [(0x40, (n + 1).to_bytes(2, "big")) for n in range(VICTIM)]
        assert got == {f"{flood_topic}/{i}": list(range(FLOODED)) for i in range(4)}
        assert proxy.metric("offload_proxy_turns_waited_total") > 0  # the flood took turns

        def turns() -> dict[str, set[int]]:
            by: dict[str, set[int]] = {}
            for session in proxy.proxy._sessions.values():
                conn = session.conn
                assert conn.client.turn is conn.broker.turn
                by.setdefault(str(conn.account), set()).add(id(conn.client.turn))
            return by

        by_account = proxy.call(turns)
        assert {k: len(v) for k, v in by_account.items()} == {"account-a": 1, "account-b": 1}
        assert by_account["account-a"] != by_account["account-b"]
        for device in (sink, b_sub, b_pub, *flooders):
            device.sock.close()
        wait_until(lambda: proxy.metric("offload_proxy_connections") == 0, "all gone", 10)
    finally:
        proxy.stop()


def test_a_session_taken_over_while_its_device_floods_ends_with_an_info_line(
    broker: Mosquitto, unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    """A device floods QoS 0 PUBLISHes through the proxy (its own process, uvloop) and
    another connects with its client id: mosquitto ends the first session (a session
    takeover) while the proxy is writing the flood to it. Each time the proxy ends that
    connection with one INFO line; before, the relay's next write to the closed broker
    link raised uvloop's RuntimeError, an ERROR traceback ("connection failed", 16 of 20
    takeovers)."""
    log = tmp_path / "proxy.log"
    proxy = ProxyProcess(broker, "http://127.0.0.1:9", log)
    flood = publish(unique_topic("takeover"), bytes(32)) * 2000
    try:
        for i in range(10):
            client_id = f"same-{i}-{uuid.uuid4().hex[:6]}"
            first = Device(proxy.port, "127.0.0.2", "account-a", client_id)
            stop = threading.Event()

            def send(sock: socket.socket = first.sock, stop: threading.Event = stop) -> None:
                with contextlib.suppress(OSError):
                    while not stop.is_set():
                        sock.sendall(flood)

            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            time.sleep(0.1)
            second = Device(proxy.port, "127.0.0.3", "account-a", client_id)  # takes over
            time.sleep(0.1)
            stop.set()
            first.sock.close()
            sender.join(10)
            second.sock.close()

        def logged() -> list[dict[str, object]]:
            return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]

        wait_until(lambda: len(logged()) >= 10, "each takeover logged", 10)
        time.sleep(0.5)  # (any ERROR after them)
        lines = logged()
        assert [x for x in lines if x["level"] in ("ERROR", "CRITICAL")] == []
        assert sum(1 for x in lines if x["message"] == "connection ended") >= 10
    finally:
        proxy.stop()
