"""tus extensions browser clients use, the checksums tus clients send, CORS and the sweeper.

All through a running gateway on SeaweedFS with httpx and mosquitto_sub as the peers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
import zlib
from collections.abc import Callable

import httpx
import pytest
import requests
from test_ingest_requests import _as, two_users
from test_resumable import TUS, Sub, _meta, create, head_offset, patch

__all__ = ["two_users"]  # a fixture, shared with the ownership tests of plain uploads

from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

KiB = 1024


def _digest(algorithm: str, data: bytes) -> str:
    if algorithm == "crc32":
        raw = zlib.crc32(data).to_bytes(4, "big")
    else:
        raw = hashlib.new(algorithm, data).digest()
    return f"{algorithm} {base64.b64encode(raw).decode()}"


def _uploads_objects(gw: GatewayServer) -> list[str]:
    from gateway._app import build_store

    return sorted(o.key for o in build_store(gw.settings).list("uploads/"))


def _id(location: str) -> str:
    return location.rsplit("/", 1)[-1]


@pytest.fixture
def gw(gateway_factory: Callable[..., GatewayServer], broker: Mosquitto) -> GatewayServer:
    return gateway_factory(broker, allow_anonymous=True)


@pytest.mark.parametrize("algorithm", ["sha1", "md5", "crc32", "sha256"])
def test_every_advertised_checksum_is_checked(
    gw: GatewayServer, unique_topic: Callable[[str], str], algorithm: str
) -> None:
    payload = os.urandom(200 * KiB)
    first, rest = payload[: 64 * KiB], payload[64 * KiB :]
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        offered = http.options("/uploads/").headers["tus-checksum-algorithm"].split(",")
        assert algorithm in offered
        loc = create(http, len(payload), topic=unique_topic("sum"))
        assert patch(http, loc, 0, first, _digest(algorithm, first)).status_code == 204
        bad = bytearray(rest)
        bad[7] ^= 1
        r = patch(http, loc, len(first), bytes(bad), _digest(algorithm, rest))
        assert r.status_code == 460, r.text
        assert algorithm in r.json()["detail"]
        assert head_offset(http, loc) == len(first)
        r = patch(http, loc, len(first), rest, _digest(algorithm, rest))
        assert r.status_code == 204, r.text
        assert r.headers["x-offload-sha256"] == hashlib.sha256(payload).hexdigest()
        assert http.get(r.headers["x-offload-url"] + "/payload").content == payload


def test_creation_with_upload_completes_in_one_request(
    gw: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("cwu")
    payload = os.urandom(100 * KiB)
    sub = Sub(broker, topic)
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        headers = {**TUS, "Upload-Length": str(len(payload)),
                   "Upload-Metadata": _meta(topic=topic, filename="one.bin"),
                   "Content-Type": "application/offset+octet-stream",
                   "Upload-Checksum": _digest("sha1", payload)}  # fmt: skip
        r = http.post("/uploads/", content=payload, headers=headers)
        assert r.status_code == 201, r.text
        assert r.headers["upload-offset"] == str(len(payload))
        assert r.headers["x-offload-sha256"] == hashlib.sha256(payload).hexdigest()
        url = r.headers["x-offload-url"]
        assert http.get(url + "/payload").content == payload
        assert _uploads_objects(gw) == [f"uploads/{_id(r.headers['location'])}.json"]
    placeholder = json.loads(str(sub.message()["payload"]))
    assert placeholder["url"] == url


def test_creation_with_upload_partial_body_and_bad_checksum(
    gw: GatewayServer, unique_topic: Callable[[str], str]
) -> None:
    payload = os.urandom(50 * KiB)
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        base = {**TUS, "Upload-Length": str(len(payload)),
                "Upload-Metadata": _meta(topic=unique_topic("cwu")),
                "Content-Type": "application/offset+octet-stream"}  # fmt: skip
        # A corrupted first segment: 460, but the upload exists and its Location is given.
        bad = http.post("/uploads/", content=b"x" * 10,
                        headers={**base, "Upload-Checksum": _digest("md5", b"y" * 10)})  # fmt: skip
        assert bad.status_code == 460, bad.text
        assert head_offset(http, bad.headers["location"]) == 0
        # The first part in the POST, the rest by PATCH.
        r = http.post("/uploads/", content=payload[:1000], headers=base)
        assert r.status_code == 201 and r.headers["upload-offset"] == "1000"
        assert "x-offload-url" not in r.headers
        done = patch(http, r.headers["location"], 1000, payload[1000:])
        assert http.get(done.headers["x-offload-url"] + "/payload").content == payload
        # Data without the tus media type is refused before anything is stored.
        plain = http.post("/uploads/", content=b"abc",
                          headers={**base, "Content-Type": "text/plain"})  # fmt: skip
        assert plain.status_code == 415
        too_long = http.post("/uploads/", content=b"z" * (len(payload) + 1), headers=base)
        assert too_long.status_code == 413


def _partial(http: httpx.Client, topic: str, data: bytes, algorithm: str) -> str:
    """A complete partial upload: half in the POST, half by PATCH, both checksummed."""
    half = len(data) // 2
    r = http.post("/uploads/", content=data[:half], headers={
        **TUS, "Upload-Concat": "partial", "Upload-Length": str(len(data)),
        "Upload-Metadata": _meta(topic=topic),
        "Content-Type": "application/offset+octet-stream",
        "Upload-Checksum": _digest(algorithm, data[:half])})  # fmt: skip
    assert r.status_code == 201, r.text
    assert r.headers["upload-concat"] == "partial"
    loc = r.headers["location"]
    done = patch(http, loc, half, data[half:], _digest(algorithm, data[half:]))
    assert done.status_code == 204, done.text
    assert "x-offload-url" not in done.headers  # a part is never published by itself
    return loc


def test_concatenation_publishes_once_and_removes_the_parts(
    gw: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("concat")
    pieces = [os.urandom(70 * KiB), os.urandom(1), os.urandom(33 * KiB)]
    payload = b"".join(pieces)
    sub = Sub(broker, topic)
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        algorithms = ["sha1", "md5", "crc32"]
        parts = [_partial(http, topic, p, a) for p, a in zip(pieces, algorithms, strict=True)]
        assert len([k for k in _uploads_objects(gw) if "/uploads/" not in k]) >= 3
        final = http.post("/uploads/", headers={
            **TUS, "Upload-Concat": "final;" + " ".join(f"{gw.url}{p}" for p in parts),
            "Upload-Metadata": _meta(topic=topic, filename="joined.bin")})  # fmt: skip
        assert final.status_code == 201, final.text
        assert final.headers["upload-length"] == str(len(payload))
        assert final.headers["x-offload-sha256"] == hashlib.sha256(payload).hexdigest()
        url = final.headers["x-offload-url"]
        fetched = http.get(url + "/payload")
        assert fetched.content == payload
        assert "joined.bin" in fetched.headers["content-disposition"]
        for p in parts:  # the parts, state and segments, are gone
            assert http.head(p, headers=TUS).status_code == 404
        assert _uploads_objects(gw) == [f"uploads/{_id(final.headers['location'])}.json"]
        head = http.head(final.headers["location"], headers=TUS)
        assert head.headers["x-offload-url"] == url
        assert head.headers["upload-concat"].startswith("final;/uploads/")
    placeholder = json.loads(str(sub.message()["payload"]))
    assert placeholder["url"] == url and placeholder["size"] == len(payload)


def test_concatenation_refuses_what_it_cannot_join(
    gw: GatewayServer, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("concat")
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        whole = _partial(http, topic, b"abcdef", "sha1")
        unfinished = http.post("/uploads/", headers={
            **TUS, "Upload-Concat": "partial", "Upload-Length": "10",
            "Upload-Metadata": _meta(topic=topic)})  # fmt: skip
        single = create(http, 3, topic=topic)
        other_topic = _partial(http, unique_topic("other"), b"xy", "sha1")

        def final(*urls: str, **extra: str) -> httpx.Response:
            return http.post("/uploads/", headers={**TUS, **extra,
                             "Upload-Concat": "final;" + " ".join(urls),
                             "Upload-Metadata": _meta(topic=topic)})  # fmt: skip

        cases = {
            "not complete": final(whole, unfinished.headers["location"]),
            "not a partial": final(whole, single),
            "another topic": final(whole, other_topic),
            "twice": final(whole, whole),
            "no partial upload": final(whole, "/uploads/" + "0" * 32),
            "not an upload URL": final("/msg/" + "0" * 32),
            "Upload-Length": final(whole, **{"Upload-Length": "6"}),
        }
        for reason, r in cases.items():
            assert r.status_code == 400, (reason, r.text)
            assert reason in r.json()["detail"], (reason, r.text)
        assert http.post("/uploads/", headers={**TUS, "Upload-Concat": "nope",
                         "Upload-Length": "1", "Upload-Metadata": _meta(topic=topic)}
                         ).status_code == 400  # fmt: skip
        # Nothing was consumed by the refusals: the good part still joins.
        ok = final(whole)
        assert ok.status_code == 201, ok.text
        assert http.get(ok.headers["x-offload-url"] + "/payload").content == b"abcdef"
        # A final upload takes no data of its own.
        r = patch(http, ok.headers["location"], 6, b"more")
        assert r.status_code == 403, r.text


def test_running_gateway_sweeps_abandoned_uploads(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    unique_topic: Callable[[str], str],
) -> None:
    """OFFLOAD_UPLOAD_EXPIRY=2, OFFLOAD_SWEEP_INTERVAL=1: nothing calls the cleanup but the
    gateway's own sweeper; abandoned uploads, partial ones included, disappear with their
    staged segments while a finished message stays."""
    gw = gateway_factory(broker, allow_anonymous=True, upload_expiry=2, sweep_interval=1.0)
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        abandoned = create(http, 1000, topic=unique_topic("sweep"))
        assert patch(http, abandoned, 0, b"a" * 400).status_code == 204
        part = _partial(http, unique_topic("sweep"), b"b" * 300, "sha1")
        finished = create(http, 3, topic=unique_topic("sweep"))
        url = patch(http, finished, 0, b"abc").headers["x-offload-url"]
        staged = _uploads_objects(gw)
        for loc in (abandoned, part):
            assert any(k.startswith(f"uploads/{_id(loc)}/") for k in staged), staged
        deadline = time.monotonic() + 40
        while _uploads_objects(gw):
            assert time.monotonic() < deadline, _uploads_objects(gw)
            time.sleep(0.5)
        assert http.head(abandoned, headers=TUS).status_code == 404
        assert http.get(url + "/payload").content == b"abc"


ORIGIN = "http://127.0.0.1:8765"


@pytest.fixture
def cors_gw(gateway_factory: Callable[..., GatewayServer], broker: Mosquitto) -> GatewayServer:
    return gateway_factory(
        broker, allow_anonymous=True, cors_origins=f" {ORIGIN}/ , https://uploads.example"
    )


def _cors_headers(r: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in r.headers.items() if k.lower().startswith("access-control-")}


def test_cors_preflights_and_exposes_tus_headers(
    cors_gw: GatewayServer, unique_topic: Callable[[str], str]
) -> None:
    with httpx.Client(base_url=cors_gw.url, timeout=30) as http:
        pre = http.options("/uploads/", headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers":
                "tus-resumable,upload-length,upload-metadata,upload-concat,content-type,"
                "upload-checksum"})  # fmt: skip
        assert pre.status_code == 200, pre.text
        assert pre.headers["access-control-allow-origin"] == ORIGIN
        for method in ("POST", "PATCH", "HEAD", "DELETE"):
            assert method in pre.headers["access-control-allow-methods"]
        loc = create(http, 3, topic=unique_topic("cors"))
        pre = http.options(loc, headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "PATCH",
            "Access-Control-Request-Headers": "tus-resumable,upload-offset,content-type,"
                                              "authorization"})  # fmt: skip
        assert pre.status_code == 200, pre.text
        r = http.patch(loc, content=b"abc", headers={
            **TUS, "Origin": ORIGIN, "Upload-Offset": "0",
            "Content-Type": "application/offset+octet-stream"})  # fmt: skip
        assert r.status_code == 204
        assert r.headers["access-control-allow-origin"] == ORIGIN
        exposed = {h.strip().lower() for h in r.headers["access-control-expose-headers"].split(",")}
        assert {"location", "upload-offset", "upload-length", "tus-resumable", "upload-expires",
                "x-offload-id", "x-offload-url", "x-offload-sha256"} <= exposed  # fmt: skip
        # Errors carry CORS too, so a page can read why.
        err = http.post("/uploads/", headers={"Origin": ORIGIN, "Upload-Length": "1"})
        assert err.status_code == 412 and err.headers["access-control-allow-origin"] == ORIGIN
        # The tus capabilities request (OPTIONS without a preflight header) is still tus's.
        caps = http.options("/uploads/", headers={"Origin": ORIGIN})
        assert caps.status_code == 204 and caps.headers["tus-version"] == "1.0.0"


def test_cors_gives_nothing_to_an_unlisted_origin(
    cors_gw: GatewayServer,
    gw: GatewayServer,
    unique_topic: Callable[[str], str],
) -> None:
    for base, origin in ((cors_gw.url, "http://127.0.0.1:9999"), (gw.url, ORIGIN)):
        with httpx.Client(base_url=base, timeout=30) as http:
            pre = http.options("/uploads/", headers={
                "Origin": origin, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "tus-resumable,upload-length"})  # fmt: skip
            assert _cors_headers(pre) == {}, (base, pre.headers)
            r = http.post("/uploads/", headers={**TUS, "Origin": origin, "Upload-Length": "1",
                          "Upload-Metadata": _meta(topic=unique_topic("cors"))})  # fmt: skip
            assert r.status_code == 201
            assert _cors_headers(r) == {}, (base, r.headers)


def test_cors_origins_are_validated() -> None:
    from pydantic import ValidationError

    from gateway import Settings

    for bad in ("127.0.0.1:80", "http://a.example/path", "ftp://a.example", "http://u@a.example"):
        with pytest.raises(ValidationError):
            Settings(cors_origins=bad)


def test_a_final_upload_joins_only_its_owners_parts(two_users: GatewayServer) -> None:
    """Bob may write the topic, but Alice's partial upload does not exist for him."""
    gw = two_users
    alice, bob = _as("alice"), _as("bob")

    def part(session: requests.Session, data: bytes) -> str:
        r = session.post(f"{gw.url}/uploads/", data=data, headers={
            **TUS, "Upload-Concat": "partial", "Upload-Length": str(len(data)),
            "Upload-Metadata": _meta(topic="shared/joined"),
            "Content-Type": "application/offset+octet-stream"})  # fmt: skip
        assert r.status_code == 201, r.text
        return gw.url + r.headers["location"]

    def final(session: requests.Session, *parts: str) -> requests.Response:
        return session.post(f"{gw.url}/uploads/", headers={
            **TUS, "Upload-Concat": "final;" + " ".join(parts),
            "Upload-Metadata": _meta(topic="shared/joined")})  # fmt: skip

    alices, bobs = part(alice, b"alice's"), part(bob, b"bob's")
    stolen = final(bob, bobs, alices)
    assert stolen.status_code == 400 and "no partial upload" in stolen.json()["detail"]
    assert alice.head(alices, headers=TUS).headers["upload-offset"] == "7"  # untouched
    mine = final(alice, alices)
    assert mine.status_code == 201, mine.text
    assert alice.get(mine.headers["x-offload-url"] + "/payload").content == b"alice's"
    assert final(bob, bobs).status_code == 201
