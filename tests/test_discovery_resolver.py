"""The client's discovery cache: latest record, expiry, and what counts as no endpoint."""

from __future__ import annotations

import json

import pytest

from discovery import EndpointCache

RECORD = json.dumps({"LargeMessageUploadEndpoint": "https://gw.example:8443/"}).encode()


def test_record_is_cached_until_its_remaining_expiry() -> None:
    cache = EndpointCache()
    record = cache.feed(RECORD, expiry_interval=30, now=100.0)
    assert record is not None and record.endpoint == "https://gw.example:8443"
    assert cache.current(129.9) == record
    assert cache.current(130.0) is None


def test_record_without_expiry_stays() -> None:
    cache = EndpointCache()
    cache.feed(RECORD, expiry_interval=None, now=0.0)
    assert cache.current(1e9) is not None


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"not json",
        b"[]",
        b'{"LargeMessageUploadEndpoint": 5}',
        b'{"LargeMessageUploadEndpoint": "ftp://x"}',
        b'{"other": "http://x"}',
    ],
)
def test_empty_or_malformed_payload_removes_the_endpoint(payload: bytes) -> None:
    cache = EndpointCache()
    cache.feed(RECORD, expiry_interval=None, now=0.0)
    assert cache.feed(payload, expiry_interval=None, now=1.0) is None
    assert cache.current(1.0) is None
    assert (cache.last_error is None) == (payload == b"")
    assert cache.updates == 2


def test_newer_record_replaces_older() -> None:
    cache = EndpointCache()
    cache.feed(RECORD, expiry_interval=5, now=0.0)
    newer = json.dumps({"LargeMessageUploadEndpoint": "http://other:1"}).encode()
    cache.feed(newer, expiry_interval=60, now=4.0)
    current = cache.current(30.0)
    assert current is not None and current.endpoint == "http://other:1"


def test_zero_remaining_expiry_is_already_expired() -> None:
    cache = EndpointCache()
    assert cache.feed(RECORD, expiry_interval=0, now=10.0) is None
    assert cache.current(10.0) is None
