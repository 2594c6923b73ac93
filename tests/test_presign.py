"""Presigned payload URLs on a gateway that requires credentials (broker password/ACL files)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import bson
import httpx
import pytest

from _gateway import GatewayServer

pytestmark = pytest.mark.servers

ACL = "user writer\ntopic readwrite cams/#\nuser outsider\ntopic read other/#\n"
WRITER = ("writer", "w-secret")
OUTSIDER = ("outsider", "o-secret")


@pytest.fixture
def auth_files() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="offload-presign-"))
    passwd = path / "passwd"
    for i, (user, password) in enumerate((WRITER, OUTSIDER)):
        args = ["mosquitto_passwd", "-b", "-H", "sha512-pbkdf2", "-I", "1000"]
        if i == 0:
            args.insert(1, "-c")
        subprocess.run([*args, str(passwd), user, password], check=True, capture_output=True)
    (path / "acl").write_text(ACL)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def secured(
    auth_files: Path, gateway_factory: Callable[..., GatewayServer]
) -> Callable[..., GatewayServer]:
    def start(secret: str = "replicas-share-this") -> GatewayServer:
        # tls=True: clients reach the gateway through an HTTPS proxy, so Basic is accepted.
        return gateway_factory(
            None,
            password_file=auth_files / "passwd",
            acl_file=auth_files / "acl",
            tls=True,
            auth_secret=secret,
        )

    return start


def _store_message(gw: GatewayServer, payload: bytes) -> str:
    msg_id = uuid.uuid4()
    doc = bson.encode({"message": bson.Binary(payload),
                       "headers": [["_id", bson.Binary(msg_id.bytes)]]})  # fmt: skip
    r = httpx.post(f"{gw.url}/topic/cams/1+oversized", content=doc, auth=WRITER)
    assert r.status_code == 201, r.text
    return str(msg_id)


def _with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    query.update(changes)
    return parts._replace(query=urlencode(query)).geturl()


def test_presigned_url_works_anonymously_and_only_as_issued(
    secured: Callable[..., GatewayServer],
) -> None:
    gw = secured()
    payload = bytes(range(256)) * 100
    msg_id = _store_message(gw, payload)
    assert httpx.get(f"{gw.url}/msg/{msg_id}/payload").status_code == 401  # credentials needed
    # Signing needs read access to the topic.
    assert httpx.post(f"{gw.url}/msg/{msg_id}/presign", auth=OUTSIDER).status_code == 403
    r = httpx.post(f"{gw.url}/msg/{msg_id}/presign?ttl=60", auth=WRITER)
    assert r.status_code == 200, r.text
    url = r.json()["url"]
    assert url.startswith(f"{gw.url}/msg/{msg_id}/payload?")
    assert time.time() + 50 < r.json()["expires"] <= time.time() + 61

    anonymous = httpx.get(url)
    assert anonymous.status_code == 200
    assert anonymous.content == payload
    ranged = httpx.get(url, headers={"Range": "bytes=10-19"})
    assert ranged.status_code == 206 and ranged.content == payload[10:20]
    assert httpx.head(url).status_code == 200

    expires = parse_qs(urlsplit(url).query)["expires"][0]
    sig = parse_qs(urlsplit(url).query)["sig"][0]
    other_id = _store_message(gw, b"other")
    altered = [
        _with_query(url, expires=str(int(expires) + 3600)),  # longer life
        _with_query(url, sig=sig[:-2] + ("AA" if sig[-2:] != "AA" else "BB")),
        url.replace(msg_id, other_id),  # another message with this signature
        url.replace("/payload?", "?"),  # the BSON document is not what was signed
        _with_query(url, sig=""),
    ]
    for bad in altered:
        assert httpx.get(bad).status_code == 403, bad


def test_presigned_url_expires_and_needs_the_shared_secret(
    secured: Callable[..., GatewayServer],
) -> None:
    gw = secured()
    msg_id = _store_message(gw, b"short-lived")
    url = httpx.post(f"{gw.url}/msg/{msg_id}/presign?ttl=1", auth=WRITER).json()["url"]
    long_url = httpx.post(f"{gw.url}/msg/{msg_id}/presign?ttl=600", auth=WRITER).json()["url"]
    replica = secured()  # same bucket and secret: another replica behind the balancer
    assert httpx.get(long_url.replace(gw.url, replica.url)).content == b"short-lived"
    stranger = secured(secret="some-other-secret")
    assert httpx.get(long_url.replace(gw.url, stranger.url)).status_code == 403
    time.sleep(2.1)
    assert httpx.get(url).status_code == 403


def test_malformed_presign_parameters_are_403_with_a_reason(
    secured: Callable[..., GatewayServer],
) -> None:
    gw = secured()
    msg_id = _store_message(gw, b"x")
    url = httpx.post(f"{gw.url}/msg/{msg_id}/presign?ttl=600", auth=WRITER).json()["url"]
    expires = parse_qs(urlsplit(url).query)["expires"][0]
    sig = parse_qs(urlsplit(url).query)["sig"][0]
    cases = {
        # Unicode digits: str.isdigit() and int() accept them.
        _with_query(url, expires="²"): "ASCII digits",
        _with_query(url, expires=expires[:-1] + "²"): "ASCII digits",
        _with_query(url, expires="١٢٣٤٥٦٧٨٩٠١"): "ASCII digits",
        _with_query(url, expires="9" * 400): "ASCII digits",
        _with_query(url, expires="-1"): "ASCII digits",
        _with_query(url, expires=" " + expires): "ASCII digits",
        _with_query(url, sig="é" * 43): "malformed",
        _with_query(url, sig=sig[:-1] + "é"): "malformed",
        _with_query(url, sig=sig + "="): "malformed",
        _with_query(url, sig=sig[:-1]): "malformed",
        _with_query(url, sig="\x00" * 43): "malformed",
        url + f"&sig={sig}": "once each",
        _with_query(url, expires="1"): "expired",
    }
    for bad, reason in cases.items():
        for method in (httpx.get, httpx.head):
            r = method(bad)
            assert r.status_code == 403, (bad, r.status_code, r.text)
            if method is httpx.get:
                assert reason in r.json()["detail"], (bad, r.text)
    # Signed URLs grant reads only.
    r = httpx.post(url.replace("/payload?", "/presign?"))
    assert r.status_code == 403 and "GET and HEAD" in r.json()["detail"]
    assert httpx.get(url).content == b"x"
