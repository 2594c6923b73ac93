"""Someone else's resumable upload is indistinguishable from one that does not exist.

Bob holds the id of Alice's upload on a topic he may not write. Every per-upload request
he makes (HEAD, PATCH, DELETE, a final upload joining her partial one) must answer exactly
what the same request answers for an id nobody created: the same status, headers and body
(with the id swapped), never a 403 naming her topic nor a 410 saying it expired. Real
gateway on SeaweedFS, real mosquitto with the same password and ACL files, the SCRAM
client is hop-client's.

A stored message Bob may not read is refused with the documented 403, which does not name
its topic either.
"""

from __future__ import annotations

import base64
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import requests
from hop.auth import Auth
from hop.http_scram import SCRAMAuth

from _auth import AUTH_SECRET, broker_readable_dir, write_acl_file, write_password_file
from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

TUS = {"Tus-Resumable": "1.0.0"}
OFFSET_TYPE = "application/offset+octet-stream"
USERS = {"alice": "a-secret-1", "bob": "b-secret-2", "gateway": "g-secret-3"}
ACL = """\
user alice
topic readwrite alice/#
user bob
topic readwrite bob/#
user gateway
topic readwrite sys/metadata
topic readwrite alice/#
topic readwrite bob/#
"""
SECRET_TOPIC = "alice/merger-with-acme"
# Differ per exchange or per second, not per upload.
VOLATILE = {"date", "authentication-info", "x-request-id"}


def _meta(**items: str) -> str:
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" for k, v in items.items())


@pytest.fixture
def files() -> Iterator[Path]:
    path = broker_readable_dir("offload-tus-privacy-")
    write_password_file(path / "passwd", [(u, p, 4096) for u, p in USERS.items()])
    write_acl_file(path / "acl", ACL)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def start(
    files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
) -> Callable[..., GatewayServer]:
    broker = mosquitto_factory(
        max_packet_size=262144,
        extra_config=f"allow_anonymous false\npassword_file {files / 'passwd'}\n"
        f"acl_file {files / 'acl'}\n",
    )

    def make(**overrides: object) -> GatewayServer:
        return gateway_factory(
            broker,
            mqtt_username="gateway",
            mqtt_password=USERS["gateway"],
            password_file=files / "passwd",
            acl_file=files / "acl",
            auth_secret=AUTH_SECRET,
            **overrides,
        )

    return make


def _as(user: str) -> requests.Session:
    session = requests.Session()
    session.auth = SCRAMAuth(Auth(user, USERS[user], method="SCRAM-SHA-512"), shortcut=True)
    return session


def _create(session: requests.Session, url: str, topic: str, data: bytes, **headers: str) -> str:
    r = session.post(f"{url}/uploads/", data=data, headers={
        **TUS, "Upload-Length": "8", "Upload-Metadata": _meta(topic=topic),
        "Content-Type": OFFSET_TYPE, **headers})  # fmt: skip
    assert r.status_code == 201, r.text
    return str(r.headers["location"]).rsplit("/", 1)[-1]


def _requests(url: str, upload_id: str) -> dict[str, tuple[str, str, dict[str, str], bytes]]:
    """Every per-upload request Bob could make with an id he holds."""
    location = f"{url}/uploads/{upload_id}"
    segment = {**TUS, "Upload-Offset": "4", "Content-Type": OFFSET_TYPE}
    join = {**TUS, "Upload-Concat": f"final;{location}", "Upload-Metadata": _meta(topic="bob/x")}
    return {
        "HEAD": ("HEAD", location, TUS, b""),
        "PATCH": ("PATCH", location, segment, b"EVIL"),
        "empty PATCH": ("PATCH", location, {**segment, "Upload-Offset": "8"}, b""),
        "DELETE": ("DELETE", location, TUS, b""),
        "final joining it": ("POST", f"{url}/uploads/", join, b""),
    }


def _answer(response: requests.Response | httpx.Response, upload_id: str) -> tuple[object, ...]:
    """What a response tells its reader, with the id it names made anonymous."""
    headers = {k.lower(): v.replace(upload_id, "<id>") for k, v in response.headers.items()}
    for name in VOLATILE:
        headers.pop(name, None)
    return response.status_code, headers, response.content.replace(upload_id.encode(), b"<id>")


def _check_indistinguishable(url: str, upload_id: str, who: Callable[[], object]) -> None:
    unknown = uuid.uuid4().hex
    theirs, nobodys = _requests(url, upload_id), _requests(url, unknown)
    for name, (method, target, headers, body) in theirs.items():
        answers = []
        for request_id, (m, t, h, b) in ((upload_id, (method, target, headers, body)),
                                         (unknown, nobodys[name])):  # fmt: skip
            client = who()
            if isinstance(client, requests.Session):
                answers.append(_answer(client.request(m, t, headers=h, data=b), request_id))
            else:
                answers.append(_answer(httpx.request(m, t, headers=h, content=b), request_id))
        seen, baseline = answers
        assert seen == baseline, (name, seen, baseline)
        assert b"alice" not in repr(seen).encode(), (name, seen)  # neither topic nor owner


def test_another_users_upload_answers_as_an_unknown_id(
    start: Callable[..., GatewayServer],
) -> None:
    gw = start()
    alice = _as("alice")
    upload = _create(alice, gw.url, SECRET_TOPIC, b"abcd")
    partial = _create(alice, gw.url, SECRET_TOPIC, b"12345678", **{"Upload-Concat": "partial"})
    for upload_id in (upload, partial):
        _check_indistinguishable(gw.url, upload_id, lambda: _as("bob"))
        _check_indistinguishable(gw.url, upload_id, lambda: None)  # anonymous: 401 for both
    # Bob changed nothing: Alice's upload is where she left it and completes with her bytes.
    location = f"{gw.url}/uploads/{upload}"
    assert alice.head(location, headers=TUS).headers["upload-offset"] == "4"
    done = alice.patch(location, data=b"efgh", headers={**TUS, "Upload-Offset": "4",
                       "Content-Type": OFFSET_TYPE})  # fmt: skip
    assert done.status_code == 204, done.text
    assert alice.get(done.headers["x-offload-url"] + "/payload").content == b"abcdefgh"
    # And her partial upload is still hers to join.
    joined = alice.post(f"{gw.url}/uploads/", headers={**TUS, "Upload-Metadata": _meta(
        topic=SECRET_TOPIC), "Upload-Concat": f"final;{gw.url}/uploads/{partial}"})  # fmt: skip
    assert joined.status_code == 201, joined.text


def test_another_users_expired_upload_answers_as_an_unknown_id(
    start: Callable[..., GatewayServer],
) -> None:
    gw = start(upload_expiry=1)
    alice = _as("alice")
    upload = _create(alice, gw.url, SECRET_TOPIC, b"abcd")
    partial = _create(alice, gw.url, SECRET_TOPIC, b"12345678", **{"Upload-Concat": "partial"})
    location = f"{gw.url}/uploads/{upload}"
    deadline = time.monotonic() + 60
    while alice.head(location, headers=TUS).status_code != 410:  # to its owner: expired
        assert time.monotonic() < deadline, "the upload never expired"
        time.sleep(0.2)
    for upload_id in (upload, partial):
        _check_indistinguishable(gw.url, upload_id, lambda: _as("bob"))


def test_a_message_another_user_may_not_read_does_not_name_its_topic(
    start: Callable[..., GatewayServer],
) -> None:
    """Bob holds the id of Alice's message: refused (403, as documented), her topic unsaid."""
    gw = start()
    alice, bob = _as("alice"), _as("bob")
    stored = alice.post(f"{gw.url}/publish/{SECRET_TOPIC}", data=b"secret plans")
    assert stored.status_code == 201, stored.text
    message = stored.json()["id"]
    for method, path in (
        ("GET", f"/msg/{message}"),
        ("HEAD", f"/msg/{message}"),
        ("GET", f"/msg/{message}/payload"),
        ("HEAD", f"/msg/{message}/payload"),
        ("POST", f"/msg/{message}/presign"),
    ):
        r = bob.request(method, f"{gw.url}{path}")
        assert r.status_code == 403, (method, path, r.status_code)
        assert b"alice" not in r.content and "alice" not in repr(dict(r.headers)), (path, r.text)
        if method != "HEAD":
            detail = "not allowed to read this message's topic (decided by the ACL file)"
            assert r.json()["detail"] == detail
    assert alice.get(f"{gw.url}/msg/{message}/payload").content == b"secret plans"
