"""The gateway decides as mosquitto's dynamic security plugin does, user for user, topic for topic.

A real mosquitto 2 runs the plugin; clients, groups and roles are created with
``mosquitto_ctrl`` while it runs, after the gateway's authenticator was built on the same
file (the plugin rewrites it at every change; the gateway re-reads it, no restart). For a
table of (user, topic, publish / subscribe) the broker's answers, observed through real MQTT
operations (PUBACK 0x87 for a refused publish; a subscriber of exactly the topic that gets
the message or not), must equal the gateway's, logging in with the same password.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.auth import Authenticated, Authenticator

from _dynsec import DynsecBroker, directory, plugin_path, start_dynsec_broker
from _mqtt_session import Session

__all__ = ["directory"]  # the shared fixture

pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(plugin_path() is None, reason="mosquitto's dynsec plugin missing"),
]

PASSWORDS = {
    "alice": "pw-alice",
    "bob": "pw-bob",
    "carol": "pw-carol",
    "dave": "pw-dave",
    "eve": "pw-eve",
    "frank": "pw-frank",  # disabled after creation
    "mallory": "pw-mallory",  # never created
    "feeder": "pw-feeder",
}
USERS: list[str | None] = [None, "alice", "bob", "carol", "dave", "eve", "frank", "mallory"]
TOPICS = [
    "sensors/t1",
    "sensors/secret",
    "sensors/private",
    "shared/x",
    "ops/alice",
    "ops/x",
    "lit/a",
    "lit/b",
    "home/eve/x",
    "home/%u/x",
    "public/news",
    "public/hidden",
    "other",
]

# (role, [(acltype, topic, allow|deny, priority)])
ROLES = {
    "sensors": [
        ("publishClientSend", "sensors/#", "allow", 1),
        ("publishClientSend", "sensors/secret", "deny", 5),  # ACL priority within a role
        ("subscribePattern", "sensors/#", "allow", 0),
        ("publishClientReceive", "sensors/private", "deny", 0),  # subscribed, not received
    ],
    "lo": [
        ("publishClientSend", "shared/#", "deny", 0),
        ("subscribePattern", "shared/#", "deny", 0),
    ],
    "hi": [
        ("publishClientSend", "shared/#", "allow", 0),
        ("subscribePattern", "shared/#", "allow", 0),
        ("publishClientSend", "ops/alice", "allow", 0),
    ],
    "opsrole": [
        ("publishClientSend", "ops/#", "allow", 0),
        ("subscribePattern", "ops/#", "allow", 0),
    ],
    "mutedrole": [
        ("publishClientSend", "ops/#", "deny", 0),
        ("subscribePattern", "ops/#", "deny", 0),
    ],
    "lit": [
        ("subscribeLiteral", "lit/a", "allow", 0),  # a role's literal ACL before its patterns
        ("subscribePattern", "lit/#", "deny", 9),
        ("publishClientSend", "lit/#", "allow", 0),
    ],
    "patterns": [  # mosquitto 2.0 reads %u as text
        ("publishClientSend", "home/%u/#", "allow", 0),
        ("subscribePattern", "home/%u/#", "allow", 0),
    ],
    "guestrole": [
        ("publishClientSend", "public/#", "allow", 0),
        ("subscribePattern", "public/#", "allow", 0),
        ("publishClientReceive", "public/hidden", "deny", 0),
    ],
    "feed": [("publishClientSend", "#", "allow", 0)],
    "sync": [("subscribePattern", "sync/#", "allow", 0)],
}
CLIENT_ROLES = {
    "alice": [("lo", 1), ("hi", 2), ("sensors", 0)],  # hi before lo: shared/x allowed
    "bob": [("lo", 5), ("hi", 1)],  # lo before hi: shared/x denied
    "carol": [],
    "dave": [],
    "eve": [("patterns", 0), ("lit", 0)],
    "frank": [("sensors", 0)],
    "feeder": [("feed", 0)],
}
GROUPS = {
    "ops": ("opsrole", [("carol", 1), ("dave", 2)]),
    "muted": ("mutedrole", [("carol", 2), ("dave", 1), ("alice", 1)]),
    "guests": ("guestrole", []),
}


def administer(broker: DynsecBroker) -> None:
    """Everything through mosquitto_ctrl, with the broker running."""
    ctrl = broker.ctrl
    for role, acls in ROLES.items():
        ctrl("createRole", role)
        for acltype, topic, verdict, priority in acls:
            ctrl("addRoleACL", role, acltype, topic, verdict, str(priority))
    for user, roles in CLIENT_ROLES.items():
        ctrl("createClient", user, "-p", PASSWORDS[user])
        for role, priority in [*roles, ("sync", -1000)]:
            ctrl("addClientRole", user, role, str(priority))
    for group, (role, members) in GROUPS.items():
        ctrl("createGroup", group)
        ctrl("addGroupRole", group, role)
        for user, priority in members:
            ctrl("addGroupClient", group, user, str(priority))
    ctrl("addGroupRole", "guests", "sync", "-1000")
    ctrl("setAnonymousGroup", "guests")
    ctrl("disableClient", "frank")


def observe(port: int, user: str | None, feeder: Session) -> tuple[set[str], set[str]]:
    """What mosquitto lets `user` publish, and which topics reach it as a subscriber."""
    login = None if user is None else (user, PASSWORDS[user])
    publisher = Session(port, login)
    if publisher.refused:  # a disabled or unknown client: no login, nothing at all
        publisher.close()
        return set(), set()
    codes = publisher.publish_all(TOPICS)
    publisher.close()
    assert set(codes.values()) <= {0x00, 0x10, 0x87}, codes
    written = {topic for topic, code in codes.items() if code < 0x80}
    subscriber = Session(port, login)
    sync = f"sync/{uuid.uuid4().hex[:8]}"
    subscriber.client.subscribe([(t, 1) for t in [*TOPICS, sync]])
    assert subscriber.subscribed.wait(10)
    feeder.publish_all([*TOPICS, sync])  # in order: the sync message comes last
    assert subscriber.synced.wait(10), user
    subscriber.close()
    return written, set(subscriber.received)


def gateway_decides(auth: Authenticator, user: str | None) -> tuple[set[str], set[str]]:
    """What the gateway lets `user` upload and fetch, logging in with its password."""
    header = None
    if user is not None:
        header = "Basic " + base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
    who = auth.authenticate(header, client="192.0.2.1")
    if not isinstance(who, Authenticated):
        return set(), set()
    written = {t for t in TOPICS if auth.allows(who, t, write=True)}
    read = {t for t in TOPICS if auth.allows(who, t, write=False)}
    return written, read


def test_gateway_decides_as_the_dynsec_plugin(
    directory: Path, mosquitto_factory: Callable[..., object]
) -> None:
    broker = start_dynsec_broker(mosquitto_factory, directory)
    # Built before any of these clients exists: it must see them without a restart.
    auth = Authenticator(
        password_file=None,
        acl_file=None,
        dynsec_file=broker.file,
        realm="t",
        secret=b"s" * 32,
        tls=True,
        allow_anonymous=True,
        max_failures_per_address=1000,
    )
    early = auth.authenticate("Basic " + base64.b64encode(b"alice:pw-alice").decode(), client="x")
    assert not isinstance(early, Authenticated)  # alice does not exist yet
    administer(broker)
    feeder = Session(broker.port, ("feeder", PASSWORDS["feeder"]))
    rows: list[str] = []
    mismatches: list[str] = []
    counts = {"allowed": 0, "denied": 0}
    try:
        for user in USERS:
            broker_w, broker_r = observe(broker.port, user, feeder)
            ours_w, ours_r = gateway_decides(auth, user)
            for topic in TOPICS:
                for op, theirs, ours in (
                    ("publish", topic in broker_w, topic in ours_w),
                    ("subscribe", topic in broker_r, topic in ours_r),
                ):
                    counts["allowed" if theirs else "denied"] += 1
                    verdict = "allow" if theirs else "deny"
                    rows.append(f"{user or '(anonymous)':12} {topic:16} {op:9} {verdict}")
                    if theirs != ours:
                        mismatches.append(f"{rows[-1]}: gateway says {not theirs}")
    finally:
        feeder.close()
    print("\nuser         topic            operation mosquitto = gateway\n" + "\n".join(rows))
    assert not mismatches, "\n".join(mismatches)
    assert counts["allowed"] >= 20 and counts["denied"] >= 60, counts
    # The rows the table is about, spelled out: priorities, groups, literal ACLs, disabled.
    table = set(rows)
    for row in [
        "alice        shared/x         publish   allow",  # role hi (2) before lo (1)
        "bob          shared/x         publish   deny",  # role lo (5) before hi (1)
        "carol        ops/x            publish   deny",  # group muted (2) before ops (1)
        "dave         ops/x            publish   allow",  # group ops (2) before muted (1)
        "alice        ops/alice        publish   allow",  # own role before any group
        "alice        sensors/secret   publish   deny",  # ACL priority 5 before 1
        "alice        sensors/private  subscribe deny",  # subscribed, receive denied
        "eve          lit/a            subscribe allow",  # literal before pattern
        "eve          home/eve/x       publish   deny",  # 2.0: %u is text
        "eve          home/%u/x        publish   allow",
        "(anonymous)  public/news      subscribe allow",  # the anonymous group
        "frank        sensors/t1       publish   deny",  # disabled
    ]:
        assert row in table, row
