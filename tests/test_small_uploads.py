"""Small payloads taken whole on the event loop (`gateway.ingest._small`), through the
running gateway on SeaweedFS: which path a size takes, what lands, and what a client that
sends less than it announced leaves behind (nothing, and no transfer slot held).
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, BinaryIO

import httpx
import pytest

from client.protocol import Manifest, MessageId, encode_upload, index_key
from gateway import Settings
from gateway.ingest._small import SMALL_PAYLOAD
from gateway.storage import S3Store

from _gateway import GatewayServer
from _servers import SeaweedFS

pytestmark = pytest.mark.servers


class CountingStore(S3Store):
    """SeaweedFS through the real `S3Store`, counting which path each payload took."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.streamed: list[str] = []  # keys stored through a transfer thread
        self.whole: list[str] = []  # keys stored with one PUT from the event loop

    def put_stream(
        self, key: str, reader: BinaryIO, length: int, content_type: str | None = None
    ) -> None:
        with self.lock:
            self.streamed.append(key)
        super().put_stream(key, reader, length, content_type)

    async def write(
        self, key: str, data: bytes, content_type: str = "application/json", *, only_new: bool
    ) -> bool:
        if key.startswith("data/") and not key.endswith(".json"):
            with self.lock:
                self.whole.append(key)
        return await super().write(key, data, content_type, only_new=only_new)


@pytest.fixture
def store(seaweed: SeaweedFS, bucket_name: str) -> CountingStore:
    return CountingStore(
        seaweed.endpoint, bucket_name,
        access_key=seaweed.access_key, secret_key=seaweed.secret_key,
    )  # fmt: skip


@pytest.fixture
def gateway(seaweed: SeaweedFS, bucket_name: str, store: CountingStore) -> Iterator[GatewayServer]:
    settings = Settings(
        storage_url=seaweed.storage_url(bucket_name),
        s3_access_key=seaweed.access_key,
        s3_secret_key=seaweed.secret_key,
        allow_anonymous=True,
        max_transfers=2,
        body_idle_timeout=3,
    )  # type: ignore[call-arg]
    server = GatewayServer(settings, store=store).start()
    yield server
    server.stop()


def _manifest(store: S3Store, message_id: str) -> Manifest:
    raw = store.get_bytes(index_key(MessageId.parse(message_id)))
    assert raw is not None
    return Manifest.from_json(raw)


@pytest.mark.parametrize(
    ("size", "whole"),
    [(0, True), (1, True), (300_000, True), (SMALL_PAYLOAD, True), (SMALL_PAYLOAD + 1, False)],
)
def test_a_payload_up_to_the_small_size_is_stored_whole_and_reads_back_intact(
    gateway: GatewayServer, store: CountingStore, size: int, whole: bool
) -> None:
    payload = os.urandom(size)
    message_id = str(uuid.uuid4())
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        r = http.put(f"/msg/{message_id}?topic=small/raw", content=payload)
        assert r.status_code == 201, r.text
        assert r.json()["sha256"] == hashlib.sha256(payload).hexdigest()
        assert http.get(f"/msg/{message_id}/payload").content == payload
    manifest = _manifest(store, message_id)
    assert manifest.size == size
    assert manifest.crc32c == f"{_crc32c(payload):08x}"
    assert (store.whole, store.streamed) == (
        ([manifest.data_key], []) if whole else ([], [manifest.data_key])
    )


def test_a_hop_document_with_a_small_payload_takes_the_same_path(
    gateway: GatewayServer, store: CountingStore
) -> None:
    payload = os.urandom(200_000)
    head, tail = encode_upload(len(payload), headers=[("_id", MessageId.new().bytes)])
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        r = http.post("/topic/small/hop+oversized", content=head + payload + tail)
        assert r.status_code == 201, r.text
        assert http.get(f"/msg/{r.json()['id']}/payload").content == payload
    assert len(store.whole) == 1 and store.streamed == []


def _half_an_upload(how: str) -> bytes:
    """A request announcing a 100,000-byte payload, with half of it sent."""
    if how == "raw":
        head = (
            f"PUT /msg/{uuid.uuid4()}?topic=small/cut HTTP/1.1\r\nHost: gw\r\n"
            "Content-Length: 100000\r\n\r\n"
        ).encode()
        return head + b"x" * 50_000
    doc_head, doc_tail = encode_upload(100_000, headers=[])
    head = (
        "POST /topic/small/cut+oversized HTTP/1.1\r\nHost: gw\r\n"
        f"Content-Length: {len(doc_head) + 100_000 + len(doc_tail)}\r\n\r\n"
    ).encode()
    return head + doc_head + b"x" * 50_000


def _active(gateway: GatewayServer) -> int:
    answer = httpx.get(f"{gateway.url}/healthz", timeout=10).json()
    return int(answer["workers"]["transfers"]["active"])


def _status(sock: socket.socket) -> int:
    """The status of the answer on `sock` (0: closed without one)."""
    got = b""
    while b"\r\n" not in got:
        piece = sock.recv(65536)
        if not piece:
            return 0
        got += piece
    return int(got.split(b" ", 2)[1])


def test_bytes_past_the_content_length_do_not_take_the_place_of_its_answer(
    gateway: GatewayServer, store: CountingStore
) -> None:
    """A whole upload, then 500 bytes that are no request, in one write: the upload gets
    its own 201 and the connection closes after it (uvicorn's 400 for the junk came first
    and was taken for the upload's answer, the payload stored all the same)."""
    message_id = str(uuid.uuid4())
    head = (
        f"PUT /msg/{message_id}?topic=small/extra HTTP/1.1\r\nHost: gw\r\n"
        "Content-Length: 1000\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=20) as sock:
        sock.sendall(head + b"z" * 1000 + b"junk " * 100)
        answers = []
        while status := _status(sock):
            answers.append(status)
            sock.recv(65536)  # the rest of that answer, then the close
    assert answers == [201]
    assert httpx.get(f"{gateway.url}/msg/{message_id}/payload").content == b"z" * 1000


@pytest.mark.parametrize("how", ["raw", "hop"])
def test_uploads_that_stall_are_each_answered_and_leave_nothing(
    gateway: GatewayServer, store: CountingStore, how: str
) -> None:
    """Two transfer slots, three uploads that stop half way: the two admitted get 408 once
    the body idle timeout (3 s) passes, the third 503 at once; nothing is stored and no
    slot stays taken."""
    socks = [socket.create_connection(("127.0.0.1", gateway.port), timeout=20) for _ in range(3)]
    try:
        for sock in socks[:2]:
            sock.sendall(_half_an_upload(how))
        deadline = time.monotonic() + 10
        while _active(gateway) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        socks[2].sendall(_half_an_upload(how))
        started = time.monotonic()
        assert _status(socks[2]) == 503
        assert time.monotonic() - started < 2
        assert [_status(sock) for sock in socks[:2]] == [408, 408]
    finally:
        for sock in socks:
            sock.close()
    assert _active(gateway) == 0
    assert [info.key for info in store.list("data/small/cut")] == []
    assert (store.whole, store.streamed) == ([], [])


@pytest.mark.parametrize("how", ["raw", "hop"])
def test_a_client_that_sends_less_than_it_announced_leaves_nothing_and_no_slot(
    gateway: GatewayServer, store: CountingStore, how: str
) -> None:
    """Two transfer slots: three uploads cut short give theirs back (`/healthz` counts
    none active), then two whole ones side by side both get one."""
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
            sock.sendall(_half_an_upload(how))
            time.sleep(0.3)  # the gateway has read it; then the client hangs up
    with httpx.Client(base_url=gateway.url, timeout=60) as http:

        def active() -> int:
            return int(http.get("/healthz").json()["workers"]["transfers"]["active"])

        deadline = time.monotonic() + 10  # each slot goes once its hang-up is read
        while active() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert active() == 0
        answers: list[int] = []

        def upload() -> None:
            r = http.put(f"/msg/{uuid.uuid4()}?topic=small/after", content=b"y" * 1000)
            answers.append(r.status_code)

        pair = [threading.Thread(target=upload) for _ in range(2)]
        for thread in pair:
            thread.start()
        for thread in pair:
            thread.join()
    assert answers == [201, 201]
    assert [info.key for info in store.list("data/small/cut")] == []
    assert len(store.whole) == 2


def _crc32c(data: bytes) -> int:
    from gateway.storage import crc32c_extend

    return crc32c_extend(0, data)
