"""`HttpTransport.fetch`'s cheaper paths: checks still hold, nothing leaks.

In memory, each piece is copied into one buffer as it arrives; a spooled payload of 4 MiB
and more is hashed by a worker thread fed as the body arrives. These tests show,
against the real gateway on SeaweedFS (and a tiny server that hangs up mid-body), that the
payload is still handed over only when it matches, that a mismatch or a cut-short body
leaves no spool file, and that no hashing thread outlives its fetch.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import FetchError, PayloadChecksumMismatch
from client.core._source import PayloadSource
from client.http._answers import TransientFetchError
from client.http._fetching import HASH_BATCH, THREADED_HASH_FROM
from client.http._transport import HttpTransport
from client.protocol import MessageId

from _gateway import GatewayServer
from _servers import free_port

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
#: Above the threaded-hash threshold and not a whole number of hash batches.
SIZE = THREADED_HASH_FROM + 3 * HASH_BATCH // 2 + 123


def _hashers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "offload-sha256"]


@pytest.fixture
def stored(gateway: GatewayServer) -> tuple[str, bytes]:
    """A payload uploaded through the gateway; its raw payload URL and bytes."""
    data = os.urandom(SIZE)
    mid = MessageId.new()
    with HttpTransport(timeout=60) as http, PayloadSource(data) as source:
        http.upload(gateway.url, "fetch/threaded", source, message_id=mid)
    return f"{gateway.url}/msg/{mid}/payload", data


@pytest.mark.parametrize("spooled", [False, True], ids=["in-memory", "spooled"])
def test_threaded_hash_hands_over_the_exact_bytes(
    stored: tuple[str, bytes], tmp_path: Path, spooled: bool
) -> None:
    url, data = stored
    seen: list[int] = []
    with HttpTransport(timeout=60) as http:
        payload = http.fetch(
            url,
            expected_sha256=hashlib.sha256(data).hexdigest(),
            expected_size=len(data),
            spool_threshold=0 if spooled else len(data),
            spool_dir=tmp_path,
            on_bytes=lambda done, total: seen.append(done),
        )
    assert (payload.path is not None) is spooled
    assert payload.read() == data
    assert seen[-1] == len(data) and seen == sorted(seen)  # progress still reported
    assert _hashers() == []
    payload.discard()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("spooled", [False, True], ids=["in-memory", "spooled"])
def test_threaded_hash_mismatch_discards_and_raises(
    stored: tuple[str, bytes], tmp_path: Path, spooled: bool
) -> None:
    url, data = stored
    wrong = hashlib.sha256(data + b"x").hexdigest()
    with HttpTransport(timeout=60) as http, pytest.raises(PayloadChecksumMismatch) as caught:
        http.fetch(
            url,
            expected_sha256=wrong,
            expected_size=len(data),
            spool_threshold=0 if spooled else len(data),
            spool_dir=tmp_path,
        )
    assert caught.value.actual == hashlib.sha256(data).hexdigest()
    assert list(tmp_path.iterdir()) == []  # the spool file went with the payload
    assert _hashers() == []


@pytest.fixture
def hang_up_server() -> Iterator[str]:
    """Declares 8 MiB, sends 5 MiB, closes: a store or gateway dying mid-download."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    port = free_port()
    sock.bind(("127.0.0.1", port))
    sock.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    piece = conn.recv(4096)
                    if not piece:
                        break
                    head += piece
                # /close: no Content-Length, the body ends when the connection does.
                framing = (
                    b"Connection: close"
                    if b" /close" in head
                    else b"Content-Length: %d" % (8 * MiB)
                )
                try:
                    conn.sendall(b"HTTP/1.1 200 OK\r\n%s\r\n\r\n" % framing)
                    conn.sendall(b"\1" * (5 * MiB))
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{port}"
    sock.close()


@pytest.mark.parametrize("spooled", [False, True], ids=["in-memory", "spooled"])
def test_body_cut_short_leaves_no_file_and_no_thread(
    hang_up_server: str, tmp_path: Path, spooled: bool
) -> None:
    with HttpTransport(timeout=30) as http, pytest.raises(FetchError) as caught:
        http.fetch(
            f"{hang_up_server}/msg/x/payload",
            expected_sha256="0" * 64,
            expected_size=8 * MiB,
            spool_threshold=0 if spooled else 8 * MiB,
            spool_dir=tmp_path,
        )
    # A body that ends early is worth another try (a restart), not a checksum failure.
    assert isinstance(caught.value, TransientFetchError), caught.value
    assert list(tmp_path.iterdir()) == []
    assert _hashers() == []


def test_close_delimited_body_shorter_than_declared_is_not_padded(
    hang_up_server: str, tmp_path: Path
) -> None:
    """The in-memory buffer is made at the declared size; what did not arrive stays out.

    No checksum is given, so only the size check stands between a short body and the
    application: a buffer padded to the declared size would pass it.
    """
    with HttpTransport(timeout=30) as http, pytest.raises(TransientFetchError) as caught:
        http.fetch(
            f"{hang_up_server}/close",
            expected_sha256=None,
            expected_size=8 * MiB,
            spool_threshold=8 * MiB,
        )
    assert f"got {5 * MiB}" in str(caught.value), caught.value
