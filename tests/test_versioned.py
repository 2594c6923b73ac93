"""Versioned writes (`ObjectStore.write_versioned`) against real SeaweedFS and the file store:
the compare-and-swap the retention state (gateway/retention) is built on."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

from gateway.storage import FileStore, ObjectStore, S3Store

from _servers import SeaweedFS

pytestmark = pytest.mark.servers


@pytest.fixture(params=["s3", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "file":
        return FileStore(tmp_path / "store")
    seaweed: SeaweedFS = request.getfixturevalue("seaweed")
    bucket: str = request.getfixturevalue("bucket_name")
    s3 = S3Store(
        seaweed.endpoint, bucket, access_key=seaweed.access_key, secret_key=seaweed.secret_key
    )
    s3.ensure_bucket()
    return s3


def test_create_replace_and_stale_versions(store: ObjectStore) -> None:
    key = f"state/{uuid.uuid4().hex}.json"
    assert store.read_versioned(key) is None
    assert store.write_versioned(key, b"x", version="0" * 32) is None  # nothing to replace
    first = store.write_versioned(key, b'{"n":1}', version=None)
    assert first is not None
    assert store.write_versioned(key, b'{"n":9}', version=None) is None  # exists: no create
    read = store.read_versioned(key)
    assert read is not None and read.data == b'{"n":1}' and read.version == first
    second = store.write_versioned(key, b'{"n":2}', version=first)
    assert second is not None and second != first
    assert store.write_versioned(key, b'{"n":3}', version=first) is None  # stale
    read = store.read_versioned(key)
    assert read is not None and read.data == b'{"n":2}' and read.version == second
    assert [info.key for info in store.list("state/")] == [key]  # no lock file listed


def test_of_writers_racing_from_one_version_exactly_one_wins(store: ObjectStore) -> None:
    """Eight threads replace one object from the version they all read: one write holds,
    and the object is that writer's bytes (ten rounds)."""
    for round_ in range(10):
        key = f"race/{uuid.uuid4().hex}"
        base = store.write_versioned(key, b"base", version=None)
        assert base is not None
        wins: list[int] = []
        start = threading.Barrier(8)

        def write(
            i: int,
            key: str = key,
            base: str = base,
            start: threading.Barrier = start,
            wins: list[int] = wins,
        ) -> None:
            start.wait()
            if store.write_versioned(key, f"writer {i}".encode(), version=base) is not None:
                wins.append(i)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(wins) == 1, (round_, wins)
        read = store.read_versioned(key)
        assert read is not None and read.data == f"writer {wins[0]}".encode()
