"""Every `offload` command against a gateway with a password file: a wrong password, a
missing one and the right one, each one line and its exit code (issue 27).

The broker here takes anyone (no password file), so what is tested is the gateway's refusal
alone: the case where `publish` used to warn, chunk and exit 0. The gateway has no
`s3_public_url` (no direct transfers): a publish is offloaded through the gateway.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from client.http._scram import ScramAuth

from _auth import AUTH_SECRET, broker_readable_dir, write_acl_file, write_password_file
from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

OFFLOAD = shutil.which("offload") or "offload"
USERS = {"writer": "w-secret-1", "reader": "r-secret-2"}
ACL = """\
user writer
topic readwrite data/#
user reader
topic read data/#
"""
BIG = 100_000  # over the broker's 64 KiB: a publish is offloaded


@dataclass(frozen=True)
class Secured:
    broker: Mosquitto
    gateway: GatewayServer
    files: Path
    message_url: str  # a payload stored by `writer`, retained on RETAINED_TOPIC
    payload: bytes


RETAINED_TOPIC = "data/cli-auth/retained"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env["OFFLOAD_CONFIG"] = os.devnull
    return {**env, **extra}


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OFFLOAD, *args], capture_output=True, text=True, timeout=120, env=env or _env()
    )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    from client import Client
    from gateway import Settings

    files = broker_readable_dir("offload-cli-auth-")
    write_password_file(files / "passwd", [(u, p, 4096) for u, p in USERS.items()])
    write_acl_file(files / "acl", ACL)
    store = tmp_path_factory.mktemp("cli-auth-store")
    broker = Mosquitto(max_packet_size=65536).start()
    gw = GatewayServer(
        Settings(  # type: ignore[call-arg]
            storage_url=f"file://{store}",
            mqtt_url=broker.url,
            password_file=files / "passwd",
            acl_file=files / "acl",
            auth_secret=AUTH_SECRET,
            discovery_interval=5.0,
        )
    )
    gw.start()
    try:
        payload = os.urandom(BIG)
        with Client(
            broker.url, username="writer", password=USERS["writer"], endpoint=gw.url
        ) as writer:
            sent = writer.publish(RETAINED_TOPIC, payload, qos=1, retain=True)
        assert sent.url is not None
        yield Secured(broker, gw, files, sent.url, payload)
    finally:
        gw.stop()
        broker.close()
        shutil.rmtree(files, ignore_errors=True)


WRONG = ("--username", "writer", "--password", "not-the-password")
MISSING = ("--username", "writer")  # no password at all: the gateway demands one
RIGHT = ("--username", "writer", "--password", USERS["writer"])
READER = ("--username", "reader", "--password", USERS["reader"])


@dataclass(frozen=True)
class Login:
    """A command with one kind of login: its exit code and words its one stderr line holds."""

    command: str
    login: tuple[str, ...]
    code: int
    says: str


def _args(command: str, s: Secured, tmp: Path) -> tuple[str, ...]:
    big = tmp / "big.bin"
    if not big.exists():
        big.write_bytes(os.urandom(BIG))
    return {
        "publish": ("publish", "--broker", s.broker.url, "-t", "data/cli-auth/pub",
                    "-f", str(big), "--discovery-wait", "10"),
        "upload": ("upload", "--endpoint", s.gateway.url, "-t", "data/cli-auth/up",
                   "-f", str(big), "--state-dir", str(tmp / "state")),
        "fetch": ("fetch", s.message_url, "-o", str(tmp / "fetched.bin")),
    }[command]  # fmt: skip


REFUSED_LOGIN = "SCRAM authentication as 'writer' failed: invalid-proof"
NO_LOGIN = "log in with --username and --password, or OFFLOAD_USERNAME/OFFLOAD_PASSWORD"
TABLE = {
    "publish, wrong password": Login("publish", WRONG, 6, REFUSED_LOGIN),
    "publish, missing password": Login("publish", MISSING, 6, NO_LOGIN),
    "publish, no login at all": Login("publish", (), 6, NO_LOGIN),
    "publish, a user the ACL refuses the topic": Login(
        "publish", READER, 6, "HTTP 403: not allowed to write"
    ),
    "upload, wrong password": Login("upload", WRONG, 6, REFUSED_LOGIN),
    "upload, missing password": Login("upload", MISSING, 6, NO_LOGIN),
    "fetch, wrong password": Login("fetch", WRONG, 6, REFUSED_LOGIN),
    "fetch, missing password": Login("fetch", MISSING, 6, NO_LOGIN),
}


@pytest.mark.parametrize("case", list(TABLE))
def test_a_refused_login_is_one_line_and_exit_6(
    case: str, secured: Secured, tmp_path: Path
) -> None:
    row = TABLE[case]
    result = run(*_args(row.command, secured, tmp_path), *row.login)
    assert result.returncode == row.code, result.stderr
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no traceback
    assert result.stderr.startswith("offload: access refused: "), result.stderr
    assert row.says in result.stderr
    assert "Traceback" not in result.stderr and "not-the-password" not in result.stderr
    assert not (tmp_path / "fetched.bin").exists()


@pytest.mark.parametrize("command", ["publish", "upload", "fetch"])
def test_the_right_password_works_for_every_command(
    command: str, secured: Secured, tmp_path: Path
) -> None:
    result = run(*_args(command, secured, tmp_path), *RIGHT)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    doc = json.loads(result.stdout)
    assert doc["route"] == "offloaded"
    if command == "fetch":
        assert (tmp_path / "fetched.bin").read_bytes() == secured.payload
        assert doc["sha256"] == hashlib.sha256(secured.payload).hexdigest()
    else:
        back = httpx.get(
            str(doc["url"]) + "/payload", auth=ScramAuth("writer", USERS["writer"]), timeout=30
        )
        assert back.status_code == 200
        assert back.content == (tmp_path / "big.bin").read_bytes()


def test_fetch_logs_in_from_the_environment_and_the_config_file(
    secured: Secured, tmp_path: Path
) -> None:
    out = tmp_path / "fetched.bin"
    args = ("fetch", secured.message_url, "-o", str(out))
    env = _env(OFFLOAD_USERNAME="reader", OFFLOAD_PASSWORD=USERS["reader"])
    assert run(*args, env=env).returncode == 0
    assert out.read_bytes() == secured.payload
    out.unlink()
    config = tmp_path / "offload.toml"
    config.write_text(f'username = "reader"\npassword = "{USERS["reader"]}"\n')
    # The config file's login, and the flag over the environment's wrong password.
    assert run(*args, "--config", str(config)).returncode == 0
    wrong_env = _env(OFFLOAD_USERNAME="reader", OFFLOAD_PASSWORD="wrong")
    assert run(*args, "--password", USERS["reader"], env=wrong_env).returncode == 0
    # The login in the broker URL, as publish and subscribe take it.
    in_url = _env(OFFLOAD_BROKER=f"mqtt://reader:{USERS['reader']}@127.0.0.1:1")
    assert run(*args, env=in_url).returncode == 0
    # The environment over the config file: refused.
    refused = run(*args, "--config", str(config), env=wrong_env)
    assert refused.returncode == 6, refused.stderr
    assert out.read_bytes() == secured.payload


def test_publish_falls_back_on_a_refused_login_only_when_asked(
    secured: Secured, tmp_path: Path
) -> None:
    args = _args("publish", secured, tmp_path)
    flag = run(*args, *WRONG, "--fallback-on-auth-failure")
    assert flag.returncode == 0, flag.stderr
    assert json.loads(flag.stdout)["route"] == "chunked"
    env = run(*args, *WRONG, env=_env(OFFLOAD_FALLBACK_ON_AUTH_FAILURE="true"))
    assert env.returncode == 0, env.stderr
    assert json.loads(env.stdout)["route"] == "chunked"


def test_subscribe_with_a_refused_login_stops_with_one_line(secured: Secured) -> None:
    """The retained placeholder arrives at once; its fetch is refused: its error line on
    stdout (as for any failed message), then one line on stderr and exit 6, as every command
    ends on a refused login."""
    base = ("subscribe", "--broker", secured.broker.url, "-t", RETAINED_TOPIC, "--timeout",
            "30", "--discovery-wait", "10")  # fmt: skip
    for login, says in ((WRONG, REFUSED_LOGIN), (MISSING, NO_LOGIN)):
        result = run(*base, *login)  # no --count: only the refusal ends it
        assert result.returncode == 6, result.stderr
        (line,) = result.stdout.splitlines()
        doc = json.loads(line)
        assert doc["error"] == "access refused" and says in doc["detail"], doc
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("offload: access refused: "), result.stderr
        assert says in result.stderr and "not-the-password" not in result.stderr
    right = run(*base, "--count", "1", *RIGHT)
    assert right.returncode == 0, right.stderr
    doc = json.loads(right.stdout)
    assert doc["sha256"] == hashlib.sha256(secured.payload).hexdigest()
    assert doc["route"] == "offloaded" and doc["id"] == secured.message_url.rsplit("/", 1)[1]
