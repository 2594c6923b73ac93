"""gateway.auth.Authenticator without HTTP: SCRAM steps, replicas, limits, junk, reloads."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scramp import ScramClient

from gateway.auth import (
    AuthConfigError,
    Authenticated,
    Authenticator,
    AuthMode,
    Challenge,
    token_digest,
)
from gateway.auth._limits import FailureLimiter, ReplayGuard
from gateway.auth._scram import parse_authorization

SECRET = b"0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def auth_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files for the property test: module-scoped (hypothesis refuses function-scoped
    fixtures) and under pytest's own temporary directories (a module-level `mkdtemp` left
    one directory in /tmp per run)."""
    return tmp_path_factory.mktemp("authfuzz")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def passwd(path: Path, user: str, password: str, *extra: str) -> None:
    create = [] if path.exists() else ["-c"]
    subprocess.run(
        ["mosquitto_passwd", *create, "-b", *extra, str(path), user, password],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "passwd"
    passwd(path, "alice", "alice-pw", "-I", "4096")
    passwd(path, "weak", "weak-pw")
    return path


def make(password_file: Path | None, clock: Clock | None = None, **kw: object) -> Authenticator:
    options: dict[str, object] = {
        "acl_file": None,
        "realm": "r",
        "secret": SECRET,
        "tls": False,
        "allow_anonymous": False,
        "clock": clock or Clock(),
    }
    options.update(kw)
    return Authenticator(password_file=password_file, **options)  # type: ignore[arg-type]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def first(
    auth: Authenticator, user: str, password: str, client: str = "192.0.2.1"
) -> tuple[ScramClient, str, Challenge]:
    scram = ScramClient(["SCRAM-SHA-512"], user, password)
    result = auth.authenticate(f"SCRAM-SHA-512 data={b64(scram.get_client_first())}", client=client)
    assert isinstance(result, Challenge)
    return scram, result.headers["WWW-Authenticate"], result


def final_header(scram: ScramClient, challenge: str) -> str:
    params = dict(p.strip().split("=", 1) for p in challenge.split(" ", 1)[1].split(","))
    scram.set_server_first(base64.b64decode(params["data"]).decode())
    return f"SCRAM-SHA-512 sid={params['sid']},data={b64(scram.get_client_final())}"


def login(
    auth: Authenticator, user: str, password: str, client: str = "192.0.2.1"
) -> Authenticated | Challenge:
    scram, challenge, _ = first(auth, user, password, client)
    return auth.authenticate(final_header(scram, challenge), client=client)


def test_scram_success_and_server_signature(password_file: Path) -> None:
    auth = make(password_file)
    scram, challenge, result = first(auth, "alice", "alice-pw")
    assert result.status == 401 and challenge.startswith("SCRAM-SHA-512 sid=v1.")
    ok = auth.authenticate(final_header(scram, challenge), client="c")
    assert isinstance(ok, Authenticated) and ok.user == "alice"
    info = dict(
        p.strip().split("=", 1) for p in ok.response_headers["Authentication-Info"].split(",")
    )
    scram.set_server_final(base64.b64decode(info["data"]).decode())  # raises if forged


def test_another_replica_finishes_the_exchange(password_file: Path) -> None:
    clock = Clock()
    one, two = make(password_file, clock), make(password_file, clock)
    scram, challenge, _ = first(one, "alice", "alice-pw")
    assert isinstance(two.authenticate(final_header(scram, challenge), client="c"), Authenticated)
    # A replica with another secret cannot.
    other = make(password_file, clock, secret=b"x" * 32)
    scram, challenge, _ = first(one, "alice", "alice-pw")
    assert isinstance(other.authenticate(final_header(scram, challenge), client="c"), Challenge)


def test_replay_and_expiry(password_file: Path) -> None:
    clock = Clock()
    auth = make(password_file, clock)
    scram, challenge, _ = first(auth, "alice", "alice-pw")
    header = final_header(scram, challenge)
    assert isinstance(auth.authenticate(header, client="c"), Authenticated)
    replay = auth.authenticate(header, client="c")
    assert isinstance(replay, Challenge) and replay.status == 401
    # Expired sids fail, and the used-sid set forgets them then.
    scram, challenge, _ = first(auth, "alice", "alice-pw")
    header = final_header(scram, challenge)
    clock.now += 61
    late = auth.authenticate(header, client="c")
    assert isinstance(late, Challenge) and "expired" in late.reason
    auth._replays.seen("anything")  # purges what expired
    assert len(auth._replays) == 0


def test_unknown_and_weak_users_look_alike(
    password_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    auth = make(password_file)
    _, challenge_a, _ = first(auth, "nobody", "x")
    _, challenge_b, _ = first(auth, "nobody", "y")
    salt = lambda c: base64.b64decode(c.split("data=")[1]).decode().split(",")[1]  # noqa: E731
    assert salt(challenge_a) == salt(challenge_b)  # stable decoy, like a real user's
    for user, password in [("nobody", "x"), ("weak", "weak-pw"), ("alice", "wrong")]:
        refused = login(auth, user, password)
        assert isinstance(refused, Challenge) and refused.status == 401
        data = refused.headers["Authentication-Info"].split("data=")[1]
        assert base64.b64decode(data) == b"e=invalid-proof"
    assert "mosquitto_passwd -I 4096" in caplog.text and "'weak'" in caplog.text


@pytest.mark.parametrize(
    "header",
    [
        "",
        "x",
        "SCRAM-SHA-512",
        "SCRAM-SHA-512 data=!!",
        "SCRAM-SHA-512 data=" + b64("junk"),
        "SCRAM-SHA-512 data=" + b64("p=tls-unique,,n=a,r=b"),
        "SCRAM-SHA-512 sid=,data=",
        "SCRAM-SHA-512 sid=v1.e30.AAAA,data=" + b64("c=biws,r=x,p=AAAA"),
        "SCRAM-SHA-512 sid=v1.!!.!!,data=eA==",
        "SCRAM-SHA-512 data=" + "A" * 5000,
        "\x00\x01",
        "Basic " + b64("alice:alice-pw"),
        "Bearer abc",
        "Digest a=b",
        "SCRAM-SHA-512 data=" + base64.b64encode(b"\xff").decode(),
        "SCRAM-SHA-512 sid=" + "v1." + "A" * 5000 + ".B,data=eA==",
    ],
)
def test_junk_is_a_401_never_an_exception(password_file: Path, header: str) -> None:
    result = make(password_file).authenticate(header or None, client="c")
    assert isinstance(result, Challenge) and result.status == 401
    assert result.headers["WWW-Authenticate"] == 'SCRAM-SHA-512 realm="r"'


def test_basic_and_bearer_only_over_tls(password_file: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"bob:{token_digest('t0ken')}\n")
    plain = make(password_file, tokens_file=tokens)
    assert plain.mechanisms == ("SCRAM-SHA-512",)
    assert isinstance(plain.authenticate("Basic " + b64("alice:alice-pw"), client="c"), Challenge)
    assert isinstance(plain.authenticate("Bearer t0ken", client="c"), Challenge)
    tls = make(password_file, tokens_file=tokens, tls=True)
    assert tls.mechanisms == ("SCRAM-SHA-512", "Basic", "Bearer")
    assert tls.challenge().headers["WWW-Authenticate"] == (
        'SCRAM-SHA-512 realm="r", Basic realm="r", Bearer realm="r"'
    )
    for header, user in [
        ("Basic " + b64("weak:weak-pw"), "weak"),
        ("Basic " + b64("alice:alice-pw"), "alice"),
        ("Bearer t0ken", "bob"),
    ]:
        result = tls.authenticate(header, client="c")
        assert isinstance(result, Authenticated) and result.user == user
    for header in [
        "Basic " + b64("weak:nope"),
        "Basic " + b64("ghost:x"),
        "Bearer nope",
        "Basic " + b64("no-colon"),
    ]:
        assert isinstance(tls.authenticate(header, client="c"), Challenge)


def test_anonymous_only_when_asked_for_by_name(password_file: Path) -> None:
    assert isinstance(make(password_file).authenticate(None, client="c"), Challenge)
    anon = make(password_file, allow_anonymous=True).authenticate(None, client="c")
    assert isinstance(anon, Authenticated) and anon.user is None
    # No credentials files: closed, and the refusal says what to set.
    closed = make(None)
    assert closed.mode is AuthMode.CLOSED and closed.mechanisms == () and not closed.enabled
    for header in (None, "SCRAM-SHA-512 junk", "Basic " + b64("a:b"), "Bearer t"):
        refused = closed.authenticate(header, client="c")
        assert isinstance(refused, Challenge) and refused.status == 401
        assert "OFFLOAD_ALLOW_ANONYMOUS=true" in refused.detail
        assert "OFFLOAD_PASSWORD_FILE" in refused.detail
    assert "closed" in closed.describe()
    off = make(None, allow_anonymous=True)
    assert off.mode is AuthMode.ANONYMOUS and not off.enabled
    assert off.authenticate("SCRAM-SHA-512 junk", client="c") == Authenticated(None)
    assert off.can_write(None, "any/topic")
    assert "OFF" in off.describe()


def test_tokens_only(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"bob:{token_digest('t0ken')}\n")
    acl = tmp_path / "acl"
    acl.write_text("user bob\ntopic readwrite bob/#\n")
    # Bearer tokens never cross plain HTTP: a tokens-only gateway without TLS could serve
    # nobody, so it does not start, and says what to set.
    with pytest.raises(AuthConfigError, match="OFFLOAD_TLS"):
        make(None, tokens_file=tokens)
    auth = make(None, tokens_file=tokens, acl_file=acl, tls=True)
    assert auth.mode is AuthMode.TOKENS and auth.enabled and auth.mechanisms == ("Bearer",)
    assert auth.challenge().headers["WWW-Authenticate"] == 'Bearer realm="r"'
    ok = auth.authenticate("Bearer t0ken", client="c")
    assert isinstance(ok, Authenticated) and ok.user == "bob"
    # The ACL applies to the token's user as to a password user.
    assert auth.can_write("bob", "bob/x") and not auth.can_write("bob", "other")
    for header in (
        None,
        "Bearer nope",
        "Bearer t0ken extra",
        "Basic " + b64("bob:t0ken"),
        "SCRAM-SHA-512 data=" + b64("n,,n=bob,r=abc"),
    ):
        refused = auth.authenticate(header, client="c")
        assert isinstance(refused, Challenge) and refused.status == 401, header


def test_failed_attempts_are_limited(password_file: Path) -> None:
    clock = Clock()
    auth = make(password_file, clock, max_failures_per_user=3, max_failures_per_address=5)
    for _ in range(3):
        assert isinstance(login(auth, "alice", "wrong", client="a1"), Challenge)
    # The user is blocked from that address, even with the right password ...
    blocked = login_or_block(auth, "alice", "alice-pw", client="a1")
    assert blocked.status == 429 and int(blocked.headers["Retry-After"]) > 0
    # ... but a stranger guessing from a1 cannot lock alice out elsewhere (documented
    # choice: no per-user limit across addresses).
    assert isinstance(login(auth, "alice", "alice-pw", client="a2"), Authenticated)
    # An address with too many failures is blocked for every user.
    for _ in range(5):
        auth.authenticate("SCRAM-SHA-512 junk", client="a3")
    from_a3 = auth.authenticate("SCRAM-SHA-512 junk", client="a3")
    assert isinstance(from_a3, Challenge) and from_a3.status == 429
    clock.now += 61
    assert isinstance(login(auth, "alice", "alice-pw", client="a1"), Authenticated)


def login_or_block(auth: Authenticator, user: str, password: str, client: str) -> Challenge:
    scram = ScramClient(["SCRAM-SHA-512"], user, password)
    result = auth.authenticate(f"SCRAM-SHA-512 data={b64(scram.get_client_first())}", client=client)
    assert isinstance(result, Challenge)
    return result


def test_bookkeeping_is_bounded() -> None:
    clock = Clock()
    limiter = FailureLimiter(limit=2, window=10, capacity=100, clock=clock)
    for index in range(10_000):
        limiter.failed(f"addr:{index}")
    assert len(limiter) == 100
    guard = ReplayGuard(capacity=3, clock=clock)
    assert [guard.claim(k, clock.now + 5) for k in "abc"] == [True, True, True]
    assert guard.claim("a", clock.now + 5) is False
    assert guard.claim("d", clock.now + 5) == 5  # full: wait, never forget early
    clock.now += 6
    assert guard.claim("d", clock.now + 5) is True and len(guard) == 1


def test_files_are_reread_when_they_change(
    password_file: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic read a/#\n")
    auth = make(password_file, acl_file=acl)
    assert auth.can_read("alice", "a/1") and not auth.can_write("alice", "a/1")
    acl.write_text("user alice\ntopic readwrite a/#\n")
    assert auth.can_write("alice", "a/1+oversized")
    # A broken file refuses everything until fixed (and says so once).
    acl.write_text("user alice\nnonsense here\n")
    assert not auth.can_read("alice", "a/1")
    assert not auth.can_read("alice", "a/1")
    assert caplog.text.count("nonsense") == 1
    acl.write_text("user alice\ntopic read a/#\n")
    assert auth.can_read("alice", "a/1")
    # A new password takes effect without a restart.
    assert isinstance(login(auth, "alice", "alice-pw"), Authenticated)
    passwd(password_file, "alice", "new-pw", "-I", "4096")
    os.utime(password_file, ns=(1, 1))  # make sure the change is seen whatever the clock
    assert isinstance(login(auth, "alice", "alice-pw"), Challenge)
    assert isinstance(login(auth, "alice", "new-pw"), Authenticated)


def test_bad_configuration_is_refused_at_start(tmp_path: Path, password_file: Path) -> None:
    with pytest.raises(AuthConfigError):
        make(tmp_path / "missing")
    bad_acl = tmp_path / "acl"
    bad_acl.write_text("topic bogus a b\n")
    with pytest.raises(AuthConfigError, match="line 1"):
        make(password_file, acl_file=bad_acl)
    with pytest.raises(ValueError):
        make(password_file, secret=b"short")
    with pytest.raises(ValueError):
        make(password_file, realm='a"b')
    assert SECRET.decode() not in repr(make(password_file))


def test_base64_and_sids_have_one_spelling() -> None:
    from gateway.auth._scram import _unb64url, strict_b64decode

    assert strict_b64decode("eA==") == b"x"
    for junk in ["eA", "eA=", "eA===", "eB==", "e A==", "eA==\n", "eA==.", "e-A=", "=eA="]:
        with pytest.raises(ValueError):
            strict_b64decode(junk)
    assert _unb64url("eA") == b"x"
    for junk in ["eA=", "eB", "eA.", "e+", "e/", "e", "eA\t"]:
        with pytest.raises(ValueError):
            _unb64url(junk)


def test_a_replay_is_refused_whatever_the_sid_spelling(password_file: Path) -> None:
    auth = make(password_file)
    scram, challenge, _ = first(auth, "alice", "alice-pw")
    header = final_header(scram, challenge)
    assert isinstance(auth.authenticate(header, client="c"), Authenticated)
    sid = header.split("sid=")[1].split(",")[0]
    for spelled in [sid + "=", sid + ".", sid + ".x", f'"{sid}"', sid.replace(".", "..", 1)]:
        replay = auth.authenticate(header.replace(sid, spelled), client="c")
        assert isinstance(replay, Challenge) and replay.status == 401, spelled


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.text(max_size=300),
        st.builds(
            lambda scheme, rest: f"{scheme} {rest}",
            st.sampled_from(["SCRAM-SHA-512", "Basic", "Bearer", "scram-sha-512"]),
            st.text(alphabet=st.characters(max_codepoint=0x2FF), max_size=200),
        ),
    )
)
def test_any_authorization_text_is_a_challenge_never_an_error(
    auth_files: Path, header: str
) -> None:
    tokens = auth_files / "tokens"
    if not tokens.exists():
        passwd(auth_files / "passwd", "alice", "alice-pw", "-I", "4096")
        tokens.write_text(f"bob:{token_digest('t0ken')}\n")
    auth = make(auth_files / "passwd", tls=True, tokens_file=tokens)
    result = auth.authenticate(header, client="fuzz")
    # The boundary's catch-all logs "unexpected error": parsing must never get that far.
    assert isinstance(result, Challenge) and result.status in (401, 429)
    assert result.reason != "malformed credentials"


@pytest.mark.parametrize(
    ("header", "hashes"),
    [
        (None, False), ("", False), ("Bearer abc", False), ("SCRAM-SHA-512 data=eA==", False),
        ("Digest username=x", False), ("Basically x", False), ("Basic\tdXNlcjpwdw==", False),
        ("Basic", False), ("x" * 70_000, False),
        ("Basic dXNlcjpwdw==", True), ("basic dXNlcjpwdw==", True), ("  BASIC  dXNlcjpwdw==", True),
    ],
)  # fmt: skip
def test_only_what_may_hash_a_password_goes_to_the_hashing_threads(
    header: str | None, hashes: bool
) -> None:
    """The gateway decides on the event loop unless `hashes` says the header may cost a
    PBKDF2. Whatever the parser reads as a Basic credential must say so; SCRAM, Bearer and
    junk are a few HMACs at most."""
    assert Authenticator.hashes(header) is hashes
    try:
        parsed = parse_authorization(header or "")
        basic = parsed.scheme == "BASIC" and bool(parsed.token68)
    except ValueError:
        basic = False
    assert not basic or hashes


def test_where_basic_is_taken_an_entry_scram_cannot_use_is_told_to_use_it(
    password_file: Path,
) -> None:
    """Over TLS (Basic taken) a client-first for `weak` (101 iterations) gets a 401 offering
    Basic alone; an unknown user and a wrong password for `alice` still look alike (decoys,
    then invalid-proof). Over plain HTTP `weak` looks unknown (test above)."""
    from gateway.auth._authenticator import SCRAM_IMPOSSIBLE_DETAIL

    auth = make(password_file, tls=True)
    _, offered, answer = first(auth, "weak", "weak-pw")
    assert offered == 'Basic realm="r"' and answer.detail == SCRAM_IMPOSSIBLE_DETAIL
    assert "Authentication-Info" not in answer.headers
    for user, password in [("nobody", "x"), ("alice", "wrong")]:
        _, challenge, _ = first(auth, user, password)
        assert challenge.startswith("SCRAM-SHA-512 sid="), user
        refused = login(auth, user, password)
        assert isinstance(refused, Challenge)
        assert base64.b64decode(refused.headers["Authentication-Info"].split("data=")[1]) == (
            b"e=invalid-proof"
        )
    basic = auth.authenticate("Basic " + b64("weak:weak-pw"), client="c")
    assert isinstance(basic, Authenticated) and basic.user == "weak"
    # Telling it is paid ahead and settled by the Basic login it invites: weak's own logins
    # are not held back by it (tests/test_auth_paid_ahead.py: what it costs an enumerator).
    for _ in range(120):
        first(auth, "weak", "weak-pw", client="c")
        basic = auth.authenticate("Basic " + b64("weak:weak-pw"), client="c")
        assert isinstance(basic, Authenticated)
