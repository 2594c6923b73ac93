"""offload-proxy decodes encrypted (age) and compressed (zstd) payloads for UNMODIFIED
subscribers when it holds a matching identity (proxy/_unseal.py): `client.Client` with
`encrypt_to` publishes straight on a 256 KiB mosquitto, plain `mosquitto_sub` receives
through the proxy. Real gateway and SeaweedFS."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_proxy import start_proxy, subscribed

from client.protocol._age_keys import Identity

from _gateway import GatewayServer
from _servers import Mosquitto, wait_until

pytestmark = pytest.mark.servers

MiB = 1024 * 1024


def _key(tmp_path: Path, name: str) -> tuple[Identity, Path]:
    identity = Identity.generate()
    path = tmp_path / name
    path.write_text(f"# public key: {identity.recipient}\n{identity}\n")
    return identity, path


def _sub(
    broker: Mosquitto, port: int, topic: str, count: int, *extra: str, version: str = "5"
) -> subprocess.Popen[bytes]:
    client_id = f"sub-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        ["mosquitto_sub", "-p", str(port), "-t", topic, "-C", str(count), "-V", version,
         "-q", "1", "-i", client_id, "-N", "-W", "120", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    wait_until(subscribed(broker, client_id), "mosquitto_sub subscribed", 20)
    return proc


def _output(proc: subprocess.Popen[bytes]) -> bytes:
    out, err = proc.communicate(timeout=150)
    assert proc.returncode == 0, err.decode()
    return out


def _compressible(size: int) -> bytes:
    """Hex text: zstd halves it, so it stays over the broker's limit (offloaded, compressed)."""
    return os.urandom(size // 2).hex().encode()


@pytest.mark.parametrize("version", ["5", "311"])
def test_encrypted_and_compressed_payloads_reach_mosquitto_sub_decoded(
    gateway: GatewayServer,
    broker: Mosquitto,
    clients: Callable[..., Any],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
    version: str,
) -> None:
    identity, key_file = _key(tmp_path, "proxy.key")
    proxy = start_proxy(broker, gateway, identity_files=[key_file])
    try:
        topic = unique_topic("sealed")
        sub = _sub(broker, proxy.port, topic, 3, version=version)
        recipients = {topic: [str(identity.recipient)]}
        sealed = clients(encrypt_to=recipients, compress=True, compress_encrypted=True)
        compressed, encrypted = _compressible(3 * MiB), os.urandom(2 * MiB + 3)
        sealed.publish(topic, compressed, qos=1)  # cmp + enc
        sealed.publish(topic, encrypted, qos=1)  # enc (random bytes do not compress)
        plain = clients(compress=True)
        only_compressed = _compressible(MiB)
        plain.publish(topic, only_compressed, qos=1)  # cmp: no key needed
        assert _output(sub) == compressed + encrypted + only_compressed  # byte-exact
        assert proxy.metric("offload_proxy_resolved_total") == 3
    finally:
        proxy.stop()


def test_without_a_matching_identity_the_client_gets_the_placeholder(
    gateway: GatewayServer,
    broker: Mosquitto,
    clients: Callable[..., Any],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    identity, _ = _key(tmp_path, "publisher.key")
    _, stranger = _key(tmp_path, "stranger.key")
    topic = unique_topic("sealed-other")
    pub = clients(encrypt_to={topic: [str(identity.recipient)]})
    for settings, why in (({"identity_files": [stranger]}, "no-identity"), ({}, "no-identity")):
        proxy = start_proxy(broker, gateway, **settings)
        try:
            sub = _sub(broker, proxy.port, topic, 1)
            pub.publish(topic, os.urandom(MiB), qos=1)
            placeholder = json.loads(_output(sub))  # small, never the ciphertext
            assert placeholder["enc"] == "age-v1" and placeholder["size"] > MiB
            assert proxy.metric("offload_proxy_placeholders_passed_total", why=why) == 1
            assert proxy.metric("offload_proxy_resolved_total") == 0
        finally:
            proxy.stop()


@pytest.mark.parametrize(
    ("settings", "extra", "why"),
    [
        ({"max_decoded_bytes": 2 * MiB}, (), "too-large"),  # a bomb stops at the bound
        ({}, ("-D", "connect", "maximum-packet-size", str(2 * MiB)), "client-limit"),
    ],
)
def test_a_payload_that_decodes_past_a_bound_gives_the_placeholder(
    gateway: GatewayServer,
    broker: Mosquitto,
    clients: Callable[..., Any],
    unique_topic: Callable[[str], str],
    settings: dict[str, Any],
    extra: tuple[str, ...],
    why: str,
    tmp_path: Path,
) -> None:
    # Its own spool directory: another test's proxy may spool in TMPDIR meanwhile.
    proxy = start_proxy(broker, gateway, spool_dir=tmp_path, **settings)
    try:
        topic = unique_topic("inflates")
        sub = _sub(broker, proxy.port, topic, 1, *extra)
        # Stored as ~1.6 MiB of zstd frames: under both bounds; decoded 3 MiB: over them.
        clients(compress=True).publish(topic, _compressible(3 * MiB), qos=1)
        placeholder = json.loads(_output(sub))
        assert placeholder["cmp"] == "zstd" and placeholder["size"] < 2 * MiB
        assert proxy.metric("offload_proxy_placeholders_passed_total", why=why) == 1
        assert list(tmp_path.iterdir()) == []  # what it spooled is gone
    finally:
        proxy.stop()


@pytest.mark.parametrize("version", ["5", "311"])
def test_sealed_chunked_messages_reach_mosquitto_sub_decoded(
    gateway: GatewayServer,
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
    version: str,
) -> None:
    from client import Client, Route

    identity, key_file = _key(tmp_path, "proxy.key")
    proxy = start_proxy(broker, gateway, identity_files=[key_file])
    try:
        topic = unique_topic("sealed-chunks")
        sub = _sub(broker, proxy.port, topic, 2, version=version)
        pub = Client(
            broker.url,
            automatic_offload=False,  # no gateway: ADR-23 chunks tagged _enc / _cmp
            discovery_wait=0,
            encrypt_to={topic: [str(identity.recipient)]},
            compress=True,
            compress_encrypted=True,
        )
        pub.connect()
        compressed, encrypted = _compressible(2 * MiB), os.urandom(MiB + 5)
        try:
            for payload in (compressed, encrypted):
                assert pub.publish(topic, payload, qos=1).route is Route.CHUNKED
        finally:
            pub.close()
        assert _output(sub) == compressed + encrypted  # decoded, whole, byte-exact
        assert proxy.metric("offload_proxy_reassembled_total") == 2
    finally:
        proxy.stop()


def test_a_sealed_chunked_message_no_identity_opens_is_dropped_and_the_next_arrives(
    gateway: GatewayServer,
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    from client import Client, Route

    identity, _ = _key(tmp_path, "publisher.key")
    proxy = start_proxy(broker, gateway)  # no identity_files
    try:
        topic = unique_topic("sealed-chunks-other")
        sub = _sub(broker, proxy.port, topic, 1)
        sealed = Client(
            broker.url,
            automatic_offload=False,
            discovery_wait=0,
            encrypt_to={topic: [str(identity.recipient)]},
        )
        plain = Client(broker.url, automatic_offload=False, discovery_wait=0)
        after = os.urandom(MiB)
        for client in (sealed, plain):
            client.connect()
        try:
            assert sealed.publish(topic, os.urandom(MiB), qos=1).route is Route.CHUNKED
            assert plain.publish(topic, after, qos=1).route is Route.CHUNKED
        finally:
            for client in (sealed, plain):
                client.close()
        assert _output(sub) == after  # never the ciphertext, in whole or in part
        assert proxy.metric("offload_proxy_chunk_failures_total", why="no-identity") == 1
    finally:
        proxy.stop()
