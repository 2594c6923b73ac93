"""Client mistakes are 4xx with a reason, and downloads cannot act as pages of our origin.

Real gateway on SeaweedFS or the file store, real mosquitto, httpx and curl.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import bson
import httpx
import pytest
import requests
from hop.auth import Auth
from hop.http_scram import SCRAMAuth
from scramp import ScramClient

from _auth import broker_readable_dir, secured_pair, write_acl_file, write_password_file
from _gateway import GatewayServer
from _hostile import RawRequest
from _servers import Mosquitto

pytestmark = pytest.mark.servers

TUS = {"Tus-Resumable": "1.0.0"}
UNICODE_DIGITS = ("²", "١٢", "\uff11", "٣", "12²")  # superscript, Arabic-Indic, fullwidth


def _meta(**items: str) -> str:
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" for k, v in items.items())


@pytest.fixture
def gw(gateway_factory: Callable[..., GatewayServer], broker: Mosquitto) -> GatewayServer:
    return gateway_factory(broker)


@pytest.fixture
def file_gw(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto, tmp_path: Path
) -> GatewayServer:
    return gateway_factory(broker, storage_url=f"file://{tmp_path}/store")


# -- downloads -------------------------------------------------------------------------------

SCRIPT = b"<html><body><script>document.title='pwned'</script></body></html>"


@pytest.mark.parametrize(
    ("content_type", "attachment"),
    [
        ("text/html", True),
        ("text/html; charset=utf-8", True),
        ("image/svg+xml", True),
        ("application/xml", True),
        ("text/javascript", True),
        ("application/pdf", True),
        ("image/png", False),
        ("text/plain", False),
        ("application/octet-stream", False),
    ],
)
def test_payloads_are_served_inert(gw: GatewayServer, content_type: str, attachment: bool) -> None:
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        r = http.post("/publish/dl/inert", content=SCRIPT, headers={"Content-Type": content_type})
        assert r.status_code == 201, r.text
        for method in ("GET", "HEAD"):
            got = http.request(method, f"/msg/{r.json()['id']}/payload")
            assert got.status_code == 200
            assert got.headers["x-content-type-options"] == "nosniff"
            assert got.headers["content-security-policy"] == "sandbox; default-src 'none'"
            # The uploader's type, kept (Starlette adds a charset to text/* without one).
            assert got.headers["content-type"].startswith(content_type)
            disposition = got.headers.get("content-disposition", "")
            assert disposition.startswith("attachment") is attachment
        bson_doc = http.get(f"/msg/{r.json()['id']}")
        assert bson_doc.headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in bson_doc.headers["content-security-policy"]


def test_html_through_a_presigned_link_is_inert_too(gw: GatewayServer) -> None:
    """curl follows the credential-free link a victim would be sent."""
    r = httpx.post(f"{gw.url}/publish/dl/link", content=SCRIPT,
                   headers={"Content-Type": "text/html"})  # fmt: skip
    link = httpx.post(f"{gw.url}/msg/{r.json()['id']}/presign").json()["url"]
    out = subprocess.run(["curl", "-sS", "-D", "-", "-o", "/dev/null", link],
                         capture_output=True, check=True, timeout=30)  # fmt: skip
    headers = out.stdout.decode().lower()
    assert "x-content-type-options: nosniff" in headers
    assert "content-security-policy: sandbox; default-src 'none'" in headers
    assert "content-disposition: attachment" in headers


@pytest.mark.parametrize(
    "content_type",
    ["text/html\tx", "nonsense", "text/", "/plain", "text/plain; charset", "a/b; x=\"unterminated",
     "text/plain; x=\u00e9", "a/" + "b" * 300],
)  # fmt: skip
def test_malformed_content_types_are_refused_on_every_upload_path(
    gw: GatewayServer, content_type: str
) -> None:
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        r = http.post("/publish/ct/bad", content=b"x",
                      headers={"Content-Type": content_type.encode("utf-8")})  # fmt: skip
        assert r.status_code == 400, r.text
        r = http.post("/uploads/", headers={**TUS, "Upload-Length": "1",
            "Upload-Metadata": _meta(topic="ct/bad", content_type=content_type)})  # fmt: skip
        assert r.status_code == 400, r.text
        assert "content_type" in r.json()["detail"]


def test_valid_content_types_with_parameters_pass(gw: GatewayServer) -> None:
    value = 'multipart/mixed; boundary="a b"; charset=utf-8'
    r = httpx.post(f"{gw.url}/publish/ct/good", content=b"x", headers={"Content-Type": value})
    assert r.status_code == 201, r.text
    got = httpx.get(f"{gw.url}/msg/{r.json()['id']}/payload")
    assert got.headers["content-type"] == value


# -- numbers and topics -----------------------------------------------------------------------


@pytest.mark.parametrize("digits", UNICODE_DIGITS)
def test_unicode_digits_are_400(gw: GatewayServer, digits: str) -> None:
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        r = http.post("/uploads/", headers={**TUS, "Upload-Length": digits.encode(),
                      "Upload-Metadata": _meta(topic="n/digits")})  # fmt: skip
        assert r.status_code == 400, r.text
        assert "ASCII digits" in r.json()["detail"]
        r = http.post("/uploads/", headers={**TUS, "Upload-Length": "4",
                      "Upload-Metadata": _meta(topic="n/digits")})  # fmt: skip
        location = r.headers["location"]
        r = http.patch(location, content=b"abcd", headers={**TUS,
                       "Upload-Offset": digits.encode(),
                       "Content-Type": "application/offset+octet-stream"})  # fmt: skip
        assert r.status_code == 400, r.text
        assert "ASCII digits" in r.json()["detail"]
        assert r.headers["tus-resumable"] == "1.0.0"
        for name in ("qos", "expiry"):
            r = http.post("/publish/n/digits", params={name: digits}, content=b"x")
            assert r.status_code == 400, r.text
            r = http.post("/publish/n/digits", headers={f"X-Offload-{name}": digits.encode()},
                          content=b"x")  # fmt: skip
            assert r.status_code == 400, r.text
        r = http.post("/uploads/", headers={**TUS, "Upload-Length": "1",
                      "Upload-Metadata": _meta(topic="n/digits", qos=digits)})  # fmt: skip
        assert r.status_code == 400, r.text


@pytest.mark.parametrize("level", ["x" * 256, "é" * 86, "%" * 100])
def test_a_topic_level_too_long_for_a_file_name_is_400_on_the_file_store(
    file_gw: GatewayServer, level: str
) -> None:
    topic = f"long/{level}/end"
    doc = bson.encode({"message": b"x", "headers": [["_id", uuid.uuid4().bytes]]})
    with httpx.Client(base_url=file_gw.url, timeout=30) as http:
        answers = [
            http.post(f"/publish/{topic}", content=b"payload"),
            http.post(f"/topic/{topic}+oversized", content=doc),
            http.post("/uploads/", headers={**TUS, "Upload-Length": "1",
                                            "Upload-Metadata": _meta(topic=topic)}),
        ]  # fmt: skip
        for r in answers:
            assert r.status_code == 400, r.text
            assert "level 2" in r.json()["detail"] and "255" in r.json()["detail"]
        ok = http.post(f"/publish/long/{'x' * 255}/end", content=b"payload")
        assert ok.status_code == 201, ok.text
        assert http.get(f"/msg/{ok.json()['id']}/payload").content == b"payload"


# -- resumable uploads belong to their creator -----------------------------------------------

USERS = {"alice": "a-secret-1", "bob": "b-secret-2"}
ACL = """\
user alice
topic readwrite shared/#
user bob
topic readwrite shared/#
user gateway
topic readwrite sys/metadata
topic readwrite shared/#
"""


@pytest.fixture
def two_users(
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
) -> Iterator[GatewayServer]:
    files = broker_readable_dir("offload-owner-")
    entries = [(u, p, 4096) for u, p in {**USERS, "gateway": "g-secret-3"}.items()]
    write_password_file(files / "passwd", entries)
    write_acl_file(files / "acl", ACL)
    _, gw = secured_pair(files, mosquitto_factory, gateway_factory, gateway_password="g-secret-3")
    yield gw
    shutil.rmtree(files, ignore_errors=True)


def _as(user: str) -> requests.Session:
    session = requests.Session()
    session.auth = SCRAMAuth(Auth(user, USERS[user], method="SCRAM-SHA-512"), shortcut=True)
    return session


def _scram_authorization(url: str, user: str) -> str:
    """An Authorization header for one request of `user`'s, the SCRAM exchange done by hand
    (so the request itself can go over a bare socket)."""
    client = ScramClient(["SCRAM-SHA-512"], user, USERS[user])
    first = base64.b64encode(client.get_client_first().encode()).decode()
    r = requests.head(url, headers={**TUS, "Authorization": f"SCRAM-SHA-512 data={first}"})
    assert r.status_code == 401, r.status_code
    params = requests.utils.parse_dict_header(
        r.headers["www-authenticate"].removeprefix("SCRAM-SHA-512 ")
    )
    client.set_server_first(base64.b64decode(params["data"]).decode())
    final = base64.b64encode(client.get_client_final().encode()).decode()
    return f"SCRAM-SHA-512 sid={params['sid']},data={final}"


def test_only_its_owner_can_take_an_upload_over_from_a_patch(two_users: GatewayServer) -> None:
    """A HEAD stops an earlier PATCH on the same upload (tus locks), but only the owner's."""
    gw = two_users
    alice, bob = _as("alice"), _as("bob")
    segment = 256 * 1024
    created = alice.post(f"{gw.url}/uploads/", headers={**TUS, "Upload-Length": str(2 * segment),
                         "Upload-Metadata": _meta(topic="shared/held")})  # fmt: skip
    assert created.status_code == 201, created.text
    path = created.headers["location"]
    location = gw.url + path
    patching = RawRequest(
        gw.port,
        f"PATCH {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nTus-Resumable: 1.0.0\r\n"
        f"Authorization: {_scram_authorization(location, 'alice')}\r\n"
        "Upload-Offset: 0\r\nContent-Type: application/offset+octet-stream\r\n"
        f"Content-Length: {segment}\r\n\r\n",
        body=bytes(segment),
    )
    try:
        patching.send(segment // 2)
        time.sleep(0.5)  # Alice's PATCH is being received
        assert bob.head(location, headers=TUS).status_code == 404
        patching.send(segment - segment // 2)
        answer = patching.response_head(10)
        assert answer.startswith(b"HTTP/1.1 204"), answer  # not stopped by Bob
    finally:
        patching.close()
    head = alice.head(location, headers=TUS)
    assert head.status_code == 200 and head.headers["upload-offset"] == str(segment)


def test_a_resumable_upload_is_continued_only_by_its_creator(two_users: GatewayServer) -> None:
    gw = two_users
    alice, bob = _as("alice"), _as("bob")
    created = alice.post(f"{gw.url}/uploads/", headers={**TUS, "Upload-Length": "8",
                         "Upload-Metadata": _meta(topic="shared/file")})  # fmt: skip
    assert created.status_code == 201, created.text
    location = gw.url + created.headers["location"]
    first = {**TUS, "Upload-Offset": "0", "Content-Type": "application/offset+octet-stream"}
    assert alice.patch(location, data=b"abcd", headers=first).status_code == 204
    # Bob may write the topic, but the upload is Alice's: to him it does not exist.
    assert bob.head(location, headers=TUS).status_code == 404
    stolen = bob.patch(location, data=b"EVIL", headers={**first, "Upload-Offset": "4"})
    assert stolen.status_code == 404
    assert bob.delete(location, headers=TUS).status_code == 404
    anonymous = httpx.head(location, headers=TUS)
    assert anonymous.status_code == 401
    # Alice's upload is untouched and completes with her bytes.
    head = alice.head(location, headers=TUS)
    assert head.status_code == 200 and head.headers["upload-offset"] == "4"
    done = alice.patch(location, data=b"efgh", headers={**first, "Upload-Offset": "4"})
    assert done.status_code == 204, done.text
    url = done.headers["x-offload-url"]
    assert alice.get(f"{url}/payload").content == b"abcdefgh"
    assert bob.delete(location, headers=TUS).status_code == 404
    assert alice.delete(location, headers=TUS).status_code == 204
