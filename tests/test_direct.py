"""Direct transfers: payload bytes between clients and SeaweedFS, the gateway only signs.

Real SeaweedFS (the session fixture), the real gateway under uvicorn, real mosquitto, the
real client; the store is reached through a recording TCP relay on loopback where a test
must see what the store receives (credentials must never arrive there).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from pathlib import Path

import httpx
import pytest
from minio import Minio

from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS
from client import Client, Message
from client._http import HttpTransport

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
ACL = "user writer\ntopic readwrite direct/#\n"
WRITER = ("writer", "w-secret")


def _hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _received_bytes(gw: GatewayServer) -> tuple[float, float]:
    """Request and response body bytes the gateway process has counted (its /metrics)."""
    text = httpx.get(f"{gw.url}/metrics").text
    totals = {"offload_http_received_bytes_total": 0.0, "offload_http_sent_bytes_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals["offload_http_received_bytes_total"], totals["offload_http_sent_bytes_total"]


class RecordingRelay:
    """A TCP relay on loopback in front of the store that keeps what clients sent it.

    Bytes pass unchanged (the Host header too, so SigV4 signatures made for the relay's
    address hold at the store); up to 64 MiB of what clients send is kept, and
    `requests()` finds every request head in it (keep-alive connections carry several).
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._streams: list[bytearray] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            stream = bytearray()
            with self._lock:
                self._streams.append(stream)

            def keep(data: bytes, stream: bytearray = stream) -> None:
                with self._lock:
                    if len(stream) < 64 * MiB:
                        stream += data

            threading.Thread(target=_pump, args=(conn, upstream, keep), daemon=True).start()
            threading.Thread(target=_pump, args=(upstream, conn, None), daemon=True).start()

    def requests(self) -> list[bytes]:
        """Every request head (request line and headers) clients sent through the relay."""
        with self._lock:
            streams = [bytes(s) for s in self._streams]
        return [m.group(0) for s in streams for m in _HEAD.finditer(s)]

    def close(self) -> None:
        self.sock.close()


_HEAD = re.compile(rb"(?:GET|PUT|HEAD|POST|DELETE) /[^ \r\n]* HTTP/1\.1\r\n.*?\r\n\r\n", re.DOTALL)


def _pump(src: socket.socket, dst: socket.socket, keep: Callable[[bytes], None] | None) -> None:
    try:
        while data := src.recv(65536):
            if keep is not None:
                keep(data)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture
def relay(seaweed: SeaweedFS) -> Iterator[RecordingRelay]:
    r = RecordingRelay(seaweed.s3_port)
    yield r
    r.close()


@pytest.fixture
def auth_files() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="offload-direct-"))
    passwd = path / "passwd"
    args = ["mosquitto_passwd", "-c", "-b", "-H", "sha512-pbkdf2", "-I", "1000"]
    subprocess.run([*args, str(passwd), *WRITER], check=True, capture_output=True)
    (path / "acl").write_text(ACL)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def direct_gateway(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    relay: RecordingRelay,
    auth_files: Path,
) -> GatewayServer:
    """A gateway requiring credentials, advertising direct transfers via the relay."""
    return gateway_factory(
        broker,
        s3_public_url=relay.url,
        password_file=auth_files / "passwd",
        acl_file=auth_files / "acl",
        tls=True,  # "behind an HTTPS proxy": Basic credentials are accepted
        auth_secret="replicas-share-this",
    )


@pytest.fixture
def store(seaweed: SeaweedFS, bucket_name: str) -> Minio:
    return Minio(
        seaweed.endpoint,
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
        secure=False,
    )


def _client(broker: Mosquitto, **kw: object) -> Client:
    kw.setdefault("discovery_wait", 10.0)
    c = Client(broker.url, http_auth=httpx.BasicAuth(*WRITER), **kw)  # type: ignore[arg-type]
    c.connect()
    return c


def _objects(store: Minio, bucket: str) -> list[str]:
    return [
        o.object_name
        for o in store.list_objects(bucket, recursive=True)
        if o.object_name and not o.object_name.startswith("probes/")
    ]


def test_direct_publish_bytes_skip_the_gateway_and_carry_no_credentials(
    direct_gateway: GatewayServer, broker: Mosquitto, relay: RecordingRelay, unique_topic: Any
) -> None:
    topic = unique_topic("direct")
    # A cookie in the shared jar: httpx would send it to every port of 127.0.0.1.
    jar = httpx.Client(cookies={"session": "gateway-cookie"}, timeout=30)
    sub = _client(broker, transport=HttpTransport(client=jar))
    pub = _client(broker, transport=HttpTransport(client=jar))
    try:
        sub.subscribe(topic)
        assert pub.wait_for_endpoint(10) == direct_gateway.url
        record = pub.discovery_record
        assert record is not None and record.direct_store == f"{relay.url}"
        payload = os.urandom(13 * MiB)  # two parts: 8 MiB and 5 MiB
        before_in, before_out = _received_bytes(direct_gateway)
        result = pub.publish(topic, payload, qos=1)
        assert result.message_id is not None
        msg = next(sub.messages(timeout=60))
        assert isinstance(msg, Message), msg
        assert msg.payload == payload
        after_in, after_out = _received_bytes(direct_gateway)
        # Through the proxy the gateway would have counted 13 MiB in and 13 MiB out.
        assert after_in - before_in < MiB, after_in - before_in
        assert after_out - before_out < MiB, after_out - before_out
    finally:
        pub.close()
        sub.close()
        jar.close()
    sent = relay.requests()
    methods = sorted({head.split(b" ", 1)[0] for head in sent})
    assert methods == [b"GET", b"PUT"], methods  # parts went up, the payload came down here
    for head in sent:
        headers = head.lower()
        assert b"authorization:" not in headers
        assert b"cookie:" not in headers
        assert b"gateway-cookie" not in headers
