"""The discovery record's `DirectStore`: old and new readers and writers get along. Pure."""

from __future__ import annotations

import json

import pytest

from client.protocol import DiscoveryRecord
from discovery import DiscoveryRecord as Advertised


def test_a_record_advertising_direct_transfers_round_trips() -> None:
    record = Advertised(
        "https://offload.example.com", max_upload_bytes=5, direct_store="https://S3.example.com"
    )
    doc = json.loads(record.to_json())
    assert doc["DirectStore"] == "https://s3.example.com:443"
    assert DiscoveryRecord.from_json(record.to_json()) == record


def test_old_records_and_unknown_keys_are_read() -> None:
    old = DiscoveryRecord.from_json(b'{"LargeMessageUploadEndpoint": "http://gw:8000"}')
    assert old.direct_store is None
    assert b"DirectStore" not in old.to_json()  # old readers see exactly what they knew
    newer = DiscoveryRecord.from_json(
        json.dumps(
            {
                "LargeMessageUploadEndpoint": "http://gw:8000",
                "DirectStore": "http://127.0.0.1:8333",
                "SomethingFromTheFuture": {"nested": [1, 2]},
            }
        )
    )
    assert newer.direct_store == "http://127.0.0.1:8333"


@pytest.mark.parametrize(
    "value",
    ["ftp://s3.example.com", "http://user:pw@s3.example.com", "not a url", 42, None, ["x"]],
)
def test_a_bad_direct_store_is_dropped_not_fatal(value: object) -> None:
    raw = {"LargeMessageUploadEndpoint": "http://gw:8000", "DirectStore": value}
    record = DiscoveryRecord.from_json(json.dumps(raw))
    assert record.endpoint == "http://gw:8000"
    assert record.direct_store is None
