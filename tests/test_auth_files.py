"""gateway.auth's readers of mosquitto's password file, ACL file and the tokens file."""

from __future__ import annotations

import base64
import hashlib
import subprocess
from pathlib import Path

import pytest
from scramp import ScramMechanism

from gateway.auth import (
    SCRAM_MIN_ITERATIONS,
    filter_matches,
    parse_acl,
    parse_password_file,
    parse_tokens_file,
    token_digest,
)
from gateway.auth._acl import READ, WRITE, AclSyntaxError, base_topic


def passwd(path: Path, user: str, password: str, *extra: str) -> str:
    create = [] if path.exists() else ["-c"]
    subprocess.run(
        ["mosquitto_passwd", *create, "-b", *extra, str(path), user, password],
        check=True,
        capture_output=True,
    )
    return path.read_text()


def test_real_mosquitto_passwd_entries(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    passwd(path, "strong", "s3cret", "-H", "sha512-pbkdf2", "-I", "4096")
    passwd(path, "default", "d3fault")
    passwd(path, "legacy", "l3gacy", "-H", "sha512")
    parsed = parse_password_file(path.read_text())
    assert parsed.problems == ()
    strong, default, legacy = (parsed.entries[u] for u in ("strong", "default", "legacy"))
    assert (strong.scheme, strong.iterations) == ("sha512-pbkdf2", 4096)
    assert (default.scheme, default.iterations) == ("sha512-pbkdf2", 101)
    assert legacy.scheme == "sha512"
    assert strong.verify("s3cret") and not strong.verify("s3cret ")
    assert default.verify("d3fault") and not default.verify("x")
    assert legacy.verify("l3gacy") and not legacy.verify("L3gacy")
    assert parsed.weak_users == ("default", "legacy")
    assert default.scram_keys() is None and legacy.scram_keys() is None
    # The file's hash is SCRAM's SaltedPassword: the keys equal scramp's from the password.
    keys = strong.scram_keys()
    assert keys is not None
    salt, stored, server, iterations = ScramMechanism("SCRAM-SHA-512").make_auth_info(
        "s3cret", iteration_count=4096, salt=strong.salt
    )
    assert (keys.salt, keys.stored_key, keys.server_key, keys.iterations) == (
        salt,
        stored,
        server,
        iterations,
    )
    assert "s3cret" not in repr(strong) and base64.b64encode(strong.digest).decode() not in repr(
        strong
    )


def test_password_file_tolerates_what_mosquitto_tolerates() -> None:
    good = (
        "$7$4096$"
        + base64.b64encode(b"s" * 12).decode()
        + "$"
        + base64.b64encode(b"h" * 64).decode()
    )
    text = "\n".join(
        [
            "# comment",
            "no colon here",
            f"alice:{good}",
            "bob:plaintext",
            "carol:$7$0$AAAA$BBBB",
            "dave:$7$4096$" + base64.b64encode(b"short").decode() + "$xx",
            "erin",
            f"  frank  :  {good}  \r",
            f"alice:{good.replace('4096', '5000')}",
        ]
    )
    parsed = parse_password_file(text)
    assert sorted(parsed.entries) == ["alice", "frank"]
    assert parsed.entries["alice"].iterations == 5000  # the later entry wins
    assert len(parsed.problems) == 4
    assert parsed.typical_iterations in (4096, 5000)
    assert SCRAM_MIN_ITERATIONS == 4096


def test_acl_parsing_follows_mosquitto() -> None:
    acl = parse_acl(
        "\n".join(
            [
                "# comment",
                "topic read",  # the topic "read", read-write
                "topic deny secret/#",
                "topic read  with  spaces ",
                "",
                "user  alice ",
                "topic write a/#",
                "user bob",
                "user alice",
                "topic read b",
                "pattern write home/%u/#",
                "pattern deny home/%c/#",
            ]
        )
    )
    assert acl.anonymous is not None and acl.anonymous[0].topic_filter == "secret/#"
    assert acl.allows(None, "read", READ) and acl.allows(None, "read", WRITE)
    assert acl.allows(None, "with  spaces", READ)
    assert acl.users["alice"][0].topic_filter == "a/#" and len(acl.users["alice"]) == 2
    assert "bob" not in acl.users
    assert acl.allows("alice", "a", WRITE) and not acl.allows("alice", "a", READ)
    assert acl.allows("bob", "home/bob/x", WRITE, client_id="c")
    assert not acl.allows("bob", "home/c/x", WRITE, client_id="c")
    # No client id over HTTP: the %c deny applies to any id (so here to all of home/).
    assert not acl.allows("bob", "home/bob/x", WRITE)
    for bad in [
        "topic",
        "topic bad x",
        "\ttopic x",
        " # indented comment",
        "user",
        "topic a/#/b",
        "topic read a+",
        "bogus line",
    ]:
        with pytest.raises(AclSyntaxError):
            parse_acl(bad)


@pytest.mark.parametrize(
    "topic_filter,topic,expected",
    [
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("#", "x", True),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("a/+", "a/", True),
        ("a/+", "a", False),
        ("a/+/c", "a/b/c", True),
        ("a/b", "a/b/c", False),
        ("a", "a/+", False),
        ("", "a", False),
    ],
)
def test_filter_matches(topic_filter: str, topic: str, expected: bool) -> None:
    assert filter_matches(topic_filter, topic) is expected


def test_dollar_topics_and_dangerous_names() -> None:
    acl = parse_acl("user u\ntopic read #\ntopic read $SYS/x\npattern read p/%u\n")
    assert not acl.allows("u", "$SYS/y", READ) and acl.allows("u", "$SYS/x", READ)
    assert not acl.allows("a+b", "p/a+b", READ)


def test_base_topic() -> None:
    assert base_topic("a/b+oversized") == "a/b"
    assert base_topic("a/b") == "a/b"
    assert base_topic("+oversized") == "+oversized"


def test_tokens_file() -> None:
    digest = hashlib.sha256(b"tok").hexdigest()
    assert token_digest("tok") == digest
    assert parse_tokens_file(f"# c\n\nalice:{digest.upper()}\n") == {digest: "alice"}
    for bad in ["alice", f"alice:{digest[:-1]}", f"a:{digest}\nb:{digest}"]:
        with pytest.raises(ValueError):
            parse_tokens_file(bad)
