"""Client certificates (`cert_file`, `key_file`, `key_password`): mutual TLS against mosquitto
with `require_certificate true` and a gateway whose HTTPS asks for a certificate too; without
one, a single clear error at once (not a reconnect loop until the CONNACK timeout)."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from client import Client, ConfigError, ConnectionFailed, Message, Route

from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers

KEY_PASSWORD = "device-secret"


@pytest.fixture(scope="module")
def pki() -> Iterator[Path]:
    """A CA; a server certificate for 127.0.0.1; a device certificate whose key is encrypted
    with KEY_PASSWORD; and a device certificate from another CA (openssl, as an operator)."""
    path = Path(tempfile.mkdtemp(prefix="offload-mtls-"))
    path.chmod(0o755)  # mosquitto drops privileges before reading its key

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=path, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")
    for ca in ("ca", "rogue-ca"):
        run("req", "-x509", *ec, "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
            "-days", "2", "-subj", f"/CN=mqtt-offload {ca}")  # fmt: skip
    (path / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run(
        "req",
        *ec,
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    for device, ca in (("device", "ca"), ("rogue", "rogue-ca")):
        run("req", *ec, "-keyout", f"{device}.key", "-passout", f"pass:{KEY_PASSWORD}",
            "-out", f"{device}.csr", "-subj", f"/CN={device}-1")  # fmt: skip
        run("x509", "-req", "-in", f"{device}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{device}.pem", "-days", "2")  # fmt: skip
    for file in path.iterdir():
        file.chmod(0o644)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def mtls_broker(pki: Path, mosquitto_factory: Callable[..., Mosquitto]) -> Mosquitto:
    return mosquitto_factory(
        max_packet_size=262144,
        extra_config=f"cafile {pki / 'ca.pem'}\ncertfile {pki / 'server.pem'}\n"
        f"keyfile {pki / 'server.key'}\nrequire_certificate true\n",
    )


def _device(pki: Path, name: str = "device") -> dict[str, str]:
    return {
        "ca_file": str(pki / "ca.pem"),
        "cert_file": str(pki / f"{name}.pem"),
        "key_file": str(pki / f"{name}.key"),
        "key_password": KEY_PASSWORD,
    }


def test_offload_over_mutual_tls_on_both_hops(
    pki: Path, mtls_broker: Mosquitto, seaweed: SeaweedFS, bucket_name: str
) -> None:
    from gateway import Settings

    mqtts = f"mqtts://127.0.0.1:{mtls_broker.port}"
    gw = GatewayServer(
        Settings(
            storage_url=seaweed.storage_url(bucket_name),
            s3_access_key=seaweed.access_key,
            s3_secret_key=seaweed.secret_key,
            # The gateway's own link shows a device certificate too.
            mqtt_url=mqtts,
            mqtt_ca_file=pki / "ca.pem",
            mqtt_cert_file=pki / "device.pem",
            mqtt_key_file=pki / "device.key",
            mqtt_key_password=KEY_PASSWORD,
            tls=True,
            allow_anonymous=True,
        ),
        certfile=str(pki / "server.pem"),
        keyfile=str(pki / "server.key"),
        client_ca=str(pki / "ca.pem"),
    ).start()
    try:
        # HTTPS asks for a certificate: without one the gateway is out of reach.
        with pytest.raises(httpx.HTTPError):
            trust = ssl.create_default_context(cafile=str(pki / "ca.pem"))
            httpx.get(f"{gw.url}/healthz", verify=trust, timeout=10)
        payload = os.urandom(1024 * 1024)
        device = _device(pki)
        with Client(mqtts, **device) as consumer, Client(mqtts, **device) as producer:  # type: ignore[arg-type]
            assert producer.wait_for_endpoint(30) == gw.url  # the gateway's link is up
            consumer.subscribe("mtls/topic", qos=1)
            result = producer.publish("mtls/topic", payload, qos=1)
            assert result.route == Route.OFFLOADED
            got = consumer.next_message(timeout=30)
        assert isinstance(got, Message), got
        assert got.payload == payload
    finally:
        gw.stop()


def test_no_certificate_is_one_clear_error_at_once(pki: Path, mtls_broker: Mosquitto) -> None:
    client = Client(f"mqtts://127.0.0.1:{mtls_broker.port}", ca_file=str(pki / "ca.pem"))
    with pytest.raises(ConnectionFailed, match="requires a client certificate"):
        client.connect(timeout=60)  # the refusal ends the wait, not the timeout
    client.close()


def test_a_certificate_from_another_ca_is_refused_clearly(
    pki: Path, mtls_broker: Mosquitto
) -> None:
    client = Client(f"mqtts://127.0.0.1:{mtls_broker.port}", **_device(pki, "rogue"))  # type: ignore[arg-type]
    with pytest.raises(ConnectionFailed, match="refused the client certificate"):
        client.connect(timeout=60)
    client.close()


def test_a_wrong_key_password_or_a_key_alone_is_a_config_error(pki: Path) -> None:
    bad = {**_device(pki), "key_password": "wrong"}
    with pytest.raises(ConfigError, match=r"device\.key.*key_password"):
        Client("mqtts://127.0.0.1:8883", **bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="key_file needs cert_file"):
        Client("mqtts://127.0.0.1:8883", key_file=str(pki / "device.key"))
