"""Attacks on the gateway's authentication, over HTTP against the real gateway under uvicorn.

A sniffed SCRAM final replayed with its sid re-spelled; junk in ``Authorization``; a
gateway started without credentials files (closed unless anonymous access is asked for by
name); a tokens-only gateway. The SCRAM client is the real hop-client; the broker is the
real mosquitto reading the same password and ACL files.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import bson
import httpx
import pytest
import requests
from hop.auth import Auth
from hop.http_scram import SCRAMAuth

from _auth import (
    AUTH_SECRET,
    broker_readable_dir,
    secured_pair,
    write_acl_file,
    write_password_file,
)
from _gateway import GatewayServer
from _servers import Mosquitto, free_port, wait_for_port

pytestmark = pytest.mark.servers

USERS = {"writer": "w-secret-1", "gateway": "g-secret-4"}
TOKEN = "a-bearer-token-for-the-writer"
ACL = """\
user writer
topic readwrite data/#
user gateway
topic readwrite sys/metadata
topic readwrite data/#
"""
CLOSED_HINT = "OFFLOAD_ALLOW_ANONYMOUS=true"


@pytest.fixture
def shared_files() -> Iterator[Path]:
    path = broker_readable_dir("offload-hardening-")
    write_password_file(path / "passwd", [(u, p, 4096) for u, p in USERS.items()])
    write_acl_file(path / "acl", ACL)
    (path / "tokens").write_text(f"writer:{hashlib.sha256(TOKEN.encode()).hexdigest()}\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def secured(
    shared_files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
) -> GatewayServer:
    _, gw = secured_pair(
        shared_files, mosquitto_factory, gateway_factory, gateway_password=USERS["gateway"]
    )
    return gw


def upload_body() -> bytes:
    msg_id = uuid.uuid4()
    return bson.encode({"message": b"payload", "headers": [["_id", bson.Binary(msg_id.bytes)]]})


def _lenient_b64(text: str, urlsafe: bool) -> bytes:
    padded = text + "=" * (-len(text) % 4)
    if urlsafe:
        return base64.urlsafe_b64decode(padded)
    return base64.b64decode(padded)


def same_bytes_other_last_char(text: str, *, urlsafe: bool) -> str | None:
    """Another last character that a lenient decoder reads as the same bytes, if any."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789" + (
        "-_" if urlsafe else "+/"
    )
    body = text.rstrip("=")
    pad = text[len(body) :]
    want = _lenient_b64(text, urlsafe)
    for ch in alphabet:
        other = body[:-1] + ch + pad
        if other == text:
            continue
        try:
            if _lenient_b64(other, urlsafe) == want:
                return other
        except (binascii.Error, ValueError):
            continue
    return None


def respellings(header: str) -> list[str]:
    """The captured final with its sid (and data) spelled differently, same bytes."""
    scheme, _, rest = header.partition(" ")
    params = dict(part.strip().split("=", 1) for part in rest.split(","))
    sid, data = params["sid"], params["data"]
    version, payload, mac = sid.split(".")

    def with_sid(new_sid: str, new_data: str = data) -> str:
        return f"{scheme} sid={new_sid},data={new_data}"

    variants = [
        with_sid(sid + "="),
        with_sid(sid + "=="),
        with_sid(sid + "."),
        with_sid(f"{version}.{payload}.{mac}.junk"),
        with_sid(f"{version}.{payload}=.{mac}"),
        with_sid(f"{version}.{payload}.{mac[:5]}!{mac[5:]}"),
        with_sid(f"{version}.{payload}.{mac[:5]}\t{mac[5:]}"),
        with_sid(f'"{sid}"'),  # the same sid as a quoted-string: the same text, refused as used
        f"{scheme} data={data}, sid={sid}",  # reordered parameters
        f"{scheme.lower()} sid={sid},data={data}",
    ]
    for part, urlsafe in ((mac, True), (payload, True)):
        other = same_bytes_other_last_char(part, urlsafe=urlsafe)
        if other is not None:
            variants.append(with_sid(sid.replace(part, other)))
    other_data = same_bytes_other_last_char(data, urlsafe=False)
    if other_data is not None:
        variants.append(with_sid(sid, other_data))
    variants.append(with_sid(sid, data.rstrip("=")))  # data without its padding
    return variants


def test_a_replayed_scram_final_is_refused_however_it_is_spelled(
    secured: GatewayServer,
) -> None:
    gw = secured
    auth = SCRAMAuth(Auth("writer", USERS["writer"], method="SCRAM-SHA-512"), shortcut=True)
    ok = requests.post(
        f"{gw.url}/topic/data/x+oversized", data=upload_body(), auth=auth, timeout=30
    )
    assert ok.status_code == 201, ok.text
    # What a sniffer saw on the wire: the final request's Authorization header.
    captured = ok.request.headers["Authorization"]
    assert "sid=" in captured
    variants = respellings(captured)
    assert len(variants) >= 12
    # The last-character tricks exist for this exchange (64 random bits make them certain
    # for the 32-byte MAC: 43 characters carry 2 spare bits).
    assert same_bytes_other_last_char(captured.split("sid=")[1].split(",")[0].split(".")[2],
                                      urlsafe=True) is not None  # fmt: skip
    attacks = [
        ("POST", "/topic/data/x+oversized", upload_body()),
        ("POST", "/publish/data/evil?retain=true", b"evil"),
        ("PUT", "/publish/data/evil", b"evil"),
    ]
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        for index, header in enumerate([captured, *variants]):
            method, path, body = attacks[index % len(attacks)]
            r = http.request(method, path, content=body, headers={"Authorization": header})
            assert r.status_code == 401, (header, r.status_code, r.text)
            # Nothing in the refusal lets hop-client (or anyone) treat it as a success.
            assert "authentication-info" not in r.headers, header


JUNK: list[bytes] = [
    b"SCRAM-SHA-512 data=!!!notbase64",
    b"SCRAM-SHA-512 data=eA",  # missing padding
    b"SCRAM-SHA-512 data=eB==",  # non-canonical trailing bits
    b"SCRAM-SHA-512 data=eA==,data=eA==",
    b"SCRAM-SHA-512 data=eA==,",
    b"SCRAM-SHA-512 data=eA==,,sid=x",
    b"SCRAM-SHA-512 data=eA== junk",
    b"SCRAM-SHA-512 data=eA==, bogus=1",
    b'SCRAM-SHA-512 data="eA\\=\\="',
    b'SCRAM-SHA-512 data="unterminated',
    b"SCRAM-SHA-512 sid=v1..,data=eA==",
    b"SCRAM-SHA-512 sid=v1.e30.AAAA.,data=eA==",
    b"SCRAM-SHA-512 sid=v1.\xc3\xa9.AAAA,data=eA==",
    b"SCRAM-SHA-512 data=\xff\xfe",
    b"SCRAM-SHA-512 data=" + base64.b64encode(b"n,,n=\xff,r=abc"),
    b"SCRAM-SHA-512 data=" + base64.b64encode(b"n,,n=a\x00b,r=abc"),
    b"SCRAM-SHA-512 data=" + base64.b64encode(b"y,,n=writer,r=" + b"x" * 2000),
    b"SCRAM-SHA-512 data=" + b"A" * 5000,
    b"SCRAM-SHA-512\tdata=eA==",
    b"Basic " + base64.b64encode(b"writer:" + USERS["writer"].encode()),  # no TLS: refused
    b"Basic \xe9",
    b"Bearer " + TOKEN.encode(),  # no TLS: refused
    b"Bearer a b",
    b"Bearer a=b",
    b"Negotiate abc",
    b"\x7f",
    b"=",
    b"garbage",
]


@pytest.mark.parametrize("header", JUNK, ids=range(len(JUNK)))
def test_junk_authorization_is_a_4xx_never_a_5xx(secured: GatewayServer, header: bytes) -> None:
    with httpx.Client(base_url=secured.url, timeout=30) as http:
        for method, path, body in (
            ("POST", "/topic/data/x+oversized", upload_body()),
            ("POST", "/publish/data/x", b"x"),
            ("GET", f"/msg/{uuid.uuid4()}", b""),
        ):
            r = http.request(method, path, content=body, headers={"Authorization": header})
            # Credentials are judged before the id is looked up: never a 404 here.
            assert r.status_code in (400, 401), (header, method, r.status_code, r.text)


def test_an_unknown_caller_cannot_tell_a_stored_id_from_an_unknown_one(
    secured: GatewayServer,
) -> None:
    auth = SCRAMAuth(Auth("writer", USERS["writer"], method="SCRAM-SHA-512"), shortcut=True)
    stored = requests.post(
        f"{secured.url}/topic/data/x+oversized", data=upload_body(), auth=auth, timeout=30
    )
    assert stored.status_code == 201, stored.text
    known, unknown = stored.json()["id"], str(uuid.uuid4())
    with httpx.Client(base_url=secured.url, timeout=30) as http:
        for method, suffix in (("GET", ""), ("GET", "/payload"), ("HEAD", "/payload"),
                               ("POST", "/presign")):  # fmt: skip
            answers = [http.request(method, f"/msg/{i}{suffix}") for i in (known, unknown)]
            # The same challenge for both: the lookup comes after the credentials.
            assert [a.status_code for a in answers] == [401, 401], (method, suffix, answers)
            assert answers[0].text == answers[1].text, (method, suffix)


def test_without_credentials_files_nobody_is_served_unless_asked_for_by_name(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto
) -> None:
    closed = gateway_factory(broker, allow_anonymous=False)
    tus = {
        "Tus-Resumable": "1.0.0",
        "Upload-Length": "1",
        "Upload-Metadata": "topic " + base64.b64encode(b"any/topic").decode(),
    }
    with httpx.Client(base_url=closed.url, timeout=30) as http:
        for method, path, body, headers in (
            ("POST", "/publish/any/topic?retain=true", b"x", {}),
            ("PUT", "/publish/any/topic", b"x", {}),
            ("POST", "/topic/any/topic+oversized", upload_body(), {}),
            ("POST", "/uploads/", b"", tus),
        ):
            r = http.request(method, path, content=body, headers=headers)
            assert r.status_code == 401, (method, path, r.status_code, r.text)
            assert CLOSED_HINT in r.json()["detail"], r.text
        # Credentials do not open a gateway that has none to check them against.
        r = http.post("/publish/any/topic", content=b"x", headers={"Authorization": "Basic eDp5"})
        assert r.status_code == 401 and CLOSED_HINT in r.json()["detail"]
        # The probes still answer: a closed gateway is alive, only it serves nobody.
        assert http.get("/healthz").status_code == 200
    opened = gateway_factory(broker, allow_anonymous=True)
    r = httpx.post(f"{opened.url}/publish/any/topic", content=b"x", timeout=30)
    assert r.status_code == 201, r.text


def _gateway_process(env: dict[str, str], tmp_path: Path) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    clean.update({"OFFLOAD_STORAGE_URL": f"file://{tmp_path}/store", "OFFLOAD_SWEEP_INTERVAL": "0"})
    clean.update(env)
    port = free_port()
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "--port", str(port)],
        env=clean,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    return out


def test_the_start_up_log_names_the_mode(tmp_path: Path) -> None:
    """The real `offload-gateway` with a clean environment: closed, and it says so."""
    proc = _gateway_process({}, tmp_path)
    try:
        port = int(proc.args[-1])  # type: ignore[index]
        wait_for_port(port, 30)
        r = httpx.post(f"http://127.0.0.1:{port}/publish/a/b", content=b"x", timeout=30)
        assert r.status_code == 401 and CLOSED_HINT in r.json()["detail"]
    finally:
        out = _stop(proc)
    assert "authentication: closed" in out and CLOSED_HINT in out, out
    proc = _gateway_process({"OFFLOAD_ALLOW_ANONYMOUS": "true"}, tmp_path)
    try:
        wait_for_port(int(proc.args[-1]), 30)  # type: ignore[index]
    finally:
        out = _stop(proc)
    assert "authentication: OFF (OFFLOAD_ALLOW_ANONYMOUS=true)" in out, out


def test_tokens_only_without_tls_refuses_to_start(tmp_path: Path, shared_files: Path) -> None:
    proc = _gateway_process({"OFFLOAD_TOKENS_FILE": str(shared_files / "tokens")}, tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "OFFLOAD_TLS" in out, out


def test_tokens_only_is_enforced(
    shared_files: Path, gateway_factory: Callable[..., GatewayServer], broker: Mosquitto
) -> None:
    # tls=True: the gateway is told a TLS-terminating proxy is in front of it.
    gw = gateway_factory(
        broker, tokens_file=shared_files / "tokens", acl_file=shared_files / "acl", tls=True
    )
    good = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        ok = http.post("/topic/data/t+oversized", content=upload_body(), headers=good)
        assert ok.status_code == 201, ok.text
        msg_id = ok.json()["id"]
        # The ACL applies to the token's user: outside its topics, 403.
        assert http.post("/publish/other/t", content=b"x", headers=good).status_code == 403
        assert http.post("/publish/data/t", content=b"x", headers=good).status_code == 201
        anonymous = http.post("/publish/data/t", content=b"x")
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"] == 'Bearer realm="mqtt-offload"'
        for header in (
            "Bearer wrong-token",
            "Basic " + base64.b64encode(f"writer:{USERS['writer']}".encode()).decode(),
            "SCRAM-SHA-512 data=" + base64.b64encode(b"n,,n=writer,r=abc").decode(),
        ):
            r = http.post("/publish/data/t", content=b"x", headers={"Authorization": header})
            assert r.status_code == 401, (header, r.text)
        assert http.get(f"/msg/{msg_id}", headers=good).status_code == 200
        assert http.get(f"/msg/{msg_id}").status_code == 401


def test_a_tokens_only_gateway_serves_our_client(
    shared_files: Path, gateway_factory: Callable[..., GatewayServer], broker: Mosquitto
) -> None:
    """A peer through the running system: the Client offloads and fetches with its token."""
    from client import AccessRefused, Client, Message, Route

    gw = gateway_factory(
        broker, tokens_file=shared_files / "tokens", acl_file=shared_files / "acl", tls=True
    )
    with (
        Client(broker.url, http_token=TOKEN, discovery_wait=10.0) as reader,
        Client(broker.url, http_token=TOKEN, discovery_wait=10.0) as writer,
        Client(broker.url, http_token="not-a-token", discovery_wait=10.0) as refused,
        Client(
            broker.url,
            http_token="not-a-token",
            discovery_wait=10.0,
            fallback_on_auth_failure=True,
        ) as stranger,
    ):
        reader.subscribe("data/tokens")
        assert writer.wait_for_endpoint(10) == gw.url
        assert stranger.wait_for_endpoint(10) == gw.url
        payload = os.urandom(1024 * 1024)
        assert writer.publish("data/tokens", payload, qos=1).route is Route.OFFLOADED
        # A wrong token cannot upload: an error (issue 27), or chunks over the broker when
        # the client opts in to falling back on a refused login.
        assert refused.wait_for_endpoint(10) == gw.url
        with pytest.raises(AccessRefused):
            refused.publish("data/tokens", payload, qos=1)
        assert stranger.publish("data/tokens", payload, qos=1).route is Route.CHUNKED
        routes = []
        for _ in range(2):
            msg = reader.next_message(30)
            assert isinstance(msg, Message), msg
            assert msg.payload == payload
            routes.append(msg.route)
        assert sorted(routes) == [Route.CHUNKED, Route.OFFLOADED]


def _scram_status(http: httpx.Client, user: str, password: str) -> int:
    """One SCRAM-SHA-512 exchange by hand (scramp's client); the last status."""
    from scramp import ScramClient

    scram = ScramClient(["SCRAM-SHA-512"], user, password)
    first = base64.b64encode(scram.get_client_first().encode()).decode()
    headers = {"Authorization": f"SCRAM-SHA-512 data={first}"}
    challenge = http.post("/publish/data/t", headers=headers)
    if challenge.status_code != 401 or "sid=" not in challenge.headers.get("www-authenticate", ""):
        return challenge.status_code
    params = dict(
        part.strip().split("=", 1)
        for part in challenge.headers["www-authenticate"].split(" ", 1)[1].split(",")
    )
    scram.set_server_first(base64.b64decode(params["data"]).decode())
    final = base64.b64encode(scram.get_client_final().encode()).decode()
    header = f"SCRAM-SHA-512 sid={params['sid']},data={final}"
    return http.post("/publish/data/t", content=b"x", headers={"Authorization": header}).status_code


def test_a_guesser_cannot_lock_the_user_out_from_elsewhere(secured: GatewayServer) -> None:
    # Loopback has all of 127.0.0.0/8: the guesser comes from 127.0.0.2.
    guesser = httpx.Client(
        base_url=secured.url, timeout=30, transport=httpx.HTTPTransport(local_address="127.0.0.2")
    )
    with guesser:
        statuses = [_scram_status(guesser, "writer", f"guess-{n}") for n in range(12)]
        assert statuses[:10] == [401] * 10 and statuses[10:] == [429, 429]
        # Blocked from there even with the right password: the block slows guessing.
        assert _scram_status(guesser, "writer", USERS["writer"]) == 429
    # The real user, from its own address, is not locked out (documented choice).
    auth = SCRAMAuth(Auth("writer", USERS["writer"], method="SCRAM-SHA-512"), shortcut=True)
    ok = requests.post(f"{secured.url}/publish/data/t", data=b"x", auth=auth, timeout=30)
    assert ok.status_code == 201, ok.text


def test_basic_over_plain_http_says_why_and_what_to_do_instead(
    shared_files: Path, gateway_factory: Callable[..., GatewayServer], broker: Mosquitto
) -> None:
    """`curl -u` against a plain-HTTP gateway: a 401 that explains itself, password unechoed."""
    secured = gateway_factory(
        broker,
        password_file=shared_files / "passwd",
        acl_file=shared_files / "acl",
        tokens_file=shared_files / "tokens",
        auth_secret=AUTH_SECRET,
    )
    url = f"{secured.url}/publish/data/basic"
    password = USERS["writer"]
    curl = subprocess.run(
        ["curl", "-sS", "-i", "-u", f"writer:{password}", "--data-binary", "x", url],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    head, _, body = curl.stdout.replace("\r\n", "\n").partition("\n\n")
    assert head.startswith("HTTP/1.1 401"), curl.stdout
    assert 'SCRAM-SHA-512 realm="mqtt-offload"' in head  # the challenge that works here
    with httpx.Client(base_url=secured.url, timeout=30) as http:
        answers = {
            "curl -u": body,
            "httpx Basic": http.post(url, content=b"x", auth=("writer", password)).text,
            "httpx Basic, wrong password": http.post(url, content=b"x", auth=("writer", "no")).text,
        }
        bearer = http.post(url, content=b"x", headers={"Authorization": f"Bearer {TOKEN}"})
    for who, text in answers.items():
        detail = json.loads(text)["detail"]
        assert "Basic" in detail and "plain HTTP" in detail, (who, detail)
        for advice in ("HTTPS", "SCRAM-SHA-512", "OFFLOAD_TLS=true"):
            assert advice in detail, (who, advice, detail)
        assert password not in text and "no" not in detail.split(), (who, text)
    assert bearer.status_code == 401
    detail = bearer.json()["detail"]
    assert "Bearer" in detail and "plain HTTP" in detail and "OFFLOAD_TLS=true" in detail, detail
    assert TOKEN not in bearer.text
