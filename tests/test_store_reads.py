"""Downloads read on the event loop (`S3Store.read`: a presigned GET over asyncio).

Against the real SeaweedFS, through a TCP relay (tests/_relay.py) that counts the store
connections the gateway opens and sees which it closes.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
import uvloop

from client.protocol import MessageId
from gateway.storage import S3Store, StoreError
from gateway.storage._async_http import AsyncStoreHttp
from gateway.storage._store_connection import MIN_ROOM, READ_BUFFER

from _gateway import GatewayServer
from _hostile import RawRequest
from _relay import Relay
from _scripted_store import ScriptedStore
from _servers import SeaweedFS, free_port

pytestmark = pytest.mark.servers

MiB = 1024 * 1024


@pytest.fixture
def relay(seaweed: SeaweedFS) -> Iterator[Relay]:
    relay = Relay(seaweed.s3_port)
    yield relay
    relay.close()


@pytest.fixture
def writer(seaweed: SeaweedFS, bucket_name: str) -> S3Store:
    """Writes straight to the store: the relay sees the reads alone."""
    store = S3Store(
        seaweed.endpoint, bucket_name,
        access_key=seaweed.access_key, secret_key=seaweed.secret_key,
    )  # fmt: skip
    store.ensure_bucket()
    return store


@pytest.fixture
def store(writer: S3Store, relay: Relay, seaweed: SeaweedFS, bucket_name: str) -> S3Store:
    """Reads through the relay (the region named: signing asks the store nothing)."""
    return S3Store(
        f"127.0.0.1:{relay.port}", bucket_name, region="us-east-1",
        access_key=seaweed.access_key, secret_key=seaweed.secret_key,
    )  # fmt: skip


def wait_for(predicate: Callable[[], bool], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_whole_objects_and_ranges_come_intact_over_one_kept_connection(
    store: S3Store, writer: S3Store, relay: Relay
) -> None:
    data = os.urandom(3 * MiB + 5)
    writer.put_bytes("reads/big", data, "application/octet-stream")

    async def reads() -> tuple[list[bytes], int]:
        got = []
        for start, length in ((0, None), (MiB - 1, 2 * MiB + 3), (len(data) - 7, None)):
            body = await store.read(store.read_url("reads/big"), start, length)
            got.append(b"".join([piece async for piece in body]))
        return got, relay.accepted

    got, connections = asyncio.run(reads())
    assert got == [data, data[MiB - 1 : 3 * MiB + 2], data[-7:]]
    assert connections == 1  # each read left the connection for the next one


def test_pieces_are_views_as_large_as_the_socket_holds_and_stay_intact(
    store: S3Store, writer: S3Store, relay: Relay
) -> None:
    """The store's bytes are read into the connection's own buffers and handed over as
    views of them: a piece is as large as what waited in the socket (up to READ_BUFFER),
    not cut at the event loop's read size (256 KiB), and a view stays intact while later
    reads, and the next answer on the kept connection, fill the buffers after it. A kept
    connection lets go of its buffer while it waits."""
    first, second = os.urandom(6 * MiB + 3), os.urandom(3 * MiB)
    writer.put_bytes("reads/views-1", first, "application/octet-stream")
    writer.put_bytes("reads/views-2", second, "application/octet-stream")

    async def reads() -> tuple[list[memoryview], list[memoryview]]:
        held = []
        for key in ("reads/views-1", "reads/views-2"):
            body = await store.read(store.read_url(key))
            pieces = []
            async for piece in body:
                pieces.append(piece)  # kept as it is, never copied
                await asyncio.sleep(0.02)  # a slow client: the store's bytes pile up
            held.append(pieces)
        kept = store._on_loop._kept.take(f"http://127.0.0.1:{relay.port}")
        assert kept is not None and not kept._buffer  # kept idle without a read buffer
        kept.close()
        return held[0], held[1]

    pieces, after = uvloop.run(reads())
    assert relay.accepted == 1  # the second answer came on the same connection
    assert b"".join(pieces) == first and b"".join(after) == second
    assert all(isinstance(piece, memoryview) for piece in pieces)
    assert max(map(len, pieces)) > 512 * 1024, sorted(map(len, pieces))[-3:]
    assert max(map(len, pieces)) <= READ_BUFFER


def test_a_read_closed_half_way_closes_its_connection_and_the_next_read_is_intact(
    store: S3Store, writer: S3Store, relay: Relay
) -> None:
    data = os.urandom(8 * MiB)
    writer.put_bytes("reads/cut", data, "application/octet-stream")

    async def closed() -> bool:
        for _ in range(200):  # the loop closes the socket on its next turns
            if relay.open == 0:
                return True
            await asyncio.sleep(0.05)
        return False

    async def cut_then_read() -> bytes:
        body = await store.read(store.read_url("reads/cut"))
        first = await anext(body)
        assert 0 < len(first) < len(data)
        body.close()  # what a client that hangs up mid-download leads to
        assert await closed()  # not kept for another read with bytes unread
        again = await store.read(store.read_url("reads/cut"))
        return b"".join([piece async for piece in again])

    assert asyncio.run(cut_then_read()) == data


def test_a_missing_object_is_not_found_and_an_unreachable_store_a_store_error(
    store: S3Store, relay: Relay
) -> None:
    async def missing() -> None:
        await store.read(store.read_url("reads/none"))

    with pytest.raises(FileNotFoundError):
        asyncio.run(missing())
    url = store.read_url("reads/none").replace(f":{relay.port}/", f":{free_port()}/")

    async def unreachable() -> None:
        await store.read(url)

    with pytest.raises(StoreError):
        asyncio.run(unreachable())


@pytest.mark.parametrize("client", ["hangs up", "stops reading"])
def test_a_download_cut_short_frees_its_slot_and_store_connection(
    client: str,
    gateway_factory: Callable[..., GatewayServer],
    relay: Relay,
    seaweed: SeaweedFS,
    bucket_name: str,
) -> None:
    gw = gateway_factory(
        storage_url=f"s3://127.0.0.1:{relay.port}/{bucket_name}?secure=false",
        send_idle_timeout=2,  # ends the answer to a client that stopped reading
    )
    message_id = str(MessageId.new())
    payload = os.urandom(16 * MiB)
    put = httpx.put(f"{gw.url}/msg/{message_id}?topic=reads/hangup", content=payload, timeout=60)
    assert put.status_code == 201, put.text

    def active() -> int:
        health = httpx.get(f"{gw.url}/healthz", timeout=10).json()
        return int(health["workers"]["transfers"]["active"])

    whole = httpx.get(f"{gw.url}/msg/{message_id}/payload", timeout=60)
    assert whole.status_code == 200 and whole.content == payload
    kept = relay.open  # the store connections the gateway keeps between requests
    reader = RawRequest(
        gw.port, f"GET /msg/{message_id}/payload HTTP/1.1\r\nHost: gw\r\n\r\n", rcvbuf=4096
    )
    try:
        assert reader.response_head().startswith(b"HTTP/1.1 200")
        if client == "hangs up":
            reader.close()
        assert wait_for(lambda: active() == 0)
        assert wait_for(lambda: relay.open <= kept), (relay.open, kept)
    finally:
        reader.close()
    again = httpx.get(f"{gw.url}/msg/{message_id}/payload", timeout=60)
    assert again.status_code == 200 and again.content == payload


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
BUSY = b"HTTP/1.1 503 Slow Down\r\nContent-Length: 0\r\n\r\n"
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"


@pytest.mark.parametrize(
    ("answers", "outcome", "requests"),
    [
        ([OK, BUSY, BUSY, OK], b"hello", 4),  # a kept connection answering 503: retried
        ([OK, BUSY, BUSY, BUSY], "the store answered 503", 4),
        ([OK, CHUNKED], "no Content-Length", 2),
    ],
)
def test_the_stores_busy_and_unframed_answers(
    answers: list[bytes], outcome: bytes | str, requests: int
) -> None:
    server = ScriptedStore(answers)
    reads = AsyncStoreHttp(connect_timeout=3, read_timeout=10)
    url = f"http://127.0.0.1:{server.port}/bucket/key?X-Amz-Signature=0"

    async def twice() -> bytes:
        first = await reads.get(url)
        assert b"".join([piece async for piece in first]) == b"hello"
        second = await reads.get(url)  # on the kept connection first
        return b"".join([piece async for piece in second])

    try:
        if isinstance(outcome, bytes):
            assert asyncio.run(twice()) == outcome
        else:
            with pytest.raises(StoreError, match=outcome):
                asyncio.run(twice())
        assert server.requests == requests
    finally:
        server.close()


def test_a_small_answer_is_read_into_a_buffer_of_its_size() -> None:
    """A fresh read buffer is zeroed: a 1 MiB one for every small object was most of a
    small download's read. The head's buffer is MIN_ROOM, a body's no larger than it."""
    big = b"x" * (300 * 1024)
    server = ScriptedStore([OK, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big) + big])
    reads = AsyncStoreHttp(connect_timeout=3, read_timeout=10)
    url = f"http://127.0.0.1:{server.port}/bucket/key?X-Amz-Signature=0"

    async def read() -> list[memoryview]:
        return [piece async for piece in await reads.get(url)]

    try:
        small = asyncio.run(read())
        assert b"".join(small) == b"hello"
        assert {len(piece.obj) for piece in small} == {MIN_ROOM}  # type: ignore[arg-type]
        pieces = asyncio.run(read())
        assert b"".join(pieces) == big
        assert max(len(piece.obj) for piece in pieces) <= len(big)  # type: ignore[arg-type]
    finally:
        server.close()
