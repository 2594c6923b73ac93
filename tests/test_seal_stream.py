"""Sealing while uploading, decoding while fetching (client/_seal.SealedStream, _unseal.Decoding).

An encrypted payload uploaded through the gateway is encrypted piece by piece as the upload
reads it, never spooled whole; a fetched one is decrypted while its stored bytes arrive and
handed out only after their SHA-256 matched. Large objects (past the threaded hashing size
and the spool threshold) on real servers: damage is a MessageError, no plaintext of it is
delivered and no spool file is left behind.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pyrage
import pytest

from client import (
    Client,
    DecryptionFailed,
    Message,
    MessageError,
    PayloadChecksumMismatch,
)
from client.config._settings import ClientSettings
from client.core._source import PIECE, PayloadSource
from client.protocol import MessageId, Placeholder
from client.protocol._age import encrypt
from client.protocol._age_keys import Identity
from client.protocol._encoding import Encoding
from client.seal._seal import SEAL_AHEAD, SealedStream, Sealer

from _gateway import GatewayServer

MiB = 1024 * 1024


def _pyrage_identity(identity: Identity) -> pyrage.x25519.Identity:
    return pyrage.x25519.Identity.from_str(str(identity))


class _Watched(PayloadSource):
    """A PayloadSource that records how far it has been read."""

    __slots__ = ("furthest",)

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.furthest = 0

    def read_at(self, offset: int, length: int) -> bytes:
        data = super().read_at(offset, length)
        self.furthest = max(self.furthest, offset + len(data))
        return data


def _seal_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "offload-seal"]


def test_a_sealed_stream_is_sealed_as_it_is_read_and_each_pass_has_its_own_key() -> None:
    identity = Identity.generate()
    data = os.urandom(20 * MiB + 5)
    source = _Watched(data)
    stream = SealedStream(source, [identity.recipient])
    pieces = stream.pieces()
    first = next(pieces)
    assert first.startswith(b"age-encryption.org/v1\n")
    # Bounded: the worker is at most SEAL_AHEAD pieces ahead, never through the payload.
    assert source.furthest <= (SEAL_AHEAD + 2) * PIECE < len(data)
    sealed = first + b"".join(pieces)
    assert len(sealed) == stream.size  # announced before a byte was sealed
    assert stream.sha256 == hashlib.sha256(sealed).hexdigest()
    assert stream.plain_sha256 == hashlib.sha256(data).hexdigest()
    assert pyrage.decrypt(sealed, [_pyrage_identity(identity)]) == data
    again = b"".join(stream.pieces())  # a retried upload
    assert len(again) == stream.size and again[:200] != sealed[:200]  # a fresh file key
    assert pyrage.decrypt(again, [_pyrage_identity(identity)]) == data


def test_closing_a_sealed_stream_early_stops_its_worker() -> None:
    stream = SealedStream(PayloadSource(os.urandom(16 * MiB)), [Identity.generate().recipient])
    pieces = stream.pieces()
    next(pieces)
    assert len(_seal_threads()) == 1
    pieces.close()  # what the upload does when the request fails
    assert _seal_threads() == []
    with pytest.raises(ValueError, match="not been read to its end"):
        _ = stream.sha256


@pytest.mark.parametrize("size", [0, 1, 64 * 1024, 64 * 1024 + 1, 3 * MiB])
def test_announced_sizes_are_exact_at_chunk_edges(size: int) -> None:
    identity = Identity.generate()
    data = os.urandom(size)
    stream = SealedStream(PayloadSource(data), [identity.recipient, Identity.generate().recipient])
    sealed = b"".join(stream.pieces())
    assert len(sealed) == stream.size
    assert pyrage.decrypt(sealed, [_pyrage_identity(identity)]) == data


def test_the_sealer_streams_only_where_asked_and_keeps_compression_spooled(tmp_path: Path) -> None:
    identity = Identity.generate()
    settings = ClientSettings(
        encrypt_to=(("t/#", (str(identity.recipient),)),), compress=True, compress_encrypted=True
    )
    text = b'{"reading": 21.5, "device": "dev-0001"}\n' * 50_000
    with PayloadSource(text) as source, Sealer(settings).seal("t/x", source, stream=True) as s:
        assert isinstance(s.source, SealedStream)  # compressed into the spool, then streamed
        sealed = b"".join(s.source.pieces())
        assert len(sealed) == s.source.size < len(text) // 4
        assert s.plain_sha256 == hashlib.sha256(text).hexdigest()
    with PayloadSource(text) as source, Sealer(settings).seal("t/x", source) as spooled:
        assert isinstance(spooled.source, PayloadSource)  # direct transfers and chunks seek


def _put(gateway: GatewayServer, topic: str, stored: bytes, sha256: str, publisher: Client) -> None:
    mid = MessageId.new()
    put = httpx.put(f"{gateway.url}/msg/{mid}", content=stored, params={"topic": topic})
    assert put.status_code == 201, put.text
    ref = Placeholder(
        f"{gateway.url}/msg/{mid}", len(stored), sha256, mid, Encoding(encrypted=True)
    )
    body, props = ref.encode(None)
    publisher.connection.publish(topic, body, qos=1, properties=props).result(10)


@pytest.mark.servers
def test_large_objects_decoded_while_fetched_are_checked_first_and_leave_no_spool(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = unique_topic("stream-dec")
    identity = Identity.generate()
    key = tmp_path / "key.txt"
    key.write_text(f"{identity}\n")
    spool = tmp_path / "spool"
    spool.mkdir()
    sub = clients(identity_files=(str(key),), spool_threshold=MiB, spool_dir=str(spool))
    sub.subscribe(topic, qos=1)
    pub = clients()
    good = os.urandom(6 * MiB + 7)  # past the threaded hashing size and the spool threshold
    sealed = encrypt(good, [identity.recipient])
    tampered = bytearray(sealed)
    tampered[3 * MiB] ^= 1  # a chunk in the middle: decoding fails on the hashing thread
    swapped = encrypt(os.urandom(6 * MiB), [identity.recipient])  # decrypts fine...
    sent = [
        (bytes(tampered), hashlib.sha256(tampered).hexdigest()),
        (swapped, hashlib.sha256(sealed).hexdigest()),  # ...but is not the placeholder's
        (sealed, hashlib.sha256(sealed).hexdigest()),
    ]
    for stored, sha256 in sent:
        _put(gateway, topic, stored, sha256, pub)
    first, second, third = (sub.next_message(60) for _ in sent)
    assert isinstance(first, MessageError) and isinstance(first.error, DecryptionFailed), first
    assert isinstance(second, MessageError), second
    assert isinstance(second.error, PayloadChecksumMismatch), second.error
    assert isinstance(third, Message), third
    assert third.payload == good and third.sha256 == hashlib.sha256(good).hexdigest()
    assert third.body.path is not None and list(spool.iterdir()) == [
        third.body.path
    ]  # no leftovers


@pytest.mark.servers
def test_an_encrypted_publish_through_the_gateway_is_streamed_and_readable(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = unique_topic("stream-enc")
    identity = Identity.generate()
    key = tmp_path / "key.txt"
    key.write_text(f"{identity}\n")
    sub = clients(identity_files=(str(key),))
    sub.subscribe(topic, qos=1)
    pub = clients(encrypt_to={topic: [str(identity.recipient)]}, spool_dir=str(tmp_path))
    data = os.urandom(9 * MiB + 3)
    result = pub.publish(topic, data, qos=1)
    assert result.sha256 == hashlib.sha256(data).hexdigest()
    stored = httpx.get(f"{result.url}/payload", timeout=30).content
    assert pyrage.decrypt(stored, [_pyrage_identity(identity)]) == data
    got = sub.next_message(60)
    assert isinstance(got, Message) and got.payload == data
    assert list(tmp_path.glob("tmp*")) == []  # nothing was spooled to publish it


class _Seen:
    """Every response the subscriber's HTTP client got: (Range asked, status, length)."""

    def __init__(self) -> None:
        self.answers: list[tuple[str | None, int, int]] = []

    def __call__(self, response: httpx.Response) -> None:
        length = int(response.headers.get("content-length", "0"))
        self.answers.append((response.request.headers.get("range"), response.status_code, length))


@pytest.mark.servers
def test_client_fetch_range_reads_only_the_chunks_that_hold_the_range(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    from client import HttpTransport, MalformedPlaceholder, NoMatchingIdentity, PayloadDecodeError

    topic = unique_topic("range")
    identity = Identity.generate()
    key = tmp_path / "key.txt"
    key.write_text(f"{identity}\n")
    seen = _Seen()
    http = httpx.Client(timeout=30, event_hooks={"response": [seen]})
    sub = clients(
        identity_files=(str(key),),
        fetch_external=False,
        endpoint=gateway.url,
        transport=HttpTransport(client=http),
    )
    sub.subscribe(f"{topic}/#", qos=1)
    pub = clients(encrypt_to={f"{topic}/enc": [str(identity.recipient)]}, endpoint=gateway.url)
    data = os.urandom(3 * MiB + 123)
    pub.publish(f"{topic}/enc", data, qos=1)
    pub.publish(f"{topic}/plain", data, qos=1)
    squeezed = clients(endpoint=gateway.url, compress=True)
    squeezed.publish(f"{topic}/zstd", b'{"k": 1}' * 100_000, qos=1)
    pub.publish(f"{topic}/small", b"not a placeholder", qos=1)
    got = {m.topic.rsplit("/", 1)[-1]: m for m in (sub.next_message(60) for _ in range(4))}
    assert all(isinstance(m, Message) for m in got.values()), got
    enc, plain = got["enc"], got["plain"]
    assert isinstance(enc, Message) and isinstance(plain, Message)
    cases = [(0, 1), (65535, 65537), (1_000_000, 1_200_000), (len(data) - 5, len(data) + 99)]
    for start, end in cases:
        seen.answers.clear()
        assert sub.fetch_range(enc, start, end) == data[start:end], (start, end)
        # The header, then the chunks holding the range: never the 3 MiB object.
        assert all(r is not None and s == 206 for r, s, _ in seen.answers), seen.answers
        transferred = sum(n for _, _, n in seen.answers)
        assert transferred <= 4096 + (end - start) + 2 * 65552, (start, end, seen.answers)
        seen.answers.clear()
        assert sub.fetch_range(plain, start, end) == data[start:end]
        assert [(r, s) for r, s, _ in seen.answers] == [
            (f"bytes={start}-{min(end, len(data)) - 1}", 206)
        ]
    assert sub.fetch_range(enc, len(data) + 1, len(data) + 10) == b""
    seen.answers.clear()
    with pytest.raises(PayloadDecodeError, match="compressed"):
        sub.fetch_range(got["zstd"], 0, 10)  # type: ignore[arg-type]
    assert seen.answers == []  # refused before any request
    with pytest.raises(MalformedPlaceholder):
        sub.fetch_range(got["small"], 0, 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sub.fetch_range(enc, 10, 5)
    stranger = clients(endpoint=gateway.url, fetch_external=False)
    with pytest.raises(NoMatchingIdentity):
        stranger.fetch_range(enc, 0, 10)


@pytest.mark.servers
def test_a_range_of_a_damaged_encrypted_object_fails_only_where_it_is_damaged(
    gateway: GatewayServer, clients: Callable[..., Client], tmp_path: Path
) -> None:
    identity = Identity.generate()
    key = tmp_path / "key.txt"
    key.write_text(f"{identity}\n")
    data = os.urandom(1 * MiB)
    stored = bytearray(encrypt(data, [identity.recipient]))
    stored[len(stored) // 2] ^= 1  # inside a chunk near 512 KiB of plaintext
    mid = MessageId.new()
    put = httpx.put(f"{gateway.url}/msg/{mid}", content=bytes(stored), params={"topic": "t/r"})
    assert put.status_code == 201, put.text
    ref = Placeholder(
        f"{gateway.url}/msg/{mid}",
        len(stored),
        hashlib.sha256(stored).hexdigest(),
        mid,
        Encoding(encrypted=True),
    )
    sub = clients(identity_files=(str(key),), endpoint=gateway.url)
    assert sub.fetch_range(ref, 0, 1000) == data[:1000]  # chunks are authenticated alone
    with pytest.raises(DecryptionFailed):
        sub.fetch_range(ref, len(data) // 2 - 10, len(data) // 2 + 10)


def test_a_spooled_fetch_decrypts_straight_to_a_spool_file(tmp_path: Path) -> None:
    """Past `spool_threshold` the plaintext never gathers in memory first (that doubled a
    consumer's peak RSS for a 1 GiB payload: bench/memory.py --encrypted, 61 -> 122 MiB)."""
    from client.seal._unseal import Unsealer

    identity = Identity.generate()
    key = tmp_path / "key.txt"
    key.write_text(f"{identity}\n")
    spool = tmp_path / "spool"
    spool.mkdir()
    settings = ClientSettings(identity_files=(str(key),), spool_threshold=MiB, spool_dir=str(spool))
    sealed = encrypt(os.urandom(3 * MiB), [identity.recipient])
    decoding = Unsealer(settings).decoding(Encoding(encrypted=True), len(sealed))
    decoding.feed([sealed[:200_000]])  # less than the threshold of plaintext so far
    assert len(list(spool.iterdir())) == 1
    decoding.discard()
    assert list(spool.iterdir()) == []


def test_a_streamed_upload_fails_when_the_gateway_stored_other_bytes() -> None:
    """No X-Offload-Sha256 goes ahead of a sealed stream: the gateway's answered digest is
    compared instead, and a placeholder is never published for bytes no reader accepts."""
    from client import UploadError
    from client.http._answers import _same_digest

    ours = "a" * 64
    _same_digest("http://gw/msg/1", httpx.Response(201, json={"sha256": ours}), ours)
    for answer in ({"sha256": "b" * 64}, {}, {"sha256": ["x"]}):
        with pytest.raises(UploadError, match="damaged on the way"):
            _same_digest("http://gw/msg/1", httpx.Response(201, json=answer), ours)
    with pytest.raises(UploadError, match="unreadable upload answer"):
        _same_digest("http://gw/msg/1", httpx.Response(201, content=b"[1, 2"), ours)
