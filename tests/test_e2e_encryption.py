"""End-to-end encryption and compression on real servers (mosquitto, SeaweedFS, the gateway).

The store and the gateway see only ciphertext: a marker string in the plaintext is found in
no stored object and no gateway log line. Stored objects are age files that Debian's `age`
and `pyrage` decrypt; an object `age` wrote, behind our placeholder, is read by Client.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pyrage
import pytest
from minio import Minio

from client import (
    BrokerUrl,
    Client,
    ConfigError,
    DecompressionBomb,
    DecryptionFailed,
    Message,
    MessageError,
    NoMatchingIdentity,
    PayloadChecksumMismatch,
    Route,
)
from client.mqtt._paho import Incoming, MqttConnection
from client.protocol import MessageId, Placeholder
from client.protocol._age_keys import Identity
from client.protocol._encoding import Encoding
from client.protocol._zstd import compress

from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
MARKER = b"PLAINTEXT-MARKER-7f3a9c"


def _next(client: Client, timeout: float = 30.0) -> Message | MessageError:
    item = client.next_message(timeout)
    assert item is not None, "nothing delivered in time"
    return item


def _key(tmp_path: Path, name: str) -> tuple[Identity, Path]:
    identity = Identity.generate()
    path = tmp_path / name
    path.write_text(f"# public key: {identity.recipient}\n{identity}\n")
    return identity, path


def _stored(gateway: GatewayServer, result_url: str) -> bytes:
    return httpx.get(result_url.rstrip("/") + "/payload", timeout=30).content


def _all_objects(seaweed: SeaweedFS, bucket: str) -> list[bytes]:
    s3 = Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)
    out = []
    for obj in s3.list_objects(bucket, recursive=True):
        response = s3.get_object(bucket, obj.object_name)
        try:
            out.append(response.read())
        finally:
            response.close()
            response.release_conn()
    return out


def test_two_recipients_a_rotated_key_and_no_plaintext_in_store_or_logs(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    seaweed: SeaweedFS,
    bucket_name: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    topic = unique_topic("enc")
    old, old_file = _key(tmp_path, "old.key")
    new, new_file = _key(tmp_path, "new.key")
    other, other_file = _key(tmp_path, "other.key")
    payload = os.urandom(300 * 1024) + MARKER + b"{" * 200_000 + MARKER  # compressible too
    # Readers: one with only the old key, one with only the new, one with both, a stranger.
    readers = {
        "old": clients(identity_files=(str(old_file),)),
        "new": clients(identity_files=(str(new_file),)),
        "both": clients(identity_files=(str(new_file), str(old_file))),
        "stranger": clients(identity_files=(str(other_file),)),
    }
    for reader in readers.values():
        reader.subscribe(topic)
    # During the change-over the publisher encrypts to the old and the new key...
    pub = clients(encrypt_to={topic: [str(old.recipient), str(new.recipient)]})
    small = pub.publish(topic, b"tiny " + MARKER, qos=1)  # fits the broker: offloaded anyway
    assert small.route is Route.OFFLOADED
    during = pub.publish(topic, payload, qos=1)
    assert during.sha256 == hashlib.sha256(payload).hexdigest()
    # ...after it, to the new key only; messages from before stay readable with the old.
    after_pub = clients(encrypt_to=f"{topic}={new.recipient}")
    assert after_pub.publish(topic, payload, qos=1).route is Route.OFFLOADED

    for name, reader in readers.items():
        got = [_next(reader) for _ in range(3)]
        if name == "stranger":
            for item in got:
                assert isinstance(item, MessageError), item
                assert isinstance(item.error, NoMatchingIdentity)
                assert old.recipient.key_id in str(item.error) or new.recipient.key_id in str(
                    item.error
                )
                assert other.recipient.key_id in str(item.error)
            continue
        first, second, third = got
        assert isinstance(first, Message) and first.payload == b"tiny " + MARKER, (name, first)
        assert isinstance(second, Message) and second.payload == payload, (name, second)
        assert second.sha256 == during.sha256
        if name == "old":
            assert isinstance(third, MessageError), third
            assert isinstance(third.error, NoMatchingIdentity)
            assert third.error.key_ids == (new.recipient.key_id,)
        else:
            assert isinstance(third, Message) and third.payload == payload, (name, third)

    # The stored bytes: age files, not compressed (an encrypted topic), read by age and pyrage.
    stored = _stored(gateway, during.url or "")
    assert stored.startswith(b"age-encryption.org/v1\n")
    assert len(stored) > len(payload)
    assert pyrage.decrypt(stored, [pyrage.x25519.Identity.from_str(str(new))]) == payload
    if shutil.which("age"):
        out = subprocess.run(
            ["age", "-d", "-i", str(old_file)], input=stored, capture_output=True, check=True
        )
        assert out.stdout == payload
    # Nothing in the store or the gateway's logs holds the marker.
    objects = _all_objects(seaweed, bucket_name)
    assert len(objects) >= 3
    assert not [o for o in objects if MARKER in o]
    assert MARKER.decode() not in caplog.text
    assert not any(MARKER.decode() in str(r.args) for r in caplog.records)


def test_the_placeholder_describes_the_stored_bytes(
    gateway: GatewayServer, clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("ph")
    identity = Identity.generate()
    raw = clients(fetch_external=False)
    raw.subscribe(topic)
    pub = clients(encrypt_to={topic: [str(identity.recipient)]})
    result = pub.publish(topic, b"x" * 5000, qos=1)
    placeholder = _next(raw)
    assert isinstance(placeholder, Message)
    doc = json.loads(placeholder.payload)
    stored = _stored(gateway, result.url or "")
    assert doc["size"] == len(stored)
    assert doc["sha256"] == hashlib.sha256(stored).hexdigest() != result.sha256
    assert doc["enc"] == "age-v1" and doc["kid"] == [identity.recipient.key_id]
    assert "cmp" not in doc  # encrypted: not compressed by default


def test_an_object_written_by_age_is_read_behind_our_placeholder(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    if shutil.which("age") is None:
        pytest.skip("Debian's age is not installed")
    topic = unique_topic("agecli")
    identity, key_file = _key(tmp_path, "k")
    payload = os.urandom(200 * 1024)
    sealed = subprocess.run(
        ["age", "-r", str(identity.recipient)], input=payload, capture_output=True, check=True
    ).stdout
    mid = MessageId.new()
    put = httpx.put(f"{gateway.url}/msg/{mid}", content=sealed, params={"topic": topic})
    assert put.status_code in (200, 201), put.text
    sub = clients(identity_files=(str(key_file),))
    sub.subscribe(topic)
    ref = Placeholder(
        f"{gateway.url}/msg/{mid}",
        len(sealed),
        hashlib.sha256(sealed).hexdigest(),
        mid,
        Encoding(encrypted=True),
    )
    body, props = ref.encode(None)
    clients().connection.publish(topic, body, qos=1, properties=props).result(10)
    msg = _next(sub)
    assert isinstance(msg, Message), msg
    assert msg.payload == payload


def _hostile(
    gateway: GatewayServer, clients: Callable[..., Client], topic: str, stored: bytes, enc: Encoding
) -> Message | MessageError:
    mid = MessageId.new()
    put = httpx.put(f"{gateway.url}/msg/{mid}", content=stored, params={"topic": topic})
    assert put.status_code in (200, 201), put.text
    ref = Placeholder(
        f"{gateway.url}/msg/{mid}", len(stored), hashlib.sha256(stored).hexdigest(), mid, enc
    )
    body, props = ref.encode(None)
    clients().connection.publish(topic, body, qos=1, properties=props).result(10)
    return ref  # type: ignore[return-value]


def test_hostile_objects_are_message_errors_and_the_next_message_arrives(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = unique_topic("hostile")
    identity, key_file = _key(tmp_path, "k")
    sub = clients(identity_files=(str(key_file),), max_fetch_bytes=8 * MiB)
    sub.subscribe(topic)
    from client.protocol._age import encrypt

    good = encrypt(b"fine", [identity.recipient])
    truncated = encrypt(os.urandom(200_000), [identity.recipient])[:-100]
    tampered = bytearray(encrypt(os.urandom(1000), [identity.recipient]))
    tampered[-20] ^= 1
    bomb = encrypt(compress(bytes(64 * MiB)), [identity.recipient])
    cases = [
        (b"not an age file at all", Encoding(encrypted=True), DecryptionFailed),
        (truncated, Encoding(encrypted=True), DecryptionFailed),
        (bytes(tampered), Encoding(encrypted=True), DecryptionFailed),
        (bomb, Encoding(compressed=True, encrypted=True), DecompressionBomb),
        (compress(bytes(64 * MiB)), Encoding(compressed=True), DecompressionBomb),
        (b"age-encryption.org/v1\n-> X25519 \n--- x\n", Encoding(encrypted=True), DecryptionFailed),
    ]
    for stored, enc, _ in cases:
        _hostile(gateway, clients, topic, stored, enc)
    _hostile(gateway, clients, topic, good, Encoding(encrypted=True))
    for _, _, error in cases:
        item = _next(sub)
        assert isinstance(item, MessageError), item
        assert isinstance(item.error, error), item.error
    last = _next(sub)
    assert isinstance(last, Message) and last.payload == b"fine"


def test_a_decrypted_fetch_keeps_no_stored_copy_and_spools_by_plaintext_size(
    clients: Callable[..., Client], unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    """The stored bytes of an encrypted payload are only hashed and decrypted as they
    arrive, never kept (no spool file for them), and the plaintext is held in memory up to
    `spool_threshold` of its own size: a payload of exactly the threshold, whose stored
    bytes are larger, used to be spooled twice (bench/RESULTS.md, issue 30). Sizes span
    several turns of the fetch's ring of buffers, on the hashing thread."""
    topic = unique_topic("ring")
    identity, key_file = _key(tmp_path, "k")
    spool = tmp_path / "spool"
    spool.mkdir()
    threshold = 9 * MiB
    seen: list[list[str]] = []
    sub = clients(
        identity_files=(str(key_file),),
        spool_threshold=threshold,
        spool_dir=str(spool),
        # Called as the bytes arrive: what the spool directory holds meanwhile.
        on_fetch_progress=lambda *_: seen.append(sorted(p.name for p in spool.iterdir())),
    )
    sub.subscribe(topic, qos=1)
    pub = clients(encrypt_to={topic: [str(identity.recipient)]})
    exact, over = os.urandom(threshold), os.urandom(threshold + 1)
    pub.publish(topic, exact, qos=1)
    msg = _next(sub)
    assert isinstance(msg, Message), msg
    assert msg.body.path is None and msg.payload == exact
    assert msg.sha256 == hashlib.sha256(exact).hexdigest()
    assert seen and all(names == [] for names in seen)
    pub.publish(topic, over, qos=1)
    big = _next(sub)
    assert isinstance(big, Message), big
    assert big.body.path is not None and big.body.path.parent == spool
    assert big.payload == over and big.sha256 == hashlib.sha256(over).hexdigest()
    assert [p.name for p in spool.iterdir()] == [big.body.path.name]  # the plaintext only
    big.body.discard()


def test_a_decrypted_fetch_still_refuses_stored_bytes_of_another_digest(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """Not keeping the stored bytes changes nothing in their check: an age file that
    decrypts fine but is not the one the placeholder names is a MessageError."""
    from client.protocol._age import encrypt

    topic = unique_topic("subst")
    identity, key_file = _key(tmp_path, "k")
    sub = clients(identity_files=(str(key_file),))
    sub.subscribe(topic, qos=1)
    sealed = encrypt(os.urandom(7 * MiB), [identity.recipient])
    mid = MessageId.new()
    put = httpx.put(f"{gateway.url}/msg/{mid}", content=sealed, params={"topic": topic})
    assert put.status_code in (200, 201), put.text
    other = hashlib.sha256(b"another age file").hexdigest()
    ref = Placeholder(f"{gateway.url}/msg/{mid}", len(sealed), other, mid, Encoding(encrypted=True))
    body, props = ref.encode(None)
    clients().connection.publish(topic, body, qos=1, properties=props).result(10)
    item = _next(sub)
    assert isinstance(item, MessageError) and isinstance(item.error, PayloadChecksumMismatch), item


def test_compression_pays_on_json_and_is_skipped_on_random_bytes(
    gateway: GatewayServer, clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("zstd")
    sub = clients()
    sub.subscribe(topic + "/#")
    pub = clients(offload_threshold=1000, compress=True)  # off by default
    telemetry = json.dumps([{"sensor": i % 9, "t": i, "v": i / 3} for i in range(40000)]).encode()
    noise = os.urandom(len(telemetry))
    r1 = pub.publish(topic + "/json", telemetry, qos=1)
    r2 = pub.publish(topic + "/noise", noise, qos=1)
    plain = clients(offload_threshold=1000, compress=True, no_compress=(topic + "/json",))
    r3 = plain.publish(topic + "/json", telemetry, qos=1)
    assert len(_stored(gateway, r1.url or "")) * 4 < len(telemetry)
    assert _stored(gateway, r2.url or "") == noise  # a sample that does not shrink: as is
    assert _stored(gateway, r3.url or "") == telemetry  # off per topic filter
    for expected in (telemetry, noise, telemetry):
        msg = _next(sub)
        assert isinstance(msg, Message) and msg.payload == expected
        assert msg.sha256 == hashlib.sha256(expected).hexdigest()


def test_an_encrypted_topic_never_leaves_as_plaintext_without_an_endpoint(
    clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("noep")
    identity = Identity.generate()
    pub = clients(
        encrypt_to={topic: [str(identity.recipient)]},
        automatic_offload=False,
        chunking=False,
        discovery_wait=0.5,
    )
    with pytest.raises(ConfigError, match="encrypt_to"):
        pub.publish(topic, b"secret", qos=1)


def test_without_an_endpoint_an_encrypted_payload_crosses_as_chunks_of_ciphertext(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """The ADR-23 fallback carries the age file, tagged `_enc`; the reader decrypts it."""
    broker = mosquitto_factory(max_packet_size=65536)
    topic = unique_topic("encchunks")
    identity, key_file = _key(tmp_path, "k")
    payload = (MARKER + os.urandom(500)) * 600  # ~300 KiB: several chunks
    seen: list[Incoming] = []
    raw = MqttConnection(BrokerUrl.parse(broker.url), on_message=seen.append)
    raw.connect()
    made = [
        Client(broker.url, identity_files=(str(key_file),), discovery_wait=0.2),
        Client(broker.url, encrypt_to={topic: [str(identity.recipient)]}, discovery_wait=0.2),
    ]
    sub, pub = made
    try:
        raw.subscribe(topic, 1).result(10)
        for c in made:
            c.connect()
        sub.subscribe(topic)
        result = pub.publish(topic, payload, qos=1)
        assert result.route is Route.CHUNKED and result.packets > 4
        assert result.sha256 == hashlib.sha256(payload).hexdigest()
        msg = _next(sub)
        assert isinstance(msg, Message), msg
        assert msg.payload == payload and msg.sha256 == result.sha256
        assert ("_enc", "age-v1") not in msg.properties.user_properties
    finally:
        for c in made:
            c.close()
        raw.close()
    assert len(seen) == result.packets
    assert not [m for m in seen if MARKER in m.payload]
    assert seen[0].payload.startswith(b"age-encryption.org/v1\n")


def test_settings_refuse_bad_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="age"):
        Client("mqtt://127.0.0.1:1", encrypt_to={"a/#": ["not-a-key"]})
    with pytest.raises(ConfigError, match="identity file"):
        Client("mqtt://127.0.0.1:1", identity_files=(str(tmp_path / "missing"),))
    bad = tmp_path / "bad"
    bad.write_text("AGE-SECRET-KEY-1NOTAKEY\n")
    with pytest.raises(ConfigError, match="identity file") as caught:
        Client("mqtt://127.0.0.1:1", identity_files=(str(bad),))
    assert "NOTAKEY" not in str(caught.value)


def test_compress_encrypted_opt_in_compresses_then_encrypts(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = unique_topic("zenc")
    identity, key_file = _key(tmp_path, "k")
    telemetry = json.dumps([{"sensor": i % 9, "t": i} for i in range(40000)]).encode()
    raw = clients(fetch_external=False)
    raw.subscribe(topic)
    sub = clients(identity_files=(str(key_file),))
    sub.subscribe(topic)
    pub = clients(
        encrypt_to={topic: [str(identity.recipient)]}, compress=True, compress_encrypted=True
    )
    result = pub.publish(topic, telemetry, qos=1)
    doc = json.loads(_next(raw).payload)  # type: ignore[union-attr]
    assert doc["cmp"] == "zstd" and doc["enc"] == "age-v1"
    stored = _stored(gateway, result.url or "")
    assert stored.startswith(b"age-encryption.org/v1\n") and len(stored) * 4 < len(telemetry)
    msg = _next(sub)
    assert isinstance(msg, Message) and msg.payload == telemetry


def test_compression_is_off_by_default(
    gateway: GatewayServer, clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    """Readers that are not this library (hop-client, curl, unmodified clients behind
    offload-proxy) read the stored bytes: by default they are the payload itself."""
    topic = unique_topic("zstd-default")
    pub = clients(offload_threshold=1000)
    telemetry = json.dumps([{"sensor": i % 9, "t": i} for i in range(20000)]).encode()
    sent = pub.publish(topic, telemetry, qos=1)
    assert _stored(gateway, sent.url or "") == telemetry
