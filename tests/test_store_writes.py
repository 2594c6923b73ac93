"""Small writes on the event loop (`S3Store.write`: a presigned PUT over asyncio), the
commit's sidecar and id index; and when the loop may sign at all.

Against the real SeaweedFS, and a scripted store for the answers SeaweedFS does not give
on demand (503, a kept connection it closed).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.storage import S3Store, StoreError
from gateway.storage import _s3 as s3_module
from gateway.storage._async_http import AsyncStoreHttp

from _scripted_store import CLOSED, STALL, ScriptedStore
from _servers import SeaweedFS

pytestmark = pytest.mark.servers


def _store(seaweed: SeaweedFS, bucket: str, region: str | None = None) -> S3Store:
    return S3Store(
        seaweed.endpoint, bucket, region=region,
        access_key=seaweed.access_key, secret_key=seaweed.secret_key,
    )  # fmt: skip


@pytest.fixture
def store(seaweed: SeaweedFS, bucket_name: str) -> S3Store:
    store = _store(seaweed, bucket_name)
    store.ensure_bucket()  # learns the region, probes checksums
    assert store.checksums, "SeaweedFS verifies CRC-32C: the checked path is the one tested"
    assert store.writes_now(), "and in a presigned PUT's query too (start-up's probe)"
    return store


def test_puts_and_creates_land_and_a_create_never_overwrites(store: S3Store) -> None:
    async def writes() -> list[bool]:
        return [
            await store.write("w/put", b'{"n": 1}', only_new=False),
            await store.write("w/put", b'{"n": 2}', only_new=False),  # a put replaces
            await store.write("w/new", b'{"n": 3}', only_new=True),
            await store.write("w/new", b'{"n": 4}', only_new=True),  # taken: refused
        ]

    assert asyncio.run(writes()) == [True, True, True, False]
    assert store.get_bytes("w/put") == b'{"n": 2}'
    assert store.get_bytes("w/new") == b'{"n": 3}'


def test_a_write_whose_checksum_does_not_match_is_refused_by_the_store(
    store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CRC-32C rides in the signed query, and the store checks the body against it:
    bytes damaged on the way are refused, not stored."""
    real = s3_module.crc32c_header
    monkeypatch.setattr(s3_module, "crc32c_header", lambda data: real(b"other bytes"))
    for only_new in (False, True):
        with pytest.raises(StoreError, match="HTTP 400"):
            asyncio.run(store.write(f"w/bad-{only_new}", b'{"n": 1}', only_new=only_new))
        assert store.get_bytes(f"w/bad-{only_new}") is None


def test_the_loop_signs_only_once_the_region_is_known(seaweed: SeaweedFS, bucket_name: str) -> None:
    """Signing needs the bucket's region; learning it is a store call, which the event loop
    must not make: until then, reads and writes go through a store thread. Writes also
    wait for start-up's probe to see the store verify CRC-32C, which is all that protects
    a presigned PUT's body (the SDK signs the body's SHA-256 where the store does not)."""
    _store(seaweed, bucket_name).ensure_bucket()
    fresh = _store(seaweed, bucket_name)
    assert not fresh.writes_now() and fresh.read_url_now("k") is None
    fresh.put_bytes("w/learn", b"{}")  # any SDK call on the bucket learns it
    assert fresh.read_url_now("k") is not None and not fresh.writes_now()
    fresh.ensure_bucket()  # the probe
    assert fresh.writes_now()
    named = _store(seaweed, bucket_name, region="us-east-1")
    assert named.read_url_now("k") is not None and not named.writes_now()
    unverified = S3Store(
        seaweed.endpoint, bucket_name, region="us-east-1", checksums=False,
        access_key=seaweed.access_key, secret_key=seaweed.secret_key,
    )  # fmt: skip
    unverified.ensure_bucket()
    assert not unverified.writes_now()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
BUSY = b"HTTP/1.1 503 Slow Down\r\nContent-Length: 9\r\n\r\nSlow Down"
TAKEN = b"HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\n\r\n"


@pytest.mark.parametrize(
    ("answers", "retry", "outcome", "requests"),
    [
        ([OK, BUSY, BUSY, OK], True, (200, b""), 4),  # a busy store: tried again, twice
        ([OK, BUSY, BUSY, BUSY], True, (503, b"Slow Down"), 4),  # then its answer
        ([OK, BUSY], False, (503, b"Slow Down"), 2),  # a create: never repeated
        ([OK, TAKEN], False, (412, b""), 2),
        ([OK, CLOSED, OK], False, (200, b""), 3),  # the kept connection was closed: anew
    ],
)
def test_a_put_after_a_kept_one_retries_only_what_it_may(
    answers: list[bytes], retry: bool, outcome: tuple[int, bytes], requests: int
) -> None:
    server = ScriptedStore(answers)
    http = AsyncStoreHttp(connect_timeout=3, read_timeout=10)
    url = f"http://127.0.0.1:{server.port}/bucket/key?X-Amz-Signature=0"

    async def twice() -> tuple[int, bytes]:
        assert await http.put(url, b"first") == (200, b"")
        return await http.put(url, b"second", retry=retry)  # on the kept connection first

    try:
        assert asyncio.run(twice()) == outcome
        assert server.requests == requests
    finally:
        server.close()


def test_a_store_that_does_not_answer_a_put_is_not_asked_again() -> None:
    """A stall is not a closed kept connection: the write fails after the timeouts,
    once (a create the store did take must not be sent twice)."""
    server = ScriptedStore([OK, STALL, OK])
    http = AsyncStoreHttp(connect_timeout=0.5, read_timeout=0.5)
    url = f"http://127.0.0.1:{server.port}/bucket/key?X-Amz-Signature=0"

    async def twice() -> None:
        assert await http.put(url, b"first") == (200, b"")
        await http.put(url, b"second", retry=False)

    try:
        started = time.monotonic()
        with pytest.raises(StoreError, match="did not answer"):
            asyncio.run(twice())
        assert time.monotonic() - started < 5
        assert server.requests == 2
    finally:
        server.close()


def test_writes_stay_in_threads_where_a_presigned_puts_checksum_is_not_checked(
    seaweed: SeaweedFS, bucket_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start-up's probe sends a wrong CRC-32C, then a right one: a store that takes both
    (here: the wrong one never sent, as if the store had ignored it) gets no loop writes."""
    real = s3_module.crc32c_header
    monkeypatch.setattr(s3_module, "crc32c_header", lambda data: real(b"query checksum probe"))
    store = _store(seaweed, bucket_name)
    store.ensure_bucket()
    assert store.checksums and not store.writes_now()
    assert [info.key for info in store.list("probes/")] == []  # the probe left nothing
