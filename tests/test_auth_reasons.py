"""A malformed `Authorization` header gets a 4xx that says what is wrong with it, on every route.

Hostile or broken headers (bad base64, SCRAM messages cut or padded with junk, forged sids,
unknown schemes, headers far too long) sent to each of the gateway's authenticated routes,
tus ones included. Every answer is checked: a 401 that still offers SCRAM and names the
header's fault in `detail`, a 431 for a head past the limit; never a 5xx, and never the
bytes of a Basic password. Wrong credentials stay a bare "authentication required" (saying
more would tell a user or a password from another). Real gateway on SeaweedFS, httpx; each
header comes from its own loopback address, so the failure counting (429) never hides the
answer under test.
"""

from __future__ import annotations

import base64
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from _auth import AUTH_SECRET, broker_readable_dir, write_acl_file, write_password_file
from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

PASSWORD = "w-secret-1"
TUS = {"Tus-Resumable": "1.0.0"}
MALFORMED = "malformed Authorization header"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


# header -> what the 401's detail must say
SCRAM_FAULTS: dict[str, str] = {
    "SCRAM-SHA-512 sid=abc": "SCRAM-SHA-512 needs data=<base64>",
    "SCRAM-SHA-512 data=!!!notbase64": f"{MALFORMED}: SCRAM-SHA-512 data: bad base64",
    "SCRAM-SHA-512 data=eB==": "non-canonical base64",
    "SCRAM-SHA-512 data=" + _b64(b"n,,n=writer"): "SCRAM client-first: Malformed",
    "SCRAM-SHA-512 data=" + _b64(b"p=tls-unique,,n=writer,r=abc"): "channel binding",
    "SCRAM-SHA-512 data=" + _b64(b"n,,n=a,r=b,m=ext"): "SCRAM client-first",
    "SCRAM-SHA-512 sid=v1.AAAA.BBBB,data=eA==": "SCRAM sid refused",
    "SCRAM-SHA-512 bogus=1,data=eA==": "SCRAM-SHA-512 takes data, sid and realm",
    "SCRAM-SHA-512 data=eA==,data=eA==": "given twice",
    "SCRAM-SHA-512 " + ",".join(f"p{i}=x" for i in range(2000)): "too long",
    "SCRAM-SHA-512 data=" + "A" * 60_000: "too long",
    "Negotiate abc": "not offered here; this gateway takes SCRAM-SHA-512",
    "SCRAM-SHA-512 data=\xe9": "non-ASCII",
    "Basic " + _b64(f"writer:{PASSWORD}".encode()): "refused over plain HTTP",
}
# Only over TLS (here: OFFLOAD_TLS=true, as behind a TLS proxy) does Basic get parsed.
BASIC_FAULTS: dict[str, str] = {
    "Basic !!!!": f"{MALFORMED}: bad auth-param list",
    "Basic A": "Basic takes base64 of UTF-8 `user:password`",
    "Basic eB==": "Basic takes base64 of UTF-8 `user:password`",
    "Basic " + _b64(b"writer"): "Basic takes base64 of UTF-8 `user:password`",
    "Basic " + _b64(b"writer:\xe9" + PASSWORD.encode()): "Basic takes base64 of UTF-8",
    "Basic a b": f"{MALFORMED}: bad auth-param list",
    "Basic a=b": "Basic takes one token68 credential",
    "Bearer x=y": "Bearer takes one token68 credential",
}


@pytest.fixture
def files() -> Iterator[Path]:
    path = broker_readable_dir("offload-auth-reasons-")
    write_password_file(path / "passwd", [("writer", PASSWORD, 4096)])
    write_acl_file(path / "acl", "user writer\ntopic readwrite data/#\n")
    (path / "tokens").write_text(f"writer:{'0' * 64}\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _routes() -> list[tuple[str, str, dict[str, str], bytes]]:
    metadata = "topic " + _b64(b"data/x")
    segment = {**TUS, "Upload-Offset": "0", "Content-Type": "application/offset+octet-stream"}
    return [
        ("POST", "/topic/data/x+oversized", {}, b"x"),
        ("POST", "/publish/data/x", {}, b"x"),
        ("PUT", f"/msg/{uuid.uuid4()}?topic=data/x", {}, b"x"),
        ("POST", "/uploads/", {**TUS, "Upload-Length": "1", "Upload-Metadata": metadata}, b""),
        ("HEAD", f"/uploads/{uuid.uuid4().hex}", TUS, b""),
        ("PATCH", f"/uploads/{uuid.uuid4().hex}", segment, b"x"),
        ("DELETE", f"/uploads/{uuid.uuid4().hex}", TUS, b""),
    ]


def _check(gw: GatewayServer, faults: dict[str, str], first_address: int) -> None:
    problems = []
    for index, (header, reason) in enumerate(faults.items()):
        transport = httpx.HTTPTransport(local_address=f"127.0.0.{first_address + index}")
        with httpx.Client(base_url=gw.url, timeout=30, transport=transport) as http:
            for method, path, headers, body in _routes():
                sent = {**headers, "Authorization": header.encode("latin-1")}
                r = http.request(method, path, headers=sent, content=body)
                seen = (header[:40], method, path[:16], r.status_code)
                if r.status_code != 401 or "SCRAM-SHA-512" not in r.headers["www-authenticate"]:
                    problems.append((*seen, r.text[:120]))
                    continue
                if method == "HEAD":  # no body: the same request as GET-like POST says it
                    continue
                detail = r.json()["detail"]
                if reason not in detail or PASSWORD in r.text:
                    problems.append((*seen, detail[:160]))
    assert not problems, "\n".join(map(str, problems))


def test_malformed_authorization_is_401_with_the_reason(
    files: Path, gateway_factory: Callable[..., GatewayServer], broker: Mosquitto
) -> None:
    gw = gateway_factory(
        broker,
        password_file=files / "passwd",
        acl_file=files / "acl",
        auth_secret=AUTH_SECRET,
    )
    _check(gw, SCRAM_FAULTS, first_address=10)
    # Wrong credentials: refused without a hint.
    wrong = httpx.post(
        f"{gw.url}/publish/data/x",
        content=b"x",
        headers={"Authorization": "SCRAM-SHA-512 data=" + _b64(b"n,,n=nobody,r=abc")},
    )
    assert wrong.status_code == 401 and "sid=" in wrong.headers["www-authenticate"]  # goes on
    # A head past the limit is refused before any route, with its reason.
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        huge = http.post("/publish/data/x", content=b"x", headers={"Authorization": "A" * 70_000})
    assert huge.status_code == 431 and "detail" in huge.json(), huge.text


def test_malformed_basic_and_bearer_over_tls_are_401_with_the_reason(
    files: Path, gateway_factory: Callable[..., GatewayServer], broker: Mosquitto
) -> None:
    gw = gateway_factory(
        broker,
        password_file=files / "passwd",
        acl_file=files / "acl",
        tokens_file=files / "tokens",
        auth_secret=AUTH_SECRET,
        tls=True,  # a TLS-terminating proxy in front, as far as the gateway knows
    )
    _check(gw, BASIC_FAULTS, first_address=40)
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        wrong = http.post("/publish/data/x", content=b"x", auth=("writer", "not-it"))
        assert wrong.status_code == 401 and wrong.json()["detail"] == "authentication required"
        right = http.post("/publish/data/x", content=b"x", auth=("writer", PASSWORD))
        assert right.status_code == 201, right.text
