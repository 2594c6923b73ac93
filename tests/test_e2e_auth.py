"""One identity end to end: our Client and CLI against mosquitto and the gateway sharing one
password file and one ACL file; the client's SCRAM (client.http._scram) with its broker login."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from client import AccessRefused, Client, FetchError, Message, MessageError, Route, UploadError
from client.core._source import PayloadSource
from client.http._scram import ScramAuth
from client.http._transport import HttpTransport
from client.protocol import MessageId

from _auth import broker_readable_dir, secured_pair, write_acl_file, write_password_file
from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
USERS = {"writer": "w-secret-1", "reader": "r-secret-2", "gateway": "g-secret-4"}
WEAK = ("weak", "k-secret-5")  # fewer than 4096 iterations: the broker takes it, SCRAM cannot
TOKEN = "a-bearer-token-for-the-writer"
# Everyone reads the discovery record; only the gateway writes it.
ACL = """\
pattern read sys/metadata
user writer
topic readwrite data/#
user reader
topic read data/#
user weak
topic readwrite data/#
user gateway
topic readwrite sys/metadata
topic readwrite data/#
"""


@pytest.fixture
def shared_files() -> Iterator[Path]:
    path = broker_readable_dir("offload-e2e-auth-")
    entries = [(u, p, 4096) for u, p in USERS.items()] + [(*WEAK, 1000)]
    write_password_file(path / "passwd", entries)
    write_acl_file(path / "acl", ACL)
    (path / "tokens").write_text(f"writer:{hashlib.sha256(TOKEN.encode()).hexdigest()}\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def secured(
    shared_files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
) -> tuple[Mosquitto, GatewayServer]:
    return secured_pair(
        shared_files, mosquitto_factory, gateway_factory, gateway_password=USERS["gateway"]
    )


@pytest.fixture
def login(secured: tuple[Mosquitto, GatewayServer]) -> Iterator[Callable[..., Client]]:
    """Connected clients logging in as a user of the shared password file."""
    broker, _ = secured
    made: list[Client] = []

    def make(user: str, password: str | None = None, **kw: object) -> Client:
        kw.setdefault("discovery_wait", 10.0)
        secret = password if password is not None else USERS.get(user, WEAK[1])
        c = Client(broker.url, username=user, password=secret, **kw)  # type: ignore[arg-type]
        c.connect()
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def _next(client: Client, timeout: float = 30.0) -> Message | MessageError:
    item = client.next_message(timeout)
    assert item is not None, "nothing delivered in time"
    return item


def test_writer_offloads_and_a_read_only_user_fetches_byte_exact(
    secured: tuple[Mosquitto, GatewayServer], login: Callable[..., Client]
) -> None:
    _, gw = secured
    topic = "data/e2e/big"
    reader = login("reader")
    reader.subscribe(topic)
    writer = login("writer")
    assert writer.wait_for_endpoint(10) == gw.url
    payload = os.urandom(2 * MiB)
    result = writer.publish(topic, payload, qos=1)
    assert result.route is Route.OFFLOADED
    msg = _next(reader)
    assert isinstance(msg, Message), msg
    assert msg.route is Route.OFFLOADED
    assert msg.payload == payload
    assert msg.sha256 == hashlib.sha256(payload).hexdigest()


def test_failed_gateway_auth_is_an_error_and_chunking_only_when_asked(
    secured: tuple[Mosquitto, GatewayServer],
    login: Callable[..., Client],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, gw = secured
    topic = "data/e2e/weak"
    reader = login("reader")
    reader.subscribe(topic)
    # The broker accepts the weak entry; the gateway cannot do SCRAM with it.
    refused = login(WEAK[0], WEAK[1])
    assert refused.wait_for_endpoint(10) == gw.url
    payload = os.urandom(1 * MiB)
    # A refused login is a configuration error, not a reason to chunk (issue 27).
    with pytest.raises(AccessRefused, match="invalid-proof") as raised:
        refused.publish(topic, payload, qos=1)
    assert raised.value.status == 401
    weak = login(WEAK[0], WEAK[1], fallback_on_auth_failure=True)
    assert weak.wait_for_endpoint(10) == gw.url
    with caplog.at_level(logging.WARNING, logger="client"):
        result = weak.publish(topic, payload, qos=1)
    assert result.route is Route.CHUNKED
    assert "invalid-proof" in caplog.text and "falling back to chunking" in caplog.text
    got = _next(reader)
    assert isinstance(got, Message) and got.route is Route.CHUNKED and got.payload == payload

    # A consumer whose gateway credentials are wrong gets a FetchError naming the cause.
    wrong = login("reader", http_auth=ScramAuth("reader", "not-the-password"))
    wrong.subscribe(topic)
    sent = login("writer").publish(topic, payload, qos=1)
    assert sent.route is Route.OFFLOADED
    assert isinstance(_next(reader), Message)
    err = _next(wrong)
    assert isinstance(err, MessageError) and isinstance(err.error, FetchError)
    assert err.error.status == 401 and "invalid-proof" in str(err.error)


def test_transport_errors_for_wrong_password_and_missing_write_access(
    secured: tuple[Mosquitto, GatewayServer],
) -> None:
    _, gw = secured
    with HttpTransport(timeout=10) as http, PayloadSource(b"x" * 1000) as source:
        with pytest.raises(UploadError, match="invalid-proof") as bad:
            http.upload(
                gw.url,
                "data/t",
                source,
                message_id=MessageId.new(),
                auth=ScramAuth("writer", "wrong"),
            )
        assert bad.value.status == 401
        with pytest.raises(UploadError, match="ACL") as denied:
            http.upload(
                gw.url,
                "data/t",
                source,
                message_id=MessageId.new(),
                auth=ScramAuth("reader", USERS["reader"]),
            )
        assert denied.value.status == 403
        with pytest.raises(UploadError, match="refused the credentials") as anonymous:
            http.upload(gw.url, "data/t", source, message_id=MessageId.new())
        assert anonymous.value.status == 401
        receipt = http.upload(
            gw.url,
            "data/t",
            source,
            message_id=MessageId.new(),
            auth=ScramAuth("writer", USERS["writer"]),
        )
        back = http.fetch(
            f"{receipt.url}/payload",
            expected_sha256=source.sha256,
            auth=ScramAuth("reader", USERS["reader"]),
        )
        assert back.read() == b"x" * 1000


def test_a_streamed_file_upload_is_sent_once_with_scram(
    secured: tuple[Mosquitto, GatewayServer], tmp_path: Path
) -> None:
    """The body is a generator over a file: it cannot be replayed, and needs not be."""
    _, gw = secured
    path = tmp_path / "payload.bin"
    path.write_bytes(os.urandom(3 * MiB))
    sent: list[tuple[str, str | None]] = []

    def record(request: httpx.Request) -> None:
        sent.append((request.method, request.headers.get("content-length")))

    hooked = httpx.Client(timeout=30, event_hooks={"request": [record]})
    with hooked, HttpTransport(client=hooked) as http, PayloadSource(path) as source:
        receipt = http.upload(
            gw.url,
            "data/file",
            source,
            message_id=MessageId.new(),
            auth=ScramAuth("writer", USERS["writer"]),
        )
        payload = http.fetch(
            f"{receipt.url}/payload",
            expected_sha256=source.sha256,
            expected_size=source.size,
            auth=ScramAuth("writer", USERS["writer"]),
        )
    assert payload.read() == path.read_bytes()
    # Probe without body, then the body once; the GET is its own probe.
    assert [method for method, _ in sent] == ["PUT", "PUT", "GET", "GET"]
    assert sent[0][1] == "0" and int(sent[1][1] or 0) == 3 * MiB


def test_bearer_token_instead_of_scram(
    shared_files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    broker = mosquitto_factory(
        max_packet_size=262144,
        extra_config=f"allow_anonymous false\npassword_file {shared_files / 'passwd'}\n"
        f"acl_file {shared_files / 'acl'}\n",
    )
    # tls=True: the gateway is told it sits behind a TLS-terminating proxy, which is what
    # lets it accept bearer tokens at all.
    gw = gateway_factory(
        broker,
        mqtt_username="gateway",
        mqtt_password=USERS["gateway"],
        password_file=shared_files / "passwd",
        acl_file=shared_files / "acl",
        tokens_file=shared_files / "tokens",
        auth_secret="a-shared-secret-for-all-replicas",
        tls=True,
    )
    login = {"username": "writer", "password": USERS["writer"], "discovery_wait": 10.0}
    with (
        Client(broker.url, http_token=TOKEN, **login) as good,  # type: ignore[arg-type]
        Client(broker.url, http_token="wrong-token", **login) as refused,  # type: ignore[arg-type]
        Client(
            broker.url,
            http_token="wrong-token",
            fallback_on_auth_failure=True,
            **login,  # type: ignore[arg-type]
        ) as bad,
    ):
        good.subscribe("data/bearer")
        assert good.wait_for_endpoint(10) == gw.url
        assert bad.wait_for_endpoint(10) == gw.url
        payload = os.urandom(512 * 1024)
        assert refused.wait_for_endpoint(10) == gw.url
        with pytest.raises(AccessRefused):
            refused.publish("data/bearer", payload, qos=1)
        assert good.publish("data/bearer", payload, qos=1).route is Route.OFFLOADED
        assert bad.publish("data/bearer", payload, qos=1).route is Route.CHUNKED
        routes = []
        for _ in range(2):
            msg = _next(good)
            assert isinstance(msg, Message) and msg.payload == payload
            routes.append(msg.route)
        assert sorted(routes) == [Route.CHUNKED, Route.OFFLOADED]


def _offload(*args: str) -> list[str]:
    return [sys.executable, "-m", "client.cli", *args]


def test_cli_publish_and_subscribe_with_username_and_password(
    secured: tuple[Mosquitto, GatewayServer], tmp_path: Path
) -> None:
    broker, gw = secured
    topic = "data/e2e/cli"
    source = tmp_path / "in.bin"
    source.write_bytes(os.urandom(2 * MiB + 17))
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    common = ["--broker", broker.url, "--topic", topic, "--discovery-wait", "10"]
    sub = subprocess.Popen(
        _offload(
            "subscribe",
            *common,
            "--username",
            "reader",
            "--password",
            USERS["reader"],
            "--count",
            "1",
            "--timeout",
            "60",
            "--out",
            str(out),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        # The subscriber must be subscribed before the publish (no retained message).
        time.sleep(1.5)
        pub = subprocess.run(
            _offload(
                "publish",
                *common,
                "--username",
                "writer",
                "--password",
                USERS["writer"],
                "--file",
                str(source),
            ),
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert pub.returncode == 0, pub.stderr
        sent = json.loads(pub.stdout)
        assert sent["route"] == "offloaded" and sent["url"].startswith(gw.url)
        stdout, stderr = sub.communicate(timeout=90)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.communicate()
    assert sub.returncode == 0, stderr
    got = json.loads(stdout.splitlines()[0])
    assert got["route"] == "offloaded" and got["sha256"] == sent["sha256"]
    assert Path(got["file"]).read_bytes() == source.read_bytes()
