"""A new user's fleet on mosquitto's dynamic security plugin: clients and roles made with
`mosquitto_ctrl` as docs/authentication.md shows, and the `offload` CLI as they type it
(issue 51 §2).

`mosquitto_ctrl` hashes with 101 iterations, which SCRAM cannot use: the CLI's default login
finds HTTP Basic by itself where the gateway takes it (HTTPS), and over plain HTTP its line
names `OFFLOAD_HTTP_LOGIN=basic`. A role without the discovery topic is told why no gateway
is found, once, by `offload publish` (which then chunks) and `offload discover`.

The offer of Basic tells the names such entries have: curl asking for one name after another
is held after 50 questions a minute, as a Basic guesser is, while the default login (the
offer, then Basic) is never held back however often it runs.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from _dynsec import ADMIN, ADMIN_PASSWORD, DynsecBroker, plugin_path, start_dynsec_broker
from _gateway import GatewayServer
from _pki import server_pki
from _servers import Mosquitto

pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(plugin_path() is None, reason="mosquitto's dynsec plugin missing"),
]

OFFLOAD = shutil.which("offload") or "offload"
GATEWAY_PASSWORD = "gw-secret"
BIG = 400_000  # over the broker's 256 KiB


def docs_example(dyn: DynsecBroker) -> list[list[str]]:
    """docs/authentication.md's `mosquitto_ctrl` lines for a camera and its role, as typed."""
    ctrl = ["mosquitto_ctrl", "-u", ADMIN, "-P", ADMIN_PASSWORD, "-p", str(dyn.port), "dynsec"]
    return [
        [*ctrl, "createRole", "cams"],
        [*ctrl, "addRoleACL", "cams", "subscribePattern", "sys/metadata", "allow"],
        [*ctrl, "addRoleACL", "cams", "publishClientSend", "cams/#", "allow"],
        [*ctrl, "addRoleACL", "cams", "subscribePattern", "cams/#", "allow"],
        [*ctrl, "createClient", "cam1", "-p", "pw-cam1"],
        [*ctrl, "addClientRole", "cam1", "cams"],
    ]


@dataclass(frozen=True)
class Fleet:
    dyn: DynsecBroker
    https: GatewayServer  # TLS: takes Basic
    plain: GatewayServer  # plain HTTP: SCRAM only
    behind_tls: GatewayServer  # OFFLOAD_TLS=true, reached here over http://
    ca: Path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    from gateway import Settings

    directory = Path(tempfile.mkdtemp(prefix="dynsec-cli-"))
    directory.chmod(0o777)
    brokers: list[Mosquitto] = []

    def mosquitto(**kw: object) -> Mosquitto:
        brokers.append(Mosquitto(**kw).start())  # type: ignore[arg-type]
        return brokers[-1]

    gateways: list[GatewayServer] = []
    try:
        dyn = start_dynsec_broker(mosquitto, directory, max_packet_size=262144)
        for line in docs_example(dyn):
            done = subprocess.run(line, capture_output=True, text=True, timeout=20)
            assert done.returncode == 0 and "Error" not in done.stdout, (line, done)
        # The gateway's own account announces it on the discovery topic, and publishes the
        # placeholders of uploads made through it.
        dyn.ctrl("createRole", "offload-gateway")
        dyn.ctrl("addRoleACL", "offload-gateway", "publishClientSend", "sys/metadata", "allow")
        dyn.ctrl("addRoleACL", "offload-gateway", "publishClientSend", "cams/#", "allow")
        dyn.ctrl("createClient", "gateway", "-p", GATEWAY_PASSWORD)
        dyn.ctrl("addClientRole", "gateway", "offload-gateway")
        # A camera whose role forgets the discovery topic.
        dyn.ctrl("createRole", "blind")
        dyn.ctrl("addRoleACL", "blind", "publishClientSend", "cams/#", "allow")
        dyn.ctrl("createClient", "cam2", "-p", "pw-cam2")
        dyn.ctrl("addClientRole", "cam2", "blind")
        common = {
            "dynsec_file": dyn.file,
            "auth_secret": "s" * 32,
            "mqtt_url": dyn.broker.url,
            "mqtt_username": "gateway",
            "mqtt_password": GATEWAY_PASSWORD,
            "discovery_interval": 5.0,
        }
        with server_pki() as pki:
            store = tmp_path_factory.mktemp("dynsec-cli-store")
            https = GatewayServer(
                Settings(  # type: ignore[call-arg]
                    storage_url=f"file://{store}",
                    tls=True,
                    **common,
                ),
                certfile=str(pki / "server.pem"),
                keyfile=str(pki / "server.key"),
            )
            gateways.append(https.start())
            for tls in (False, True):  # announced where no camera looks (they may not)
                settings = Settings(  # type: ignore[call-arg]
                    storage_url=f"file://{store}", tls=tls, discovery_topic="sys/not-here", **common
                )
                gateways.append(GatewayServer(settings).start())
            yield Fleet(dyn, gateways[0], gateways[1], gateways[2], pki / "ca.pem")
    finally:
        for gw in gateways:
            gw.stop()
        for broker in brokers:
            broker.close()
        shutil.rmtree(directory, ignore_errors=True)


def offload(fleet: Fleet, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    clean.update(OFFLOAD_CONFIG=os.devnull, OFFLOAD_CA_FILE=str(fleet.ca), **env)
    return subprocess.run([OFFLOAD, *args], capture_output=True, text=True, timeout=120, env=clean)


@pytest.fixture
def big(tmp_path: Path) -> Path:
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(BIG))
    return path


def test_a_mosquitto_ctrl_client_offloads_with_the_default_login(
    fleet: Fleet, big: Path, tmp_path: Path
) -> None:
    """SCRAM is impossible for `cam1` (101 iterations): the HTTPS gateway says so, and the
    CLI's default login (`auto`) uploads and fetches with HTTP Basic instead."""
    login = ("--username", "cam1", "--password", "pw-cam1")
    mqtt = fleet.dyn.broker.url
    sent = offload(fleet, "publish", "--broker", mqtt, *login, "-t", "cams/1", "-f", str(big))
    assert sent.returncode == 0, sent.stderr
    assert sent.stderr == "", sent.stderr
    doc = json.loads(sent.stdout)
    assert doc["route"] == "offloaded" and doc["url"].startswith(fleet.https.url), doc
    got = tmp_path / "got.bin"
    fetched = offload(fleet, "fetch", doc["url"], *login, "-o", str(got))
    assert fetched.returncode == 0, fetched.stderr
    assert got.read_bytes() == big.read_bytes()
    # A wrong password: refused by Basic too, one line, exit 6.
    wrong = offload(fleet, "upload", "--endpoint", fleet.https.url, "--username", "cam1",
                    "--password", "no", "-t", "cams/1", "-f", str(big))  # fmt: skip
    assert wrong.returncode == 6 and wrong.stderr.count("\n") == 1, wrong.stderr


def test_over_plain_http_the_line_names_basic(fleet: Fleet, big: Path) -> None:
    """A gateway on plain HTTP cannot take Basic, so it cannot say SCRAM is impossible for
    `cam1` either (that would tell who exists): the line names both causes and the way in."""
    login = ("--username", "cam1", "--password", "pw-cam1", "-t", "cams/2", "-f", str(big))
    refused = offload(fleet, "upload", "--endpoint", fleet.plain.url, *login)
    assert refused.returncode == 6, refused.stderr
    assert "SCRAM authentication as 'cam1' failed: invalid-proof" in refused.stderr
    assert "OFFLOAD_HTTP_LOGIN=basic" in refused.stderr, refused.stderr
    # Behind a TLS proxy (OFFLOAD_TLS=true) but reached over http:// here: the gateway says
    # Basic, and the default login does not send a password as it is over plain HTTP ...
    told = offload(fleet, "upload", "--endpoint", fleet.behind_tls.url, *login)
    assert told.returncode == 6, told.stderr
    assert "cannot do SCRAM-SHA-512" in told.stderr and "https://" in told.stderr
    assert "OFFLOAD_HTTP_LOGIN=basic" in told.stderr, told.stderr
    # ... unless asked to by name.
    named = offload(fleet, "upload", "--endpoint", fleet.behind_tls.url, *login,
                    OFFLOAD_HTTP_LOGIN="basic")  # fmt: skip
    assert named.returncode == 0, named.stderr
    # `scram` by name: the gateway's word, and what to set.
    scram = offload(fleet, "upload", "--endpoint", fleet.https.url, *login,
                    OFFLOAD_HTTP_LOGIN="scram")  # fmt: skip
    assert scram.returncode == 6 and "OFFLOAD_HTTP_LOGIN=basic" in scram.stderr, scram.stderr


def test_a_role_without_the_discovery_topic_is_told_why(fleet: Fleet, big: Path) -> None:
    """`cam2`'s role may publish but not subscribe to sys/metadata: publish says why it
    chunks, once, and discover names the refusal rather than "no discovery record"."""
    mqtt = fleet.dyn.broker.url
    login = ("--username", "cam2", "--password", "pw-cam2")
    sent = offload(fleet, "publish", "--broker", mqtt, *login, "-t", "cams/3", "-f", str(big))
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["route"] == "chunked"
    why = "the broker refused the subscription to 'sys/metadata' (Not authorized)"
    assert sent.stderr.count(why) == 1 and sent.stderr.count("\n") == 1, sent.stderr
    assert "docs/authentication.md" in sent.stderr
    found = offload(fleet, "discover", "--broker", mqtt, *login)
    assert found.returncode != 0, found.stdout
    assert json.loads(found.stdout)["error"] == why, found.stdout
    # The docs' role, with the topic: discovered.
    seen = offload(
        fleet, "discover", "--broker", mqtt, "--username", "cam1", "--password", "pw-cam1"
    )
    assert seen.returncode == 0, seen.stderr
    assert json.loads(seen.stdout)["LargeMessageUploadEndpoint"] == fleet.https.url


def _client_first(user: str) -> str:
    from scramp import ScramClient

    first = ScramClient(["SCRAM-SHA-512"], user, "x").get_client_first()
    return "SCRAM-SHA-512 data=" + base64.b64encode(first.encode()).decode()


def curl(fleet: Fleet, address: str, *args: str) -> list[tuple[int, str]]:
    """curl from ``address`` to the HTTPS gateway's /usage: each answer's status and the
    schemes its WWW-Authenticate offers (the first's, when it offers several)."""
    done = subprocess.run(
        ["curl", "-sS", "-i", "--max-time", "20", "--interface", address,
         "--cacert", str(fleet.ca), *args, f"{fleet.https.url}/usage"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    heads = done.stdout.replace("\r\n", "\n").split("\n\n")
    answers = []
    for head in (part for part in heads if part.startswith("HTTP/")):
        offered = [
            line.partition(":")[2].split()[0]
            for line in head.splitlines()
            if line.lower().startswith("www-authenticate:")
        ]
        answers.append((int(head.split()[1]), offered[0] if offered else ""))
    return answers


def test_an_enumerator_of_user_names_gets_429_as_a_basic_guesser_does(fleet: Fleet) -> None:
    """The gateway's offer of Basic tells which names have an entry SCRAM cannot use (every
    mosquitto_ctrl client). curl asking, name after name, from one address gets 50 answers
    a minute, then 429 whoever it names, as 50 failed Basic logins would (without the
    charge all 60 are answered, the cameras told from the others); from there a Basic guess
    is held too (only the Basic login a question invited settles it). curl at another
    address logs in as before: with --anyauth (the 401, then Basic) and with Basic at once."""
    asked = ["cam1", "cam2", "gateway", "nobody", "admin-not", "cam9"] * 10
    attacker = "127.0.61.1"
    answers = [curl(fleet, attacker, "-H", f"Authorization: {_client_first(user)}")[-1]
               for user in asked]  # fmt: skip
    told = answers[:50]
    known = [offered == "Basic" for _, offered in told]
    assert known == [user.startswith(("cam1", "cam2", "gateway")) for user in asked[:50]]
    assert all(status == 401 for status, _ in told), told
    assert answers[50:] == [(429, "")] * 10, answers[50:]
    assert curl(fleet, attacker, "-u", "admin:pw-cam1") == [(429, "")]
    anyauth = curl(fleet, "127.0.0.1", "--anyauth", "-u", "cam1:pw-cam1")
    assert anyauth == [(401, "SCRAM-SHA-512"), (200, "")], anyauth  # 401 (no credentials), Basic
    assert curl(fleet, "127.0.0.1", "-u", "cam2:pw-cam2") == [(200, "")]


def test_the_default_logins_fallback_to_basic_is_never_held_back(fleet: Fleet) -> None:
    """A mosquitto_ctrl client logging in again and again from one address, each time with
    a new Client (as each `offload publish` is): its SCRAM client-first is charged, and the
    Basic login the offer invites settles it, so the 51st and the 100th get in too."""
    from client import Client

    for n in range(100):
        with Client(
            fleet.dyn.broker.url,
            username="cam1",
            password="pw-cam1",
            endpoint=fleet.https.url,
            ca_file=str(fleet.ca),
            offload_threshold=1,
        ) as camera:
            result = camera.publish("cams/again", f"upload {n}".encode(), qos=1)
            assert result.route == "offloaded", (n, result)
