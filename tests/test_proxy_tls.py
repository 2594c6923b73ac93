"""offload-proxy over TLS on both sides: clients connect with TLS (the proxy's certificate),
the proxy reaches an mqtts:// mosquitto with a private CA; 5 MiB from mosquitto_pub to
mosquitto_sub, both through the proxy, byte-exact."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from test_proxy import MiB, MosquittoSub, start_proxy  # noqa: F401
from test_tls import pki  # noqa: F401 - the fixture

from _gateway import GatewayServer
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers


def test_tls_to_the_proxy_and_from_it_to_an_mqtts_broker(
    pki: Path,  # noqa: F811
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
    unique_topic: Callable[[str], str],
) -> None:
    broker = mosquitto_factory(
        max_packet_size=262144,
        extra_config=f"cafile {pki / 'ca.pem'}\ncertfile {pki / 'server.pem'}\n"
        f"keyfile {pki / 'server.key'}\n",
    )
    plain = mosquitto_factory(max_packet_size=262144)  # the gateway's own link (not tested here)
    gw = gateway_factory(plain)
    server = start_proxy(
        broker, gw, broker=f"mqtts://127.0.0.1:{broker.port}", broker_ca_file=pki / "ca.pem",
        tls_cert_file=pki / "server.pem", tls_key_file=pki / "server.key",
    )  # fmt: skip
    try:
        topic = unique_topic("tls")
        tls = ["-p", str(server.port), "-h", "127.0.0.1", "--cafile", str(pki / "ca.pem")]
        ident = "tls-sub"
        sub = subprocess.Popen(
            ["mosquitto_sub", *tls, "-t", topic, "-C", "1", "-q", "1", "-V", "5", "-N",
             "-i", ident], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        wait_until(lambda: f"Sending SUBACK to {ident}" in broker.log(), "subscribed", 20)
        data = os.urandom(5 * MiB)
        pub = subprocess.run(
            ["mosquitto_pub", *tls, "-t", topic, "-q", "1", "-V", "5", "-s"],
            input=data, capture_output=True, timeout=120,
        )  # fmt: skip
        assert pub.returncode == 0, pub.stderr
        out, err = sub.communicate(timeout=120)
        assert sub.returncode == 0, err
        assert hashlib.sha256(out).digest() == hashlib.sha256(data).digest()
        refused = subprocess.run(  # plain MQTT to the TLS listener: no CONNACK, an error
            ["mosquitto_pub", "-p", str(server.port), "-h", "127.0.0.1", "-t", topic, "-m", "x"],
            capture_output=True, timeout=60,
        )  # fmt: skip
        assert refused.returncode != 0
    finally:
        server.stop()
