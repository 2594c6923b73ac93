"""The full HTTP SCRAM-SHA-512 exchange with the real hop-client against a uvicorn server.

A tiny FastAPI app uses the gateway's auth adapter; the password file is written by the
real ``mosquitto_passwd``; the client is ``hop.http_scram.SCRAMAuth`` over ``requests``.
"""

import base64
import hashlib
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import uvicorn
from fastapi import FastAPI, Request
from hop.auth import Auth
from hop.http_scram import SCRAMAuth
from scramp import ScramClient, ScramException

from client.protocol import Topic
from gateway.auth import Authenticator
from gateway.core._errors import NotFound, install_error_handlers
from gateway.core._executors import WorkerPool
from gateway.http._authz import AuthenticationInfoMiddleware, BrokerRules

pytestmark = pytest.mark.servers

USERS = {"alice": "alice-secret", "reader": "reader-secret", "old": "old-secret"}
ACL = """\
user alice
topic readwrite sensors/#
user reader
topic read sensors/#
"""


def mosquitto_passwd(path: Path, user: str, password: str, *extra: str) -> None:
    create = [] if path.exists() else ["-c"]
    subprocess.run(
        ["mosquitto_passwd", *create, "-b", *extra, str(path), user, password],
        check=True,
        capture_output=True,
    )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def make_app(authenticator: Authenticator) -> FastAPI:
    """The gateway's own adapter (`BrokerRules`, its error handlers and middleware)."""
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(AuthenticationInfoMiddleware)
    rules = BrokerRules(authenticator, hashing=WorkerPool("hash", 2))

    def user(request: Request) -> object:
        return getattr(request.state, "offload_principal", None)

    @app.post("/topic/{topic:path}")
    async def upload(topic: str, request: Request) -> dict[str, object]:
        await rules.authorize(request, Topic(topic.removesuffix("+oversized")), write=True)
        body = await request.body()
        return {
            "user": user(request),
            "topic": topic,
            "size": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
        }

    @app.get("/topic/{topic:path}")
    async def read(topic: str, request: Request) -> dict[str, object]:
        await rules.authorize(request, Topic(topic), write=False)
        return {"user": user(request), "topic": topic}

    @app.get("/msg/{name}")
    async def message(name: str, request: Request) -> dict[str, object]:
        if name == "missing":
            await rules.authorize(request, Topic("sensors/any"), write=False)
            # An error of the route's own: the middleware must add Authentication-Info.
            raise NotFound("no such message")
        # The message's topic is only known after a lookup: the route checks then.
        await rules.authorize(request, Topic(name.replace(".", "/")), write=False)
        return {"user": user(request)}

    return app


class Server:
    def __init__(self, app: FastAPI) -> None:
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "Server":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("auth-http")
    passwords = root / "passwd"
    mosquitto_passwd(passwords, "alice", USERS["alice"], "-H", "sha512-pbkdf2", "-I", "4096")
    mosquitto_passwd(passwords, "reader", USERS["reader"], "-I", "4096")
    mosquitto_passwd(passwords, "old", USERS["old"])  # mosquitto's default: 101 iterations
    acl = root / "acl"
    acl.write_text(ACL)
    return passwords, acl


@pytest.fixture(scope="module")
def authenticator(files: tuple[Path, Path]) -> Authenticator:
    passwords, acl = files
    return Authenticator(
        password_file=passwords,
        acl_file=acl,
        realm="offload",
        secret=b"test-secret-of-32-bytes-length!!",
        tls=False,
        allow_anonymous=False,
        # Many deliberate failures from 127.0.0.1 here: limits are
        # tested in test_auth_authenticator.py.
        max_failures_per_user=10_000,
        max_failures_per_address=10_000,
    )


@pytest.fixture(scope="module")
def server(authenticator: Authenticator) -> Iterator[Server]:
    with Server(make_app(authenticator)) as running:
        yield running


def hop_auth(user: str, password: str, *, shortcut: bool) -> SCRAMAuth:
    return SCRAMAuth(Auth(user, password, method="SCRAM-SHA-512"), shortcut=shortcut)


@pytest.mark.parametrize("shortcut", [True, False])
def test_right_password_passes(server: Server, shortcut: bool) -> None:
    body = bytes(range(256)) * 1000
    response = requests.post(
        f"{server.url}/topic/sensors/t1+oversized",
        data=body,
        auth=hop_auth("alice", USERS["alice"], shortcut=shortcut),
        timeout=10,
    )
    assert response.status_code == 200, response.text
    # The body arrived whole on the final request even though the shortcut withheld it
    # on the first one.
    assert response.json() == {
        "user": "alice",
        "topic": "sensors/t1+oversized",
        "size": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
    }
    assert "authentication-info" in response.headers
    # hop checked the server signature (set_server_final raises otherwise). Before the
    # final: the server-first 401, and without the shortcut a plain 401 challenge first.
    server_first = response.history[-1]
    assert server_first.status_code == 401
    assert server_first.request.headers["Authorization"].startswith("SCRAM-SHA-512 data=")
    if not shortcut:
        challenge = server_first.history[-1]
        assert challenge.status_code == 401
        assert "Authorization" not in challenge.request.headers


@pytest.mark.parametrize("shortcut", [True, False])
@pytest.mark.parametrize(
    "user,password", [("alice", "wrong"), ("nobody", "whatever"), ("old", USERS["old"])]
)
def test_bad_credentials_fail(server: Server, shortcut: bool, user: str, password: str) -> None:
    # hop-client raises on the server's "e=invalid-proof" final: the user sees why.
    with pytest.raises(ScramException, match="invalid-proof"):
        requests.post(
            f"{server.url}/topic/sensors/t",
            data=b"x",
            auth=hop_auth(user, password, shortcut=shortcut),
            timeout=10,
        )


def manual_exchange(url: str, user: str, password: str) -> tuple[requests.Response, str]:
    """Drive the exchange by hand to look at each status; returns the final response and
    the Authorization header of the final request."""
    client = ScramClient(["SCRAM-SHA-512"], user, password)
    first = base64.b64encode(client.get_client_first().encode()).decode()
    r1 = requests.get(url, headers={"Authorization": f"SCRAM-SHA-512 data={first}"}, timeout=10)
    assert r1.status_code == 401
    params = requests.utils.parse_dict_header(
        r1.headers["www-authenticate"].removeprefix("SCRAM-SHA-512 ")
    )
    client.set_server_first(base64.b64decode(params["data"]).decode())
    final = base64.b64encode(client.get_client_final().encode()).decode()
    header = f"SCRAM-SHA-512 sid={params['sid']},data={final}"
    r2 = requests.get(url, headers={"Authorization": header}, timeout=10)
    return r2, header


def test_wrong_password_is_a_401_on_the_wire(server: Server) -> None:
    response, _ = manual_exchange(f"{server.url}/topic/sensors/a", "alice", "wrong")
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("SCRAM-SHA-512 realm=")
    info = requests.utils.parse_dict_header(response.headers["authentication-info"])
    assert base64.b64decode(info["data"]) == b"e=invalid-proof"


def test_replayed_final_is_refused(server: Server) -> None:
    response, header = manual_exchange(f"{server.url}/topic/sensors/a", "alice", USERS["alice"])
    assert response.status_code == 200
    replay = requests.get(
        f"{server.url}/topic/sensors/a", headers={"Authorization": header}, timeout=10
    )
    assert replay.status_code == 401
    assert "authentication-info" not in replay.headers


def test_anonymous_gets_a_scram_challenge(server: Server) -> None:
    response = requests.post(f"{server.url}/topic/sensors/t", data=b"x", timeout=10)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == 'SCRAM-SHA-512 realm="offload"'


@pytest.mark.parametrize("shortcut", [True, False])
def test_read_only_user(server: Server, shortcut: bool) -> None:
    # A fresh SCRAMAuth per request: hop-client's does not reset its state after a
    # success, so reusing one without the shortcut breaks on the next 401 (hop's quirk).
    write = requests.post(
        f"{server.url}/topic/sensors/t+oversized",
        data=b"x",
        auth=hop_auth("reader", USERS["reader"], shortcut=shortcut),
        timeout=10,
    )
    # A 403 after a successful exchange still carries the server-final hop-client checks.
    assert write.status_code == 403
    assert "authentication-info" in write.headers
    read = requests.get(
        f"{server.url}/topic/sensors/t",
        auth=hop_auth("reader", USERS["reader"], shortcut=shortcut),
        timeout=10,
    )
    assert read.status_code == 200 and read.json()["user"] == "reader"
    # A refusal raised by the route itself also gets Authentication-Info (middleware).


@pytest.mark.parametrize("shortcut", [True, False])
@pytest.mark.parametrize("name,status", [("sensors.x", 200), ("other.x", 403), ("missing", 404)])
def test_route_level_answers_reach_hop(
    server: Server, shortcut: bool, name: str, status: int
) -> None:
    # Without Authentication-Info on these, hop-client would raise instead of returning them.
    response = requests.get(
        f"{server.url}/msg/{name}",
        auth=hop_auth("reader", USERS["reader"], shortcut=shortcut),
        timeout=10,
    )
    assert response.status_code == status
    assert "authentication-info" in response.headers


def test_alice_outside_her_topics(server: Server) -> None:
    shortcut = True
    outside = requests.post(
        f"{server.url}/topic/other",
        data=b"x",
        auth=hop_auth("alice", USERS["alice"], shortcut=shortcut),
        timeout=10,
    )
    assert outside.status_code == 403


@pytest.mark.parametrize(
    "header",
    [
        "SCRAM-SHA-512 data=%%%notbase64",
        "SCRAM-SHA-512 sid=v1.AAAA.BBBB,data=Yz1iaXdzLHI9eA==",
        "SCRAM-SHA-512 sid=garbage,data=eA==",
        "SCRAM-SHA-512",
        "SCRAM-SHA-512 data=" + base64.b64encode(b"n,,n=alice").decode(),
        "SCRAM-SHA-512 data=" + base64.b64encode(b"\xff\xfe").decode(),
        "Negotiate abc",
        "Basic " + base64.b64encode(b"alice:alice-secret").decode(),  # no TLS: refused
        "Bearer token",
        "SCRAM-SHA-512 data=" + "A" * 10000,
        "SCRAM-SHA-512 data==",
        "SCRAM-SHA-512 a=1,a=2",
    ],
)
def test_junk_authorization_is_a_401(server: Server, header: str) -> None:
    response = requests.get(
        f"{server.url}/topic/sensors/a", headers={"Authorization": header}, timeout=10
    )
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == 'SCRAM-SHA-512 realm="offload"'
