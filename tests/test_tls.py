"""TLS on both hops: mqtts:// to mosquitto and https:// to the gateway, with a private CA."""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from client import Client, Message, Route

from _gateway import GatewayServer
from _pki import server_pki
from _servers import Mosquitto, SeaweedFS, wait_until

pytestmark = pytest.mark.servers


@pytest.fixture(scope="module")
def pki() -> Iterator[Path]:
    """A CA and a certificate for 127.0.0.1 signed by it (openssl, as an operator would)."""
    with server_pki() as path:
        yield path


def https_gateway(
    pki: Path, seaweed: SeaweedFS, bucket_name: str, send_buffer: int = 0, **settings: Any
) -> GatewayServer:
    """A gateway on https:// with the test CA's certificate, started."""
    from gateway import Settings

    return GatewayServer(
        Settings(
            storage_url=seaweed.storage_url(bucket_name),
            s3_access_key=seaweed.access_key,
            s3_secret_key=seaweed.secret_key,
            tls=True,
            allow_anonymous=True,
            **settings,
        ),
        certfile=str(pki / "server.pem"),
        keyfile=str(pki / "server.key"),
        send_buffer=send_buffer,
    ).start()


def test_offload_over_mqtts_and_https(
    pki: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    seaweed: SeaweedFS,
    bucket_name: str,
) -> None:

    broker = mosquitto_factory(
        max_packet_size=262144,
        extra_config=f"cafile {pki / 'ca.pem'}\ncertfile {pki / 'server.pem'}\n"
        f"keyfile {pki / 'server.key'}\n",
    )
    mqtts = f"mqtts://127.0.0.1:{broker.port}"
    gw = https_gateway(
        pki,
        seaweed,
        bucket_name,
        mqtt_url=mqtts,
        mqtt_ca_file=pki / "ca.pem",
        discovery_interval=5.0,
    )
    try:
        assert gw.url.startswith("https://")
        # The gateway reached the TLS broker with the private CA.
        trust = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        # The broker link comes up in the background after the port opens: poll for it.
        deadline = time.monotonic() + 20
        while True:
            ready = httpx.get(f"{gw.url}/readyz", verify=trust, timeout=10)
            if ready.json()["checks"]["broker"] == "ok" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert ready.json()["checks"]["broker"] == "ok"
        # Without the CA the certificate is refused.
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{gw.url}/healthz", timeout=10)
        payload = os.urandom(1024 * 1024)
        ca = str(pki / "ca.pem")
        with Client(mqtts, ca_file=ca) as consumer, Client(mqtts, ca_file=ca) as producer:
            consumer.subscribe("secure/topic", qos=1)
            result = producer.publish("secure/topic", payload, qos=1)
            assert result.route == Route.OFFLOADED
            assert result.url is not None and result.url.startswith("https://")
            got = consumer.next_message(timeout=30)
        assert isinstance(got, Message), got
        assert got.payload == payload
    finally:
        gw.stop()


def _status(conn: ssl.SSLSocket) -> bytes:
    """The status line of the answer coming in on `conn`."""
    got = b""
    while b"\r\n" not in got:
        piece = conn.recv(4096)
        assert piece, f"closed before an answer: {got!r}"
        got += piece
    return got.partition(b"\r\n")[0]


def _flood_until_dropped(
    conn: ssl.SSLSocket, seconds: float, size: int = 65536, pause: float = 0.0
) -> float | None:
    """Send records of `size` bytes, `pause` seconds apart, until the peer lets go; how
    long that took, or None."""
    flood, started = b"a" * size, time.monotonic()
    while time.monotonic() - started < seconds:
        try:
            conn.sendall(flood)
        except OSError:  # reset or broken pipe: the gateway let go
            return time.monotonic() - started
        time.sleep(pause)
    return None


@pytest.mark.parametrize(
    ("request_head", "status"),
    [
        # A header value without end: over MAX_HEAD_BYTES, the protocol's 431.
        (b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-A: " + b"a" * 131072, b"431"),
        # A body over the upload limit: the middleware's 413, Connection: close.
        (
            b"PUT /msg/5f0c1b9e-4f4e-4b8e-9a57-6d9b0c3a2e11?topic=t HTTP/1.1\r\n"
            b"Host: gw\r\nContent-Length: 10000000000000\r\n\r\n",
            b"413",
        ),
        # Not HTTP: uvicorn's own 400.
        (b"\x00\x01 nonsense\r\n\r\n", b"400"),
    ],
    ids=["431-endless-header", "413-body-limit", "400-not-http"],
)
def test_a_connection_refused_over_tls_is_dropped_whatever_the_peer_keeps_sending(
    pki: Path, seaweed: SeaweedFS, bucket_name: str, request_head: bytes, status: bytes
) -> None:
    """Whoever refuses a request and closes (the head protocol, the body limits, uvicorn),
    over TLS `close()` alone waits for the peer's close_notify (the TLS shutdown timeout,
    30 s) while it reads, decrypts and discards whatever the peer goes on sending (11.8 GB
    in 12 s after a 413). The gateway drops a peer that has its answer and sends on within
    two CLOSE_GRACE periods."""
    gw = https_gateway(pki, seaweed, bucket_name)
    trust = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    try:
        raw = socket.create_connection(("127.0.0.1", gw.port), timeout=20)
        with trust.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            conn.sendall(request_head)
            assert _status(conn).startswith(b"HTTP/1.1 " + status)
            dropped = _flood_until_dropped(conn, 12)
            assert dropped is not None, "still taken after 12 s"
            assert dropped < 6
        assert httpx.get(f"{gw.url}/healthz", verify=trust, timeout=10).status_code == 200
    finally:
        gw.stop()


def _server_side_state(port: int, client_port: int) -> str | None:
    """The TCP state of the gateway's end of the connection from `client_port`."""
    for conn in psutil.net_connections(kind="tcp4"):
        if conn.laddr and conn.laddr.port == port and conn.raddr and conn.raddr.port == client_port:
            return str(conn.status)
    return None


def test_a_slow_reader_gets_all_of_an_answer_that_closes_its_connection(
    pki: Path, seaweed: SeaweedFS, bucket_name: str
) -> None:
    """`Connection: close` over TLS: uvicorn closes once the last piece is written, with
    over a megabyte still on its way to a client taking 800 kB/s (16 KiB records, 20 ms
    apart). The gateway keeps the connection while the client takes it all (a drop a fixed
    time after the close would cut the answer short). A client that stops taking it before
    the end is let go after the send idle timeout (5 s here; over TLS `close()` alone
    would hold the connection for the TLS shutdown timeout, 30 s), and one that sends on,
    a little while taking nothing or a lot while it takes a little to keep the connection,
    within two CLOSE_GRACE periods."""
    gw = https_gateway(pki, seaweed, bucket_name, send_buffer=262144, send_idle_timeout=5.0)
    trust = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    payload, msg_id = os.urandom(4 << 20), uuid.uuid4()
    request = f"GET /msg/{msg_id}/payload HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"
    most = len(payload) - (128 << 10)  # by then the whole answer is written and closed

    def read(conn: ssl.SSLSocket, until: int, pause: float) -> bytes:
        got = bytearray()
        while len(got) < until and (piece := conn.recv(65536)):
            got += piece
            time.sleep(pause)
        return bytes(got)

    def connect() -> ssl.SSLSocket:
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)  # no autotuning
        raw.settimeout(20)
        raw.connect(("127.0.0.1", gw.port))
        conn = trust.wrap_socket(raw, server_hostname="127.0.0.1")
        conn.sendall(request.encode())
        return conn

    def let_go_after(conn: ssl.SSLSocket, flood: bool) -> float:
        """Seconds from the client's last read until the gateway lets go of its end."""
        client_port = conn.getsockname()[1]
        assert len(read(conn, most, 0)) >= most
        stopped = time.monotonic()
        assert _server_side_state(gw.port, client_port) == "ESTABLISHED"
        if flood:  # 160 kB/s: under FLOOD_BYTES a second, but nothing of the answer taken
            dropped = _flood_until_dropped(conn, 20, 16384, 0.1)
            assert dropped is not None, "still taken after 20 s"
        wait_until(
            lambda: _server_side_state(gw.port, client_port) != "ESTABLISHED",
            "the gateway letting go of a client that stopped reading",
            30,
        )
        return time.monotonic() - stopped

    try:
        with httpx.Client(base_url=gw.url, verify=trust, timeout=60) as http:
            put = http.put(f"/msg/{msg_id}", params={"topic": "tls/slow"}, content=payload)
            assert put.status_code == 201, put.text
        with connect() as conn:
            head, _, body = read(conn, len(payload) + 4096, 0.02).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert hashlib.sha256(body).digest() == hashlib.sha256(payload).digest(), len(body)
        with connect() as conn:
            quiet = let_go_after(conn, flood=False)
        assert 4 < quiet < 9, quiet
        with connect() as conn:
            flooding = let_go_after(conn, flood=True)
        assert flooding < 3.5, flooding
        # Taking 1 KiB of the answer every 20 ms (8 s for the last 384 KiB) keeps it
        # taking, but sending 64 KiB each time is a flood all the same.
        with connect() as conn:
            assert len(read(conn, len(payload) - (384 << 10), 0)) > 0
            started, dropped = time.monotonic(), False
            while not dropped and time.monotonic() - started < 20:
                try:
                    dropped = not conn.recv(1024)
                    conn.sendall(b"a" * 65536)
                    time.sleep(0.02)
                except OSError:
                    dropped = True
            assert dropped and time.monotonic() - started < 3.5, time.monotonic() - started
    finally:
        gw.stop()
