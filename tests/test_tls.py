"""TLS on both hops: mqtts:// to mosquitto and https:// to the gateway, with a private CA."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from client import Client, Message, Route

from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers


@pytest.fixture(scope="module")
def pki() -> Iterator[Path]:
    """A CA and a certificate for 127.0.0.1 signed by it (openssl, as an operator would)."""
    path = Path(tempfile.mkdtemp(prefix="offload-pki-"))
    path.chmod(0o755)  # mosquitto drops privileges before reading its key

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=path, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=mqtt-offload test CA",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    (path / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    )
    for name in ("server.key", "server.pem", "ca.pem"):
        (path / name).chmod(0o644)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def https_gateway(
    pki: Path, seaweed: SeaweedFS, bucket_name: str, **settings: Any
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


def test_a_connection_refused_over_tls_is_dropped_whatever_the_peer_keeps_sending(
    pki: Path, seaweed: SeaweedFS, bucket_name: str
) -> None:
    """A head over MAX_HEAD_BYTES is answered 431 and closed; over TLS, `close()` alone
    waits for the peer's close_notify (the TLS shutdown timeout, 30 s) while it reads,
    decrypts and discards whatever the peer goes on sending. The gateway drops it
    CLOSE_GRACE after the answer instead."""
    gw = https_gateway(pki, seaweed, bucket_name)
    trust = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    try:
        raw = socket.create_connection(("127.0.0.1", gw.port))
        with trust.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-A: ")
            flood, started, dropped = b"a" * 65536, time.monotonic(), False
            while time.monotonic() - started < 12:
                try:
                    conn.sendall(flood)
                except OSError:  # reset or broken pipe: the gateway let go
                    dropped = True
                    break
            assert dropped, "still taken after 12 s"
            assert time.monotonic() - started < 6
        assert httpx.get(f"{gw.url}/healthz", verify=trust, timeout=10).status_code == 200
    finally:
        gw.stop()
