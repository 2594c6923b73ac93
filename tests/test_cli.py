"""The real `offload` console script in subprocesses, against real mosquitto and gateway."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from client import BrokerUrl
from client.mqtt._paho import Incoming, MqttConnection
from client.protocol._chunk import split
from client.protocol._size import publish_packet_size

from _gateway import GatewayServer
from _servers import Mosquitto, free_port
from adr23_reference import reassemble

pytestmark = pytest.mark.servers

OFFLOAD = shutil.which("offload") or "offload"
MiB = 1024 * 1024


def _env() -> dict[str, str]:
    # A clean OFFLOAD_* environment and no user config file: only the flags count.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env["OFFLOAD_CONFIG"] = os.devnull
    return env


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OFFLOAD, *args], capture_output=True, text=True, timeout=timeout, env=_env()
    )


def subscriptions(broker: Mosquitto, topic: str) -> int:
    """How many subscriptions to `topic` the broker has logged (mosquitto -v)."""
    return broker.log().count(f"\t{topic} (QoS")


def start_subscriber(
    broker: Mosquitto, topic: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """`offload subscribe`, returned once the broker has its subscription (else a publish
    right after could be missed). `env`: OFFLOAD_* settings to add."""
    before = subscriptions(broker, topic)
    proc = subprocess.Popen(
        [OFFLOAD, "subscribe", "--broker", broker.url, "--topic", topic, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**_env(), **(env or {})},
    )
    deadline = time.monotonic() + 30
    while subscriptions(broker, topic) == before:
        assert proc.poll() is None and time.monotonic() < deadline, "not subscribed"
        time.sleep(0.05)
    return proc


def lines(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_chunked_publish_is_readable_by_an_independent_adr23_reassembler(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    broker = mosquitto_factory(max_packet_size=65536)
    topic = unique_topic("cli-chunks")
    received: list[Incoming] = []
    raw = MqttConnection(BrokerUrl.parse(broker.url), on_message=received.append)
    raw.connect()
    raw.subscribe(topic, 1).result(10)
    payload = os.urandom(1 * MiB)
    source = tmp_path / "one.bin"
    source.write_bytes(payload)
    subscriber = start_subscriber(
        broker, topic, "--count", "1", "--timeout", "30", "--out", str(tmp_path / "out")
    )
    try:
        result = run("publish", "--broker", broker.url, "--topic", topic, "--file", str(source))
        assert result.returncode == 0, result.stderr
        (doc,) = lines(result.stdout)
        assert doc["route"] == "chunked" and doc["size"] == MiB
        out, err = subscriber.communicate(timeout=60)
    finally:
        subscriber.kill()
    assert subscriber.returncode == 0, err
    (got,) = lines(out)
    assert got["sha256"] == hashlib.sha256(payload).hexdigest()
    assert got["size"] == MiB and got["route"] == "chunked"
    assert Path(str(got["file"])).read_bytes() == payload

    deadline = time.monotonic() + 10
    packets = int(str(doc["packets"]))
    while len(received) < packets and time.monotonic() < deadline:
        time.sleep(0.05)
    raw.close()
    assert len(received) == packets > 1
    for m in received:
        size = publish_packet_size(m.topic, len(m.payload), qos=m.qos, properties=m.properties)
        assert size <= 65536
    chunks = [(m.payload, list(m.properties.user_properties)) for m in received]
    assert reassemble(chunks) == payload


def test_subscribe_out_spools_into_its_directory(
    mosquitto_factory: Callable[..., Mosquitto], unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    """With `--out DIR`, what the subscriber spools is made in DIR: renamed into place at the
    end, never held in a /tmp that may be memory (tmpfs). Here a partial chunked message over
    the 64 KiB memory budget is seen spooled in DIR while its last chunk is held back."""
    broker = mosquitto_factory(max_packet_size=65536)
    topic = unique_topic("cli-spool")
    out = tmp_path / "out"
    env = {"OFFLOAD_SPOOL_THRESHOLD": "65536"}
    subscriber = start_subscriber(
        broker, topic, "--count", "1", "--timeout", "60", "--out", str(out), env=env
    )
    raw = MqttConnection(BrokerUrl.parse(broker.url), on_message=lambda m: None)
    raw.connect()
    try:
        payload = os.urandom(500_000)
        chunks = split(payload, topic=topic, qos=1, properties=None, limit=65536)
        for props, data in chunks[:-1]:
            raw.publish(topic, data, qos=1, properties=props).result(10)
        deadline = time.monotonic() + 20
        while not list(out.glob("offload-chunks-*")):
            assert time.monotonic() < deadline, f"nothing spooled in {out}: {list(out.iterdir())}"
            time.sleep(0.05)
        props, data = chunks[-1]
        raw.publish(topic, data, qos=1, properties=props).result(10)
        stdout, err = subscriber.communicate(timeout=60)
    finally:
        raw.close()
        subscriber.kill()
    (doc,) = lines(stdout)
    assert doc["sha256"] == hashlib.sha256(payload).hexdigest(), (stdout, err)
    assert [p.name for p in out.iterdir()] == [Path(str(doc["file"])).name]  # nothing left over


def test_out_of_order_duplicate_and_bad_checksum_through_subscribe(
    mosquitto_factory: Callable[..., Mosquitto], unique_topic: Callable[[str], str]
) -> None:
    broker = mosquitto_factory(max_packet_size=65536)
    topic = unique_topic("cli-ooo")
    subscriber = start_subscriber(broker, topic, "--count", "2", "--timeout", "30")
    raw = MqttConnection(BrokerUrl.parse(broker.url), on_message=lambda m: None)
    raw.connect()
    try:
        payload = os.urandom(500_000)
        chunks = split(payload, topic=topic, qos=1, properties=None, limit=65536)
        for props, data in [chunks[3], *reversed(chunks), chunks[0]]:
            raw.publish(topic, data, qos=1, properties=props).result(10)
        bad = split(os.urandom(200_000), topic=topic, qos=1, properties=None, limit=65536)
        first, data0 = bad[0]
        value = first.user_property("__chunk")
        assert value is not None
        first = first.without_user_properties("__chunk").with_user_properties(
            ("__chunk", value[:-64] + "f" * 64)
        )
        for props, data in [(first, data0), *bad[1:]]:
            raw.publish(topic, data, qos=1, properties=props).result(10)
        out, err = subscriber.communicate(timeout=60)
    finally:
        raw.close()
        subscriber.kill()
    docs = lines(out)
    assert len(docs) == 2, (out, err)
    assert docs[0]["sha256"] == hashlib.sha256(payload).hexdigest()
    assert docs[1]["error"] == "checksum mismatch"
    assert subscriber.returncode == 1  # an error line was printed


def test_20_mib_file_through_the_gateway(
    gateway: GatewayServer, unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    broker: Mosquitto = gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("cli-big")
    payload = os.urandom(20 * MiB)
    source = tmp_path / "big.bin"
    source.write_bytes(payload)
    plain = subprocess.Popen(
        ["mosquitto_sub", "-p", str(broker.port), "-V", "5", "-t", topic, "-C", "1",
         "-W", "60", "-F", "%P\t%p"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    subscriber = start_subscriber(
        broker, topic, "--count", "1", "--timeout", "60", "--out", str(tmp_path / "out")
    )
    try:
        result = run("publish", "--broker", broker.url, "--topic", topic, "--file", str(source))
        assert result.returncode == 0, result.stderr
        (doc,) = lines(result.stdout)
        assert doc["route"] == "offloaded"
        out, err = subscriber.communicate(timeout=120)
        seen, _ = plain.communicate(timeout=60)
    finally:
        subscriber.kill()
        plain.kill()
    assert subscriber.returncode == 0, err
    (got,) = lines(out)
    assert got["route"] == "offloaded" and got["size"] == 20 * MiB
    assert Path(str(got["file"])).read_bytes() == payload
    assert len(seen) < 1024 and b"_format" in seen and b"external" in seen
    assert "due to" not in broker.log()

    fetched = tmp_path / "fetched.bin"
    res = run("fetch", str(doc["url"]), "-o", str(fetched))
    assert res.returncode == 0, res.stderr
    assert fetched.read_bytes() == payload

    disc = run("discover", "--broker", broker.url)
    assert disc.returncode == 0, disc.stderr
    assert lines(disc.stdout)[0]["LargeMessageUploadEndpoint"] == gateway.url


def test_exit_codes(
    mosquitto_factory: Callable[..., Mosquitto], unique_topic: Callable[[str], str]
) -> None:
    broker = mosquitto_factory(max_packet_size=65536)
    topic = unique_topic("cli-exit")
    too_big = run(
        "publish", "--broker", broker.url, "--topic", topic, "--message", "x" * 70000,
        "--no-chunking", "--discovery-wait", "0.2",
    )  # fmt: skip
    assert too_big.returncode == 4, too_big.stderr
    assert "exceeds the broker limit of 65536" in too_big.stderr

    stopped = mosquitto_factory()
    url = stopped.url
    stopped.stop()
    refused = run("publish", "--broker", url, "--topic", topic, "--message", "x")
    assert refused.returncode == 3

    assert run("publish", "--broker", "http://x", "--topic", topic, "-m", "x").returncode == 2
    assert run("publish", "--topic", topic).returncode == 2  # argparse usage error
    nothing = run("discover", "--broker", broker.url, "--timeout", "0.5")
    assert nothing.returncode == 1
    assert lines(nothing.stdout)[0]["error"] == "no discovery record"


def test_credentials_in_the_url(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
) -> None:
    shared = Path(tempfile.mkdtemp(prefix="cli-auth-"))
    shared.chmod(0o755)  # mosquitto drops root and cannot read pytest's 0700 tmp_path
    passwd = shared / "passwd"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(passwd), "alice", "s3cret"], check=True)
    passwd.chmod(0o644)
    broker = mosquitto_factory(extra_config=f"allow_anonymous false\npassword_file {passwd}")
    topic = unique_topic("cli-auth")
    host = f"127.0.0.1:{broker.port}"
    ok = run("publish", "--broker", f"mqtt://alice:s3cret@{host}", "--topic", topic, "-m", "hi")
    assert ok.returncode == 0, ok.stderr
    flags = run(
        "publish", "--broker", f"mqtt://{host}", "--username", "alice", "--password", "s3cret",
        "--topic", topic, "-m", "hi",
    )  # fmt: skip
    assert flags.returncode == 0, flags.stderr
    bad = run("publish", "--broker", f"mqtt://alice:wrong@{host}", "--topic", topic, "-m", "hi")
    assert bad.returncode == 3
    assert "s3cret" not in bad.stderr
    # One line, as every failure (the refusal was logged as a WARNING first: two lines).
    assert bad.stderr == "offload: broker refused the connection: Not authorized\n", bad.stderr
    shutil.rmtree(shared, ignore_errors=True)


def test_local_file_mistakes_are_clear_errors_not_tracebacks(
    broker: Mosquitto, tmp_path: Path
) -> None:
    missing = run("publish", "--broker", broker.url, "--topic", "t", "--file", "/no/such/file")
    assert missing.returncode == 2
    assert "cannot read /no/such/file: no such file" in missing.stderr
    assert "Traceback" not in missing.stderr
    unwritable = run("fetch", "http://127.0.0.1:9/msg/x", "-o", str(tmp_path))  # a directory
    assert unwritable.returncode == 2
    assert "Traceback" not in unwritable.stderr


def test_failed_fetch_keeps_the_earlier_file_and_leaves_no_partial(
    gateway_factory: Callable[..., GatewayServer], tmp_path: Path
) -> None:
    gw = gateway_factory(None)
    target = tmp_path / "keep.bin"
    target.write_bytes(b"earlier download")
    result = run("fetch", f"{gw.url}/msg/00000000-0000-4000-8000-000000000000", "-o", str(target))
    assert result.returncode == 5
    assert "not found" in result.stderr
    assert target.read_bytes() == b"earlier download"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.bin"]


# -- user mistakes: one line, one stable exit code (client/commands/_errors.py) -----------------

ID = "00000000-0000-4000-8000-000000000000"


@dataclass(frozen=True)
class Mistake:
    """A command a user might type, the exit code it gets and words its one line contains."""

    args: tuple[str, ...]
    code: int
    says: str


def _mistakes(
    broker: str, dead_broker: str, gw: str, dead_gw: str, tmp: Path
) -> dict[str, Mistake]:
    ok_file = tmp / "x.bin"
    ok_file.write_bytes(b"x" * 100)
    return {
        "publish to a wildcard topic, before connecting": Mistake(
            ("publish", "--broker", dead_broker, "-t", "a/#", "-m", "x"), 2,
            "offload publish: error: invalid topic 'a/#': wildcards are not allowed",
        ),
        "upload to a wildcard topic, before connecting": Mistake(
            ("upload", "--endpoint", dead_gw, "-t", "a/#", "-f", str(ok_file)), 2,
            "offload upload: error: invalid topic 'a/#'",
        ),
        "subscribe to a malformed filter": Mistake(
            ("subscribe", "--broker", dead_broker, "-t", "a/#/b"), 2,
            "'#' must be a whole last level",
        ),
        "fetch a URL with a typo in the scheme": Mistake(
            ("fetch", f"htp://127.0.0.1:9/msg/{ID}"), 2,
            "offload fetch: error: the URL must be an http:// or https:// URL",
        ),
        "a broker URL that is not mqtt://": Mistake(
            ("publish", "--broker", "http://x", "-t", "t", "-m", "x"), 2,
            "offload publish: error: broker URL must be mqtt:// or mqtts://",
        ),
        "a broker URL without the colon of its scheme": Mistake(  # issue 43, item 6
            ("subscribe", "--broker", "mqtt//127.0.0.1:1883", "-t", "t"), 2,
            "offload subscribe: error: broker URL 'mqtt//127.0.0.1:1883' has no '://' after "
            "its scheme: did you mean 'mqtt://127.0.0.1:1883'? (see 'offload subscribe --help')",
        ),
        "an endpoint URL that is not http://": Mistake(
            ("publish", "--broker", dead_broker, "--endpoint", "htp://x", "-t", "t", "-m", "x"), 2,
            "offload publish: error: endpoint must be an http(s) URL",
        ),
        "publish without --file or --message": Mistake(
            ("publish", "--broker", broker, "-t", "t"), 2,
            "offload publish: error: one of the arguments --file/-f --message/-m is required "
            "(see 'offload publish --help')",
        ),
        "upload without --file": Mistake(
            ("upload", "--endpoint", gw, "-t", "t"), 2,
            "offload upload: error: the following arguments are required: --file/-f",
        ),
        "an unknown subcommand": Mistake(("pubilsh",), 2, "offload: error: argument command"),
        "publish a file that does not exist": Mistake(
            ("publish", "--broker", dead_broker, "-t", "t", "-f", "/no/such/file"), 2,
            "offload publish: error: cannot read /no/such/file: no such file",
        ),
        "fetch into a directory that does not exist": Mistake(
            ("fetch", f"{gw}/msg/{ID}", "-o", "/no/such/dir/x.bin"), 2,
            "offload fetch: error: cannot write /no/such/dir/x.bin: no such directory",
        ),
        "upload with an API path as the endpoint": Mistake(
            ("upload", "--endpoint", f"{gw}/msg", "-t", "t", "-f", str(ok_file)), 2,
            "--endpoint is the gateway's base URL (http://HOST:PORT), not /msg",
        ),
        "a broker port where nothing listens": Mistake(
            ("publish", "--broker", dead_broker, "-t", "t", "-m", "x"), 3,
            f"offload: cannot connect to {dead_broker.removeprefix('mqtt://')}",
        ),
        "too large with chunking off and no gateway": Mistake(
            ("publish", "--broker", broker, "-t", "t", "-m", "x" * 70000, "--no-chunking",
             "--discovery-topic", "no/gateway/here", "--discovery-wait", "0.2"), 4,
            "exceeds the broker limit of 65536 bytes",
        ),
        "fetch from a gateway that is down": Mistake(
            ("fetch", f"{dead_gw}/msg/{ID}"), 5,
            f"offload: fetch failed: {dead_gw}/msg/{ID}/payload: cannot connect (connection "
            "refused: is the gateway running there?)",
        ),
        "fetch a message that does not exist": Mistake(
            ("fetch", f"{gw}/msg/{ID}"), 5, f"offload: not found: {gw}/msg/{ID}/payload: HTTP 404",
        ),
        # Issue 51: every numeric flag of every command, refused before anything connects
        # (a negative --timeout was a traceback, exit 1; --count 0 and -1 ran silently).
        "subscribe --timeout -1": Mistake(
            ("subscribe", "--broker", broker, "-t", "t", "--timeout", "-1"), 2,
            "offload subscribe: error: argument --timeout: must be more than 0 seconds, got '-1' "
            "(see 'offload subscribe --help')",
        ),
        "subscribe --timeout nan": Mistake(
            ("subscribe", "--broker", broker, "-t", "t", "--timeout", "nan"), 2,
            "argument --timeout: must be more than 0 seconds, got 'nan'",
        ),
        "subscribe --count 0": Mistake(
            ("subscribe", "--broker", broker, "-t", "t", "--count", "0", "--timeout", "1"), 2,
            "offload subscribe: error: argument --count/-c: must be at least 1, got '0'",
        ),
        "subscribe --count -1": Mistake(
            ("subscribe", "--broker", broker, "-t", "t", "--count", "-1", "--timeout", "1"), 2,
            "argument --count/-c: must be at least 1, got '-1'",
        ),
        "subscribe --chunk-timeout inf": Mistake(
            ("subscribe", "--broker", broker, "-t", "t", "--chunk-timeout", "inf",
             "--timeout", "1"), 2,
            "argument --chunk-timeout: must be more than 0 seconds, got 'inf'",
        ),
        "subscribe --fetch-concurrency 0": Mistake(
            ("subscribe", "--broker", broker, "-t", "t", "--fetch-concurrency", "0",
             "--timeout", "1"), 2,
            "argument --fetch-concurrency: must be at least 1, got '0'",
        ),
        "subscribe --discovery-wait nan": Mistake(
            ("subscribe", "--broker", broker, "-t", "t", "--discovery-wait", "nan",
             "--timeout", "1"), 2,
            "argument --discovery-wait: must be 0 or more seconds, got 'nan'",
        ),
        # A finite wait past what the clocks count: OverflowError, a traceback, exit 1.
        "subscribe --timeout 1e10": Mistake(
            ("subscribe", "--broker", broker, "-t", "t", "--timeout", "1e10"), 2,
            "argument --timeout: must be at most 4294967295 seconds, got '1e10'",
        ),
        "discover --timeout 1e300": Mistake(
            ("discover", "--broker", broker, "--timeout", "1e300"), 2,
            "argument --timeout: must be at most 4294967295 seconds, got '1e300'",
        ),
        "discover --timeout -1": Mistake(
            ("discover", "--broker", broker, "--timeout", "-1"), 2,
            "offload discover: error: argument --timeout: must be more than 0 seconds",
        ),
        "publish --max-packet-size over MQTT's": Mistake(
            ("publish", "--broker", broker, "-t", "t", "-m", "x", "--max-packet-size",
             "999999999999"), 2,
            "argument --max-packet-size: must be 1 to 268435460, got '999999999999'",
        ),
        "publish --offload-threshold 0": Mistake(
            ("publish", "--broker", broker, "-t", "t", "-m", "x", "--offload-threshold", "0"), 2,
            "argument --offload-threshold: must be at least 1, got '0'",
        ),
        "publish --session-expiry -1": Mistake(
            ("publish", "--broker", broker, "-t", "t", "-m", "x", "--client-id", "c",
             "--session-expiry", "-1"), 2,
            "argument --session-expiry: must be 0 to 4294967295, got '-1'",
        ),
        "publish --will-delay x": Mistake(
            ("publish", "--broker", broker, "-t", "t", "-m", "x", "--will-topic", "w",
             "--will-delay", "x"), 2,
            "offload publish: error: argument --will-delay: must be a whole number, got 'x'",
        ),
        "upload --segment-size 0": Mistake(
            ("upload", "--endpoint", gw, "-t", "t", "-f", str(ok_file), "--segment-size", "0"), 2,
            "offload upload: error: argument --segment-size: must be at least 1, got '0'",
        ),
        "fetch something that is neither a URL nor an id": Mistake(
            ("fetch", "not-an-id"), 2,
            "offload fetch: error: the URL must be an http:// or https:// URL, or a message id "
            "(as publish prints it), got 'not-an-id'",
        ),
        "upload to a gateway that is down": Mistake(
            ("upload", "--endpoint", dead_gw, "-t", "t", "-f", str(ok_file)), 5,
            f"offload: upload failed: {dead_gw}/uploads/: cannot connect (connection refused",
        ),
    }  # fmt: skip


MISTAKES = list(_mistakes("b", "d", "g", "x", Path(tempfile.gettempdir())))


@pytest.fixture(scope="module")
def mistake_table(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Mistake]]:
    from gateway import Settings

    tmp = tmp_path_factory.mktemp("mistakes")
    broker = Mosquitto(max_packet_size=65536).start()
    gw = GatewayServer(
        Settings(storage_url=f"file://{tmp / 'store'}", mqtt_url=broker.url, allow_anonymous=True)
    )
    gw.start()
    try:
        yield _mistakes(broker.url, f"mqtt://127.0.0.1:{free_port()}", gw.url,
                        f"http://127.0.0.1:{free_port()}", tmp)  # fmt: skip
    finally:
        gw.stop()
        broker.close()


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_user_mistake_is_one_line_with_its_exit_code(
    mistake: str, mistake_table: dict[str, Mistake]
) -> None:
    row = mistake_table[mistake]
    result = run(*row.args, timeout=60)
    assert result.returncode == row.code, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # one line, nothing else
    assert row.says in result.stderr
    for internal in ("Traceback", "Error(", "Error:", ".part", "usage:"):
        assert internal not in result.stderr
    words = result.stderr.split(": ")
    assert len(words) == len(set(words)), "a part of the message repeats"


def test_checksum_mismatch_names_its_cause_once(mistake_table: dict[str, Mistake]) -> None:
    ok = mistake_table["fetch a message that does not exist"].args[1].rsplit("/msg/", 1)[0]
    published = httpx.post(f"{ok}/publish/mistakes/sum", content=b"payload")
    assert published.status_code == 201, published.text
    url = published.json()["url"]
    result = run("fetch", url, "--sha256", "0" * 64)
    assert result.returncode == 5
    assert result.stderr.count("checksum mismatch") == 1, result.stderr
    assert result.stderr.startswith(f"offload: checksum mismatch: {url}/payload: expected 000")


def test_no_plain_http_warning_for_a_gateway_on_loopback(
    mistake_table: dict[str, Mistake],
) -> None:
    broker = mistake_table["too large with chunking off and no gateway"].args[2]
    result = run(
        "publish", "--broker", broker, "-t", "mistakes/big", "-m", "x" * 100_000,
        "--discovery-wait", "10",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["route"] == "offloaded"
    assert result.stderr == ""  # 127.0.0.1: nothing travels over a network
