"""The ACL reading of gateway.auth agrees with a running mosquitto, rule for rule.

For a table of users and topics, a real mosquitto 2 with the same password and ACL files
decides whether a publish is accepted (MQTT 5 PUBACK: 0x87 when refused) and whether a
message is delivered to a subscriber; ``Acl.allows`` must give the same answers.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties

from gateway.auth import Authenticator, parse_acl
from gateway.auth._acl import READ, WRITE

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


class Session:
    """One MQTT 5 client as a given user, recording PUBACK codes and deliveries."""

    def __init__(self, port: int, user: str | None, client_id: str) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
        )
        if user is not None:
            self.client.username_pw_set(user, USERS[user])
        self.acks: dict[int, int] = {}
        self.received: list[str] = []
        self.synced = threading.Event()
        self.sync_topic = "sync/anon" if user is None else f"sync/{user.replace('+', '')}"
        self.connected = threading.Event()
        self.subscribed = threading.Event()
        self.client.on_subscribe = lambda c, u, mid, codes, p: self.subscribed.set()
        self.client.on_connect = lambda c, u, f, rc, p: self.connected.set()
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self.connected.wait(10)

    def _on_publish(
        self,
        client: mqtt.Client,
        userdata: object,
        mid: int,
        reason: mqtt.ReasonCode,
        props: Properties,
    ) -> None:
        self.acks[mid] = reason.value

    def _on_message(self, client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        if message.topic == self.sync_topic:
            self.synced.set()
        else:
            self.received.append(message.topic)

    def publish_all(self, topics: list[str]) -> dict[str, int]:
        infos = {t: self.client.publish(t, b"x", qos=1) for t in topics}
        for info in infos.values():
            info.wait_for_publish(10)
        return {t: self.acks[info.mid] for t, info in infos.items()}

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


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
    admin = Session(port, "admin", "admin")
    mismatches: list[str] = []
    checked = {"read": 0, "write": 0, "allowed": 0, "denied": 0}
    try:
        for user in CLIENTS:
            name = user or "anon"
            # Writes: the broker's PUBACK reason code says whether it took the message.
            publisher = Session(port, user, f"pub-{name}")
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
            subscriber = Session(port, user, f"sub-{name}")
            subscriber.client.subscribe("#", 1)
            assert subscriber.subscribed.wait(10)
            admin.publish_all([*TOPICS, subscriber.sync_topic])
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
    session = Session(broker.port, None, "anon-empty")  # type: ignore[attr-defined]
    try:
        codes = session.publish_all(["x", "y/z"])
    finally:
        session.close()
    assert codes == {"x": 0x87, "y/z": 0x87}
    acl = parse_acl(acl_path.read_text())
    assert not acl.allows(None, "x", WRITE) and not acl.allows(None, "y/z", WRITE)
