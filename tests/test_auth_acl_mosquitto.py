"""The ACL reading of gateway.auth agrees with a running mosquitto, rule for rule.

For a table of users and topics, a real mosquitto 2 with the same password and ACL files
decides whether a publish is accepted (MQTT 5 PUBACK: 0x87 when refused) and whether a
message is delivered to a subscriber; ``Acl.allows`` must give the same answers.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.auth import Authenticator, parse_acl
from gateway.auth._acl import READ, WRITE

from _mqtt_session import Session

pytestmark = pytest.mark.servers

ACL = """\
# anonymous clients
topic read public/#
topic deny public/hidden
topic readwrite anon/rw
topic read sync/anon

user alice
topic readwrite a/#
topic deny a/secret
topic read shared/+
topic write drop
topic readwrite home/alice/locked

user bob
topic read a/#
topic b/x
topic read  spaced  out

user admin
topic readwrite #

user x+y
topic read sync/xy

pattern readwrite home/%u/#
pattern deny home/%u/locked
pattern read dev/%c/state
pattern read sync/%u
"""

USERS = {
    "alice": "pw-alice",
    "bob": "pw-bob",
    "carol": "pw-carol",
    "admin": "pw-admin",
    "x+y": "pw-xy",
}
TOPICS = [
    "public/news",
    "public/hidden",
    "anon/rw",
    "a/1",
    "a/secret",
    "a",
    "shared/x",
    "shared/x/y",
    "drop",
    "b/x",
    "home/alice/1",
    "home/alice/locked",
    "home/bob/1",
    "home/bob/locked",
    "home/carol/2",
    "home/carol/locked",
    "dev/sub-alice/state",
    "dev/sub-bob/state",
    "other",
    "read",
    "spaced  out",
]
CLIENTS: list[str | None] = [None, "alice", "bob", "carol", "x+y"]


def make_password_file(path: Path, users: dict[str, str]) -> None:
    for index, (user, password) in enumerate(users.items()):
        create = ["-c"] if index == 0 else []
        subprocess.run(
            ["mosquitto_passwd", *create, "-b", "-I", "4096", str(path), user, password],
            check=True,
            capture_output=True,
        )


def sync_topic(user: str | None) -> str:
    """A topic each user may read: its message ends that user's batch of deliveries."""
    return "sync/anon" if user is None else f"sync/{user.replace('+', '')}"


def session(port: int, user: str | None, client_id: str) -> Session:
    login = None if user is None else (user, USERS[user])
    mine = sync_topic(user)
    return Session(port, login, client_id, is_sync=lambda topic: topic == mine)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory mosquitto can read after dropping root (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="auth-acl-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def broker_with_acl(
    shared_dir: Path, mosquitto_factory: Callable[..., object]
) -> tuple[int, Path, Path]:
    passwords = shared_dir / "passwd"
    acl = shared_dir / "acl"
    make_password_file(passwords, USERS)
    acl.write_text(ACL)
    passwords.chmod(0o644)
    broker = mosquitto_factory(
        extra_config=(f"password_file {passwords}\nacl_file {acl}\nallow_anonymous true\n")
    )
    return broker.port, passwords, acl  # type: ignore[attr-defined]


def test_acl_matches_mosquitto(broker_with_acl: tuple[int, Path, Path]) -> None:
    port, passwords, acl_path = broker_with_acl
    acl = parse_acl(acl_path.read_text())
    admin = session(port, "admin", "admin")
    mismatches: list[str] = []
    checked = {"read": 0, "write": 0, "allowed": 0, "denied": 0}
    try:
        for user in CLIENTS:
            name = user or "anon"
            # Writes: the broker's PUBACK reason code says whether it took the message.
            publisher = session(port, user, f"pub-{name}")
            codes = publisher.publish_all(TOPICS)
            publisher.close()
            for topic, code in codes.items():
                broker_says = code < 0x80
                assert code in (0x00, 0x10, 0x87), (user, topic, code)
                ours = acl.allows(user, topic, WRITE, client_id=f"pub-{name}")
                checked["write"] += 1
                checked["allowed" if broker_says else "denied"] += 1
                if broker_says != ours:
                    mismatches.append(f"write {name} {topic}: mosquitto={broker_says}")
            # Reads: subscribe to everything, admin publishes each topic, then a sync
            # message on a topic this user may read; deliveries before it are complete.
            subscriber = session(port, user, f"sub-{name}")
            subscriber.client.subscribe("#", 1)
            assert subscriber.subscribed.wait(10)
            admin.publish_all([*TOPICS, sync_topic(user)])
            assert subscriber.synced.wait(10)
            subscriber.close()
            for topic in TOPICS:
                broker_says = topic in subscriber.received
                ours = acl.allows(user, topic, READ, client_id=f"sub-{name}")
                checked["read"] += 1
                checked["allowed" if broker_says else "denied"] += 1
                if broker_says != ours:
                    mismatches.append(f"read {name} {topic}: mosquitto={broker_says}")
    finally:
        admin.close()
    assert not mismatches, "\n".join(mismatches)
    # The table exercises both outcomes, not just one.
    assert checked["allowed"] > 20 and checked["denied"] > 20, checked

    # The Authenticator gives the same answers for topics where no client id is involved.
    auth = Authenticator(
        password_file=passwords,
        acl_file=acl_path,
        realm="t",
        secret=b"s" * 32,
        tls=False,
        allow_anonymous=True,
    )
    for user in CLIENTS:
        for topic in TOPICS:
            if topic.startswith("dev/"):
                continue
            assert auth.can_write(user, topic) == acl.allows(user, topic, WRITE)
            assert auth.can_read(user, topic + "+oversized") == acl.allows(user, topic, READ)


def test_empty_acl_file_refuses_everything(
    shared_dir: Path, mosquitto_factory: Callable[..., object]
) -> None:
    acl_path = shared_dir / "acl"
    acl_path.write_text("# nothing granted\n")
    broker = mosquitto_factory(extra_config=f"acl_file {acl_path}\nallow_anonymous true\n")
    anonymous = session(broker.port, None, "anon-empty")  # type: ignore[attr-defined]
    try:
        codes = anonymous.publish_all(["x", "y/z"])
    finally:
        anonymous.close()
    assert codes == {"x": 0x87, "y/z": 0x87}
    acl = parse_acl(acl_path.read_text())
    assert not acl.allows(None, "x", WRITE) and not acl.allows(None, "y/z", WRITE)
