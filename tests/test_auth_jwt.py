"""JWT bearer tokens: keys made here, tokens signed here, the authenticator's verdicts.

Valid RS256 / ES256 / EdDSA / HS256 tokens get in; expired, not yet valid, another issuer or
audience, ``alg: none``, an HS256 token signed with the public key, a key the set does not
hold: 401 with one log line each, never an exception. EMQX's ``acl`` claim decides alone
(with ``${username}`` / ``${clientid}``); without it the ACL file does. A JWKS URL rotates;
one that serves garbage or hangs leaves the last good keys in force.
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from gateway.auth import Authenticated, Authenticator, Challenge, JwtVerifier, key_sources
from gateway.auth._jwks import UrlKeys

from _jwt_helpers import (
    AUDIENCE,
    ISSUER,
    JwksServer,
    SigningKey,
    claims,
    jwks,
    jwks_server,
    make_key,
)

SECRET = "an-hs256-secret-of-at-least-32-bytes!!"


@pytest.fixture(scope="module")
def keys() -> dict[str, SigningKey]:
    return {alg: make_key(alg, f"k-{alg}") for alg in ("RS256", "ES256", "EdDSA")}


def verifier(tmp_path: Path, body: str, **options: object) -> JwtVerifier:
    jwks_file = tmp_path / "jwks.json"
    jwks_file.write_text(body)
    secret_file = tmp_path / "hs256"
    secret_file.write_text(SECRET + "\n")
    sources = key_sources(jwks_file=jwks_file, jwks_url=None, secret_file=secret_file, refresh=300)
    settings: dict[str, object] = {
        "issuer": ISSUER,
        "audience": AUDIENCE,
        "leeway": 5,
        "username_claim": "sub",
        "acl_claim": "acl",
    }
    settings.update(options)
    return JwtVerifier(sources, **settings)  # type: ignore[arg-type]


def authenticator(jwt_verifier: JwtVerifier, acl_file: Path | None = None) -> Authenticator:
    return Authenticator(
        password_file=None,
        acl_file=acl_file,
        realm="t",
        secret=b"s" * 32,
        tls=True,
        allow_anonymous=False,
        jwt=jwt_verifier,
    )


def bearer(token: str) -> str:
    return f"Bearer {token}"


def unsigned(payload: dict[str, object], alg: str = "none") -> str:
    def part(doc: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()

    return f"{part({'alg': alg, 'typ': 'JWT'})}.{part(payload)}."


def test_valid_tokens_of_each_algorithm(tmp_path: Path, keys: dict[str, SigningKey]) -> None:
    auth = authenticator(verifier(tmp_path, jwks(*keys.values())))
    for key in keys.values():
        who = auth.authenticate(bearer(key.sign(claims("dev-1"))), client="a")
        assert isinstance(who, Authenticated) and who.user == "dev-1", key.alg
        assert who.mechanism == "Bearer"
    # Without kid: the one key of its algorithm.
    kidless = jwt.encode(claims("dev-4"), keys["RS256"].private, algorithm="RS256")
    who = auth.authenticate(bearer(kidless), client="a")
    assert isinstance(who, Authenticated) and who.user == "dev-4"
    hs = jwt.encode(claims("dev-2"), SECRET, algorithm="HS256")
    who = auth.authenticate(bearer(hs), client="a")
    assert isinstance(who, Authenticated) and who.user == "dev-2"
    # A configurable user name claim.
    named = verifier(tmp_path, jwks(*keys.values()), username_claim="preferred_username")
    token = keys["ES256"].sign(claims("x", preferred_username="dev-3"))
    who = authenticator(named).authenticate(bearer(token), client="a")
    assert isinstance(who, Authenticated) and who.user == "dev-3"


def test_refusals_are_401_with_a_reason_in_the_log(
    tmp_path: Path, keys: dict[str, SigningKey], caplog: pytest.LogCaptureFixture
) -> None:
    rsa = keys["RS256"]
    auth = authenticator(verifier(tmp_path, jwks(*keys.values())))
    pem = rsa.private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    stranger = make_key("ES256", "k-ES256")  # the right kid, another key
    now = int(time.time())
    cases = {
        "expired": rsa.sign(claims("d", exp=now - 60)),
        "not yet valid": rsa.sign(claims("d", nbf=now + 600)),
        "other issuer": rsa.sign(claims("d", iss="https://evil.example")),
        "other audience": rsa.sign(claims("d", aud="someone-else")),
        "no exp": rsa.sign({"sub": "d", "iss": ISSUER, "aud": AUDIENCE}),
        "alg none": unsigned(claims("d")),
        "alg none, kid": unsigned(claims("d"), alg="None"),
        "unknown kid": make_key("ES256", "k-other").sign(claims("d")),
        "wrong key, known kid": stranger.sign(claims("d")),
        "garbage": "eyJhbGciOi.not.atoken",
        "no sub": rsa.sign({k: v for k, v in claims("d").items() if k != "sub"}),
        "bad acl claim": rsa.sign(claims("d", acl="everything")),
    }
    # Algorithm confusion: an HS256 token keyed with the RSA public key the gateway trusts
    # (PyJWT itself refuses to sign one, so the HMAC is taken here).
    header = {"alg": "HS256", "typ": "JWT", "kid": "k-RS256"}
    signing_input = ".".join(
        base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()
        for doc in (header, claims("d"))
    )
    mac = hmac.digest(pem, signing_input.encode(), "sha256")
    cases["hs256 with the public key"] = (
        signing_input + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
    )
    for name, token in cases.items():
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="gateway.auth"):
            answer = auth.authenticate(bearer(token), client="192.0.2.7")
        assert isinstance(answer, Challenge) and answer.status == 401, name
        # The token's holder is told why, in the 401's detail (nothing in it is secret).
        assert answer.detail.startswith("the bearer token (a JWT) was refused: "), name
        lines = [r.getMessage() for r in caplog.records if "JWT" in r.getMessage()]
        assert len(lines) == 1 and "192.0.2.7" in lines[0], (name, lines)
    expired = auth.authenticate(bearer(cases["expired"]), client="192.0.2.7")
    assert isinstance(expired, Challenge) and "it has expired (exp)" in expired.detail
    # Not counted as failed logins: a fleet's expired tokens lock nobody out.
    good = auth.authenticate(bearer(rsa.sign(claims("d"))), client="192.0.2.7")
    assert isinstance(good, Authenticated)


def test_claim_acl_with_placeholders_and_the_acl_file(
    tmp_path: Path, keys: dict[str, SigningKey]
) -> None:
    acl_file = tmp_path / "acl"
    acl_file.write_text("user dev-1\ntopic write files/#\ntopic read files/#\n")
    auth = authenticator(verifier(tmp_path, jwks(keys["EdDSA"])), acl_file)
    key = keys["EdDSA"]

    def allowed(token: str, topic: str, write: bool) -> bool:
        who = auth.authenticate(bearer(token), client="a")
        assert isinstance(who, Authenticated)
        return auth.allows(who, topic, write=write)

    emqx = key.sign(
        claims(
            "dev-1",
            clientid="cam-7",
            acl={
                "pub": ["up/${username}/#", "dev/${clientid}/state"],
                "sub": ["down/${username}"],
                "all": ["eq shared/#"],
            },
        )
    )
    assert allowed(emqx, "up/dev-1/a", write=True)
    assert not allowed(emqx, "up/dev-2/a", write=True)
    assert not allowed(emqx, "up/dev-1/a", write=False)  # pub only
    assert allowed(emqx, "dev/cam-7/state", write=True)
    assert not allowed(emqx, "dev/cam-8/state", write=True)
    assert allowed(emqx, "down/dev-1", write=False)
    assert allowed(emqx, "shared/#", write=True)  # eq: the text itself
    assert not allowed(emqx, "shared/x", write=True)
    assert not allowed(emqx, "files/a", write=True)  # the claim decides alone
    # ${clientid} without a clientid claim never grants.
    no_id = key.sign(claims("dev-1", acl={"pub": ["dev/${clientid}/state"]}))
    assert not allowed(no_id, "dev/cam-7/state", write=True)
    # EMQX's list form: first match decides.
    rules = key.sign(
        claims(
            "dev-1",
            acl=[
                {"permission": "deny", "action": "publish", "topic": "up/dev-1/secret"},
                {"permission": "allow", "action": "all", "topics": ["up/${username}/#"]},
            ],
        )
    )
    assert allowed(rules, "up/dev-1/a", write=True)
    assert not allowed(rules, "up/dev-1/secret", write=True)
    assert allowed(rules, "up/dev-1/secret", write=False)
    # Without a claim, the ACL file in force.
    plain = key.sign(claims("dev-1"))
    assert allowed(plain, "files/x", write=True) and not allowed(plain, "up/dev-1/a", write=True)


def test_jwks_file_rotation(tmp_path: Path, keys: dict[str, SigningKey]) -> None:
    old, new = keys["RS256"], make_key("ES256", "k-new")
    jwt_verifier = verifier(tmp_path, jwks(old))
    auth = authenticator(jwt_verifier)
    assert isinstance(auth.authenticate(bearer(old.sign(claims("d"))), client="a"), Authenticated)
    assert isinstance(auth.authenticate(bearer(new.sign(claims("d"))), client="a"), Challenge)
    (tmp_path / "jwks.json").write_text(jwks(new))
    assert isinstance(auth.authenticate(bearer(new.sign(claims("d"))), client="a"), Authenticated)
    assert isinstance(auth.authenticate(bearer(old.sign(claims("d"))), client="a"), Challenge)
    (tmp_path / "jwks.json").write_text('{"keys": [')  # truncated: the last good set stays
    assert isinstance(auth.authenticate(bearer(new.sign(claims("d"))), client="a"), Authenticated)
    assert any("keeping the last good version" in p for p in auth.problems())


@pytest.fixture
def url_keys() -> Iterator[tuple[JwksServer, SigningKey, SigningKey]]:
    old, new = make_key("ES256", "k-old"), make_key("EdDSA", "k-new")
    with jwks_server(jwks(old)) as server:
        yield server, old, new


def wait_for(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_jwks_url_rotation_garbage_and_a_hang(
    url_keys: tuple[JwksServer, SigningKey, SigningKey],
) -> None:
    server, old, new = url_keys
    source = UrlKeys(server.url, refresh=3600, min_interval=0.2, timeout=1.0)
    jwt_verifier = JwtVerifier(
        (source,), issuer=ISSUER, audience=AUDIENCE, leeway=5, username_claim="sub", acl_claim="acl"
    )
    auth = authenticator(jwt_verifier)
    try:

        def verdict(key: SigningKey) -> bool:
            return isinstance(
                auth.authenticate(bearer(key.sign(claims("d"))), client="a"), Authenticated
            )

        assert verdict(old) and not verdict(new)
        # Rotation: the IdP publishes the new key and retires the old one; a token with the
        # unknown kid makes the gateway fetch again (refused meanwhile, answered at once).
        server.body = jwks(new).encode()
        assert not verdict(new)
        wait_for(lambda: verdict(new))
        assert not verdict(old)
        # Garbage: the last good keys stay, and the problem is reported.
        server.body = b"<html>gateway timeout</html>"
        hits = server.hits
        assert not verdict(make_key("ES256", "k-third"))  # asks for a fetch
        wait_for(lambda: server.hits > hits and source.problem is not None)
        assert verdict(new) and "not valid JSON" in str(source.problem)
        # A hanging IdP: the fetch gives up after its timeout, requests never wait for it.
        server.body, server.delay = jwks(new).encode(), 30.0
        hits = server.hits
        assert not verdict(make_key("ES256", "k-fourth"))
        wait_for(lambda: server.hits > hits)
        started = time.monotonic()
        for _ in range(20):
            assert verdict(new)
        assert time.monotonic() - started < 5  # answered while the fetch hangs
        wait_for(lambda: "timed out" in str(source.problem) or "within" in str(source.problem))
        assert verdict(new)
    finally:
        auth.close()


def test_a_disabled_dynsec_client_is_refused_whatever_its_token_says(
    tmp_path: Path, keys: dict[str, SigningKey]
) -> None:
    dynsec = tmp_path / "dynsec.json"
    every = [
        {"acltype": kind, "topic": "#", "allow": True}
        for kind in ("publishClientSend", "publishClientReceive", "subscribePattern")
    ]
    doc = {
        "clients": [
            {"username": "cam", "disabled": True, "roles": [{"rolename": "every"}]},
            {"username": "ok"},
        ],
        "roles": [{"rolename": "every", "acls": every}],
    }
    dynsec.write_text(json.dumps(doc))
    auth = Authenticator(
        password_file=None,
        acl_file=None,
        dynsec_file=dynsec,
        realm="t",
        secret=b"s" * 32,
        tls=True,
        allow_anonymous=False,
        jwt=verifier(tmp_path, jwks(keys["ES256"])),
    )
    everything = {"all": ["#"]}
    cam = keys["ES256"].sign(claims("cam", acl=everything))
    assert isinstance(auth.authenticate(bearer(cam), client="a"), Challenge)
    ok = auth.authenticate(bearer(keys["ES256"].sign(claims("ok", acl=everything))), client="a")
    assert isinstance(ok, Authenticated) and auth.allows(ok, "any/topic", write=True)
    # The file's own rules refuse a disabled client too, whichever login let it in (each
    # login path refuses it first; this is the rule under them).
    for write in (True, False):
        assert not auth.allows(Authenticated("cam", mechanism="Bearer"), "any/t", write=write)


def test_numeric_dates_are_json_numbers(tmp_path: Path, keys: dict[str, SigningKey]) -> None:
    """RFC 7519's NumericDate is a JSON number: PyJWT alone takes `"exp": "1767225600"`
    (and `true`) and compares it as a number."""
    auth = authenticator(verifier(tmp_path, jwks(keys["ES256"])))
    key, now = keys["ES256"], int(time.time())
    assert isinstance(auth.authenticate(bearer(key.sign(claims("d"))), client="a"), Authenticated)
    fractional = key.sign(claims("d", exp=now + 300.5, iat=now - 0.5, nbf=now - 1.5))
    assert isinstance(auth.authenticate(bearer(fractional), client="a"), Authenticated)
    for name, value in (
        ("exp", str(now + 300)),
        ("exp", True),
        ("nbf", str(now - 10)),
        ("nbf", False),
        ("iat", str(now)),
        ("iat", True),
    ):
        token = key.sign(claims("d", **{name: value}))
        refused = auth.authenticate(bearer(token), client="a")
        assert isinstance(refused, Challenge) and refused.status == 401, (name, value)
        why = "expired" if value is True and name == "exp" else "NumericDate"
        assert why in refused.reason, refused.reason  # PyJWT takes `true` as 1: long expired


def test_a_name_with_a_level_separator_or_wildcard_is_not_substituted(
    tmp_path: Path, keys: dict[str, SigningKey]
) -> None:
    """`sub` "alice/x" must not make `up/${username}/#` a part of alice's `up/alice/#`;
    nor a `clientid` "cam/7" reach `dev/cam/7/state` (mosquitto refuses %u for such names)."""
    auth = authenticator(verifier(tmp_path, jwks(keys["EdDSA"])))
    key = keys["EdDSA"]
    acl = {"pub": ["up/${username}/#", "dev/${clientid}/state"]}

    def allowed(sub: str, topic: str, **extra: object) -> bool:
        who = auth.authenticate(bearer(key.sign(claims(sub, acl=acl, **extra))), client="a")
        assert isinstance(who, Authenticated)
        return auth.allows(who, topic, write=True)

    assert allowed("alice", "up/alice/x/y")  # alice's own subtree
    for sub in ("alice/x", "alice/+", "alice/#", "+", "#"):
        assert not allowed(sub, "up/alice/x/y"), sub
        assert not allowed(sub, f"up/{sub}/y"), sub
    assert allowed("d", "dev/cam-7/state", clientid="cam-7")
    assert not allowed("d", "dev/cam/7/state", clientid="cam/7")
    # A denying rule with such a name denies whatever it covers.
    rules = [
        {"permission": "deny", "action": "publish", "topic": "up/${username}/secret"},
        {"permission": "allow", "action": "publish", "topic": "up/#"},
    ]
    for sub, topic, verdict in (
        ("alice", "up/alice/secret", False),
        ("alice", "up/alice/open", True),
        ("alice/x", "up/alice/open", False),
    ):
        who = auth.authenticate(bearer(key.sign(claims(sub, acl=rules))), client="a")
        assert isinstance(who, Authenticated)
        assert auth.allows(who, topic, write=True) is verdict, (sub, topic)


def test_a_token_with_aud_is_refused_by_a_gateway_without_an_audience(
    tmp_path: Path, keys: dict[str, SigningKey]
) -> None:
    """docs/authentication.md: without OFFLOAD_JWT_AUDIENCE a token carrying `aud` is
    refused (a token minted for another service must not open this one)."""
    auth = authenticator(verifier(tmp_path, jwks(keys["RS256"]), audience=None))
    key = keys["RS256"]
    without = {k: v for k, v in claims("d").items() if k != "aud"}
    assert isinstance(auth.authenticate(bearer(key.sign(without)), client="a"), Authenticated)
    for aud in (AUDIENCE, "another-service", [AUDIENCE]):
        refused = auth.authenticate(bearer(key.sign(claims("d", aud=aud))), client="a")
        assert isinstance(refused, Challenge) and refused.status == 401, aud
        assert "audience" in refused.reason.lower(), refused.reason


def test_a_denying_clientid_rule_denies_a_token_without_a_client_id(
    tmp_path: Path, keys: dict[str, SigningKey]
) -> None:
    """A token without a `clientid` claim: a rule denying `dev/${clientid}/secret` denies
    `dev/<any id>/secret` (missing knowledge only ever takes access away)."""
    auth = authenticator(verifier(tmp_path, jwks(keys["ES256"])))
    whole = [
        {"permission": "deny", "action": "all", "topic": "dev/${clientid}/secret"},
        {"permission": "allow", "action": "all", "topic": "dev/#"},
    ]
    # Not a whole level: the rule denies all its action covers (what could it spare?).
    part = [
        {"permission": "deny", "action": "publish", "topic": "cfg/${clientid}-x/#"},
        {"permission": "allow", "action": "all", "topic": "#"},
    ]
    for rules, extra, topic, write, verdict in (
        (whole, {}, "dev/cam-7/secret", True, False),
        (whole, {}, "dev/cam-8/secret", False, False),
        (whole, {}, "dev/cam-7/open", True, True),
        (whole, {"clientid": "cam-7"}, "dev/cam-7/secret", True, False),
        (whole, {"clientid": "cam-7"}, "dev/cam-8/secret", True, True),
        (part, {}, "cfg/cam-7-x/a", True, False),
        (part, {}, "other/topic", True, False),
        (part, {}, "cfg/cam-7-x/a", False, True),
        (part, {"clientid": "cam-7"}, "cfg/cam-7-x/a", True, False),
        (part, {"clientid": "cam-7"}, "cfg/cam-8-x/a", True, True),
    ):
        token = keys["ES256"].sign(claims("dev-1", acl=rules, **extra))
        who = auth.authenticate(bearer(token), client="a")
        assert isinstance(who, Authenticated)
        assert auth.allows(who, topic, write=write) is verdict, (extra, topic, write)
