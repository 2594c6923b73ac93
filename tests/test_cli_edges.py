"""The rough edges a new user met in `offload` (issue 27): the console script in
subprocesses against a real mosquitto and gateway (file store, no passwords)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from test_cli_upload import _run_on_tty

from client.commands._progress import PassReader, Progress
from client.core._source import PayloadSource
from client.http._upload import TusUploader

from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

OFFLOAD = shutil.which("offload") or "offload"
MiB = 1024 * 1024
#: The first six keys of every message line, in this order (client/commands/_output.py).
MESSAGE_KEYS = ["topic", "id", "size", "sha256", "route", "url"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env["OFFLOAD_CONFIG"] = os.devnull
    return {**env, **extra}


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OFFLOAD, *args], capture_output=True, text=True, timeout=120, env=env or _env()
    )


@dataclass(frozen=True)
class Stack:
    broker: Mosquitto
    gateway: GatewayServer


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from gateway import Settings

    store = tmp_path_factory.mktemp("edges-store")
    broker = Mosquitto(max_packet_size=65536).start()
    gw = GatewayServer(
        Settings(  # type: ignore[call-arg]
            storage_url=f"file://{store}",
            mqtt_url=broker.url,
            allow_anonymous=True,
            discovery_interval=5.0,
        )
    )
    gw.start()
    try:
        yield Stack(broker, gw)
    finally:
        gw.stop()
        broker.close()


# -- item 5: the publish progress bar ----------------------------------------------------------


def test_the_bar_shows_each_pass_over_the_file_against_its_size() -> None:
    """A publish reads its file twice (hash, then send); the bar never counts both."""
    size = 3 * MiB + 5
    screen = io.StringIO()
    bar = Progress(size, label="publish", stream=screen, enabled=True)
    with PayloadSource(PassReader(io.BytesIO(os.urandom(size)), bar, size)) as source:  # type: ignore[arg-type]
        assert source.sha256
        assert bar.done == size and bar.label == "publish 1/2"
        first = source.read_at(0, MiB) + source.read_at(MiB, MiB)
        assert bar.done == 2 * MiB and bar.label == "publish 2/2"
        # A retry re-reads from the start: counted only past the furthest offset of this pass.
        assert source.read_at(0, MiB) == first[:MiB]
        assert bar.done == 2 * MiB
        sent = len(first) + len(source.read_at(2 * MiB, size))
    bar.close()
    assert sent == size
    assert bar.done == bar.total == size and bar.label == "publish 2/2"
    last = screen.getvalue().rsplit("\r\x1b[2K", 1)[-1]
    assert last.startswith("publish 2/2  3.0 MiB / 3.0 MiB (100%)"), last


def test_a_large_publish_ends_its_bar_at_the_files_size(stack: Stack, tmp_path: Path) -> None:
    file = tmp_path / "big.bin"
    file.write_bytes(os.urandom(9 * MiB))
    code, out, bar = _run_on_tty(
        [OFFLOAD, "publish", "--broker", stack.broker.url, "-t", "edges/bar", "-f", str(file),
         "--discovery-wait", "10"],
        _env(),
    )  # fmt: skip
    assert code == 0, bar
    assert json.loads(out)["route"] == "offloaded"
    assert "publish 2/2  9.0 MiB / 9.0 MiB (100%)" in bar
    assert "18.0 MiB" not in bar  # the sum of both passes, as before


# -- item 7: flags, endpoint, resume, broken pipe ----------------------------------------------


def test_version_and_config_on_either_side_of_the_subcommand(tmp_path: Path) -> None:
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("offload "), version
    config = tmp_path / "offload.toml"
    config.write_text('broker = "http://not-mqtt"\n')  # read if the flag is taken
    for args in (("--config", str(config), "publish"), ("publish", "--config", str(config))):
        result = run(*args, "-t", "t", "-m", "x")
        assert result.returncode == 2, result.stderr
        assert "broker URL must be mqtt:// or mqtts://" in result.stderr


def test_each_subcommand_lists_only_its_own_flags() -> None:
    publish_only = ("--offload-threshold", "--chunking", "--automatic-offload",
                    "--fallback-on-auth-failure")  # fmt: skip
    shown = {c: run(c, "--help").stdout for c in ("publish", "subscribe", "discover")}
    for flag in publish_only:
        assert flag in shown["publish"]
        assert flag not in shown["subscribe"] and flag not in shown["discover"]
    for flag in ("--endpoint", "--discovery-wait", "--max-packet-size", "--chunk-timeout"):
        assert flag not in shown["discover"]
    assert "--chunk-timeout" in shown["subscribe"] and "--chunk-timeout" not in shown["publish"]


def test_discover_asks_the_broker_whatever_endpoint_is_configured(stack: Stack) -> None:
    """`discover` has no --endpoint; one in the environment (the user's usual settings) no
    longer makes it a usage error: it asks the broker all the same."""
    found = run("discover", "--broker", stack.broker.url, "--timeout", "20",
                env=_env(OFFLOAD_ENDPOINT="http://127.0.0.1:9/msg"))  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["LargeMessageUploadEndpoint"] == stack.gateway.url


def test_upload_takes_the_gateway_from_the_environment(stack: Stack, tmp_path: Path) -> None:
    file = tmp_path / "f.bin"
    file.write_bytes(os.urandom(1000))
    args = ("upload", "-t", "edges/env", "-f", str(file), "--state-dir", str(tmp_path / "s"))
    missing = run(*args)
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1
    assert "--endpoint URL, OFFLOAD_ENDPOINT or OFFLOAD_PUBLIC_URL" in missing.stderr
    for name in ("OFFLOAD_PUBLIC_URL", "OFFLOAD_ENDPOINT"):
        done = run(*args, env=_env(**{name: stack.gateway.url}))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["url"].startswith(stack.gateway.url)
    # A message id alone is fetched from that gateway too.
    message_id = json.loads(done.stdout)["id"]
    out = tmp_path / "back.bin"
    fetched = run(
        "fetch", message_id, "-o", str(out), env=_env(OFFLOAD_PUBLIC_URL=stack.gateway.url)
    )
    assert fetched.returncode == 0, fetched.stderr
    assert out.read_bytes() == file.read_bytes()


def _half_upload(stack: Stack, file: Path, topic: str, state_dir: Path) -> int:
    """Upload the first segment of `file` and stop, as a killed `offload upload` would."""

    class Stop(Exception):
        pass

    def stop(n: int) -> None:
        raise Stop

    with httpx.Client(timeout=60) as http:
        uploader = TusUploader(http, stack.gateway.url, state_dir=state_dir, segment=MiB)
        with pytest.raises(Stop):
            uploader.upload(file, topic, on_bytes=stop)
    return MiB


def test_an_unfinished_upload_is_resumed_by_default_and_says_so(
    stack: Stack, tmp_path: Path
) -> None:
    file = tmp_path / "big.bin"
    file.write_bytes(os.urandom(3 * MiB))
    state_dir = tmp_path / "state"
    args = ("upload", "--endpoint", stack.gateway.url, "-t", "edges/resume", "-f", str(file),
            "--state-dir", str(state_dir), "--segment-size", str(MiB))  # fmt: skip
    done_before = _half_upload(stack, file, "edges/resume", state_dir)
    resumed = run(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["resumed_from"] == done_before
    assert resumed.stderr == (
        f"offload: continuing the unfinished upload of {file} from byte {done_before} "
        "(--no-resume starts over)\n"
    )
    _half_upload(stack, file, "edges/resume", state_dir)
    restarted = run(*args, "--no-resume")
    assert restarted.returncode == 0, restarted.stderr
    assert json.loads(restarted.stdout)["resumed_from"] == 0 and restarted.stderr == ""
    line = json.loads(restarted.stdout)
    assert line["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()


def test_a_state_file_cut_short_starts_the_upload_over(stack: Stack, tmp_path: Path) -> None:
    file = tmp_path / "f.bin"
    file.write_bytes(os.urandom(2 * MiB))
    state_dir = tmp_path / "state"
    _half_upload(stack, file, "edges/cut", state_dir)
    (state,) = state_dir.glob("*.json")
    for garbage in ('{"url": "http://127.0', "[]", '{"url": 1, "sha256": null}'):
        state.write_text(garbage)  # killed while writing it, or edited by hand
        done = run("upload", "--endpoint", stack.gateway.url, "-t", "edges/cut", "-f", str(file),
                   "--state-dir", str(state_dir))  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["resumed_from"] == 0 and done.stderr == ""


def test_a_reader_that_stops_early_ends_fetch_quietly(stack: Stack) -> None:
    payload = os.urandom(4 * MiB)  # far more than a pipe holds
    stored = httpx.post(f"{stack.gateway.url}/publish/edges/pipe", content=payload, timeout=60)
    assert stored.status_code == 201, stored.text
    url = stored.json()["url"]
    sha = hashlib.sha256(payload).hexdigest()
    for extra in ((), ("--sha256", sha)):
        proc = subprocess.Popen(
            [OFFLOAD, "fetch", url, *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_env(),
        )
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read(10) == payload[:10]
        proc.stdout.close()  # `| head -c 10`
        err = proc.stderr.read()
        assert proc.wait(60) == 141, err
        assert err == b""


# -- item 8: one message line, and subscribe's timeout -----------------------------------------


def test_every_command_prints_the_same_message_line(stack: Stack, tmp_path: Path) -> None:
    topic = "edges/schema"
    file = tmp_path / "f.bin"
    file.write_bytes(os.urandom(200_000))  # over the 64 KiB broker: offloaded
    sha = hashlib.sha256(file.read_bytes()).hexdigest()
    published = run("publish", "--broker", stack.broker.url, "-t", topic, "-f", str(file),
                    "--retain", "--discovery-wait", "10")  # fmt: skip
    assert published.returncode == 0, published.stderr
    received = run("subscribe", "--broker", stack.broker.url, "-t", topic, "--count", "1",
                   "--timeout", "30", "--discovery-wait", "10")  # fmt: skip
    assert received.returncode == 0, received.stderr
    uploaded = run("upload", "--endpoint", stack.gateway.url, "-t", topic, "-f", str(file),
                   "--state-dir", str(tmp_path / "s"))  # fmt: skip
    assert uploaded.returncode == 0, uploaded.stderr
    pub, sub, up = (json.loads(r.stdout) for r in (published, received, uploaded))
    fetched = run("fetch", str(pub["url"]), "-o", str(tmp_path / "back.bin"))
    assert fetched.returncode == 0, fetched.stderr
    got = json.loads(fetched.stdout)
    raw = run("fetch", f"{pub['url']}/payload", "-o", str(tmp_path / "raw.bin"))
    assert json.loads(raw.stdout)["id"] == pub["id"], raw.stderr
    for doc in (pub, sub, up, got):
        assert list(doc)[:6] == MESSAGE_KEYS, doc
        assert doc["size"] == 200_000 and doc["sha256"] == sha and doc["route"] == "offloaded"
    assert pub["topic"] == sub["topic"] == up["topic"] == topic and got["topic"] is None
    assert pub["id"] == sub["id"] == got["id"] and pub["url"] == got["url"]
    assert up["url"].endswith(f"/msg/{up['id']}")
    assert pub["qos"] == sub["qos"] == 1 and pub["retain"] is True


def test_subscribe_that_receives_too_few_messages_fails(stack: Stack) -> None:
    result = run("subscribe", "--broker", stack.broker.url, "-t", "edges/nothing", "--count",
                 "1", "--timeout", "1")  # fmt: skip
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == "offload: 0 of 1 messages before --timeout ran out\n"
    idle = run("subscribe", "--broker", stack.broker.url, "-t", "edges/nothing", "--timeout", "1")
    assert idle.returncode == 0 and idle.stderr == ""  # no --count: an idle stop is the end
