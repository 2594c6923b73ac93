"""The S3 store over TLS: objects intact, and no MD5 of every body (bench/RESULTS.md).

SeaweedFS serves plain http here; a TLS-terminating relay (Python's `ssl`, a private CA
made with openssl) sits in front of it, so the SDK really speaks https and the relay sees
the decrypted requests: what headers went out is observed on the wire, not asked of the
code. The stock SDK sends `Content-MD5` through the same relay, which shows the check can
fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import socket
import ssl
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
from minio import Minio

from gateway.storage import S3Store, StoreError

from _hostile import accept_each
from _servers import SeaweedFS

pytestmark = pytest.mark.servers

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def pki() -> Iterator[Path]:
    """A CA and a certificate for 127.0.0.1 signed by it."""
    path = Path(tempfile.mkdtemp(prefix="offload-s3tls-"))

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=path, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
        "ca.pem", "-days", "2", "-subj", "/CN=offload s3 tls test CA")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
        "server.csr", "-subj", "/CN=127.0.0.1")  # fmt: skip
    (path / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


class TlsRelay:
    """Accepts TLS on a loopback port, relays plaintext to `target`, keeps what it read."""

    def __init__(self, target: tuple[str, int], cert: Path, key: Path) -> None:
        self.target = target
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests = bytearray()  # everything clients sent, decrypted
        self.lock = threading.Lock()
        accept_each(self.listener, self._serve)

    def _serve(self, raw: socket.socket) -> None:
        try:
            client = self.context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        upstream = socket.create_connection(self.target)
        threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()
        self._pump(client, upstream, True)

    def _pump(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        try:
            while data := source.recv(256 * 1024):
                if record:
                    with self.lock:
                        self.requests += data
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def heads(self, method: bytes) -> list[tuple[bytes, set[bytes]]]:
        """(request line, lower-case header names) of every `method` request relayed."""
        with self.lock:
            stream = bytes(self.requests)
        found = []
        start = stream.find(method + b" /")
        while start >= 0:  # a body could hold these bytes too; random ones do not
            end = stream.find(b"\r\n\r\n", start)
            lines = stream[start:end].split(b"\r\n")
            names = {line.split(b":", 1)[0].strip().lower() for line in lines[1:]}
            found.append((lines[0], names))
            start = stream.find(method + b" /", start + 1)
        return found

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def relay(seaweed: SeaweedFS, pki: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TlsRelay]:
    # The stores build their own urllib3 pools: trust the test CA the way an operator would.
    monkeypatch.setenv("SSL_CERT_FILE", str(pki / "ca.pem"))
    relay = TlsRelay(("127.0.0.1", seaweed.s3_port), pki / "server.pem", pki / "server.key")
    yield relay
    relay.close()


def test_objects_travel_intact_over_tls_without_content_md5(
    relay: TlsRelay, seaweed: SeaweedFS, bucket_name: str
) -> None:
    store = S3Store(
        f"127.0.0.1:{relay.port}", bucket_name, access_key=seaweed.access_key,
        secret_key=seaweed.secret_key, secure=True,
    )  # fmt: skip
    store.ensure_bucket()
    big = os.urandom(12 * MiB)  # two parts of the default 8 MiB: a multipart upload
    store.put_stream("tls/big", io.BytesIO(big), len(big), "application/octet-stream")
    store.put_bytes("tls/small", b'{"small": true}')
    assert store.create_bytes("tls/index", b"first") is True
    assert store.create_bytes("tls/index", b"second") is False

    assert b"".join(store.open_range("tls/big")) == big
    assert store.get_bytes("tls/small") == b'{"small": true}'
    assert store.get_bytes("tls/index") == b"first"
    puts = relay.heads(b"PUT")
    # The relay saw the multipart upload's two parts (and the start-up checksum probe's).
    parts = [line for line, _ in puts if b"partNumber=" in line and b"/probes/" not in line]
    assert len(parts) == 2, puts
    signed = [names for line, names in puts if b"X-Amz-Signature=" not in line]  # not presigned
    assert signed and all(b"x-amz-content-sha256" in names for names in signed)
    assert [line for line, names in puts if b"content-md5" in names] == []


def test_the_stock_sdk_sends_content_md5_through_the_same_relay(
    relay: TlsRelay, seaweed: SeaweedFS, bucket_name: str, pki: Path
) -> None:
    """What the store saves: the unmodified SDK hashes and sends every body's MD5."""
    client = Minio(
        f"127.0.0.1:{relay.port}", seaweed.access_key, seaweed.secret_key, secure=True,
        http_client=urllib3.PoolManager(ca_certs=str(pki / "ca.pem")),
    )  # fmt: skip
    client.make_bucket(bucket_name)
    client.put_object(bucket_name, "stock", io.BytesIO(b"x" * 1000), 1000)
    (line, names), *_ = [head for head in relay.heads(b"PUT") if b"/stock" in head[0]]
    assert b"content-md5" in names, line


def test_reads_on_the_event_loop_trust_the_configured_ca_and_no_other(
    relay: TlsRelay, seaweed: SeaweedFS, bucket_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Downloads (`S3Store.read`, asyncio) verify the store as the SDK's requests do."""

    def make() -> S3Store:
        return S3Store(
            f"127.0.0.1:{relay.port}", bucket_name, access_key=seaweed.access_key,
            secret_key=seaweed.secret_key, secure=True, region="us-east-1",
        )  # fmt: skip

    async def read(store: S3Store) -> bytes:
        body = await store.read(store.read_url("tls/read"), 5, 2 * MiB)
        return b"".join([piece async for piece in body])

    store = make()
    store.ensure_bucket()
    data = os.urandom(3 * MiB)
    store.put_bytes("tls/read", data, "application/octet-stream")
    assert asyncio.run(read(store)) == data[5 : 5 + 2 * MiB]
    monkeypatch.delenv("SSL_CERT_FILE")  # the system's CAs only: the test CA is unknown
    with pytest.raises(StoreError, match="CERTIFICATE_VERIFY_FAILED"):
        asyncio.run(read(make()))
