"""tus header parsing (gateway.tus._protocol): hand-written vectors, no server."""

from __future__ import annotations

import base64
import hashlib
import zlib

import pytest

from gateway.core._errors import BadRequest
from gateway.tus._protocol import CHECKSUM_ALGORITHMS, MAX_PARTS, parse_checksum, parse_concat

ID = "0123456789abcdef0123456789abcdef"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_checksum_vectors() -> None:
    data = b"hello tus"
    assert CHECKSUM_ALGORITHMS.split(",") == ["sha1", "md5", "crc32", "sha256"]
    for name in ("sha1", "md5", "sha256"):
        expected = hashlib.new(name, data).digest()
        checksum = parse_checksum(f"{name.upper()} {_b64(expected)}")
        assert checksum is not None and checksum.algorithm == name
        hasher = checksum.new()
        hasher.update(data[:3])
        hasher.update(data[3:])
        assert hasher.digest() == expected == checksum.digest
    crc = parse_checksum("crc32 " + _b64(zlib.crc32(data).to_bytes(4, "big")))
    assert crc is not None
    hasher = crc.new()
    hasher.update(data)
    assert hasher.digest() == crc.digest
    assert parse_checksum(None) is None


@pytest.mark.parametrize(
    "header",
    [
        "sha512 " + _b64(bytes(64)),  # not offered
        "sha1 " + _b64(bytes(16)),  # wrong size
        "crc32 " + _b64(bytes(3)),
        "md5 not*base64",
        "sha1",
        "",
    ],
)
def test_bad_checksums_are_400(header: str) -> None:
    with pytest.raises(BadRequest):
        parse_checksum(header)


def test_concat_vectors() -> None:
    partial = parse_concat("partial")
    assert partial is not None and partial.partial
    final = parse_concat(f"final;http://gw.example/base/uploads/{ID} /uploads/{ID[::-1]}")
    assert final is not None and not final.partial
    assert final.parts == (ID, ID[::-1])
    assert parse_concat(None) is None


@pytest.mark.parametrize(
    "header",
    [
        "Partial",
        "final;",
        "final",
        f"final;/uploads/{ID} /uploads/{ID}",  # twice
        f"final;/msg/{ID}",
        "final;/uploads/../ids/x",
        f"final;/uploads/{ID.upper()}",
        "final;" + " ".join(f"/uploads/{i:032x}" for i in range(MAX_PARTS + 1)),
    ],
)
def test_bad_concat_is_400(header: str) -> None:
    with pytest.raises(BadRequest):
        parse_concat(header)
