"""The README's walk-through, run as written against the stack `scripts/up.sh` starts.

The commands between `<!-- walkthrough:begin -->` and `<!-- walkthrough:end -->` are taken
from README.md and run by bash, unchanged, in a directory laid out like a checkout after
`up.sh`: `.venv` (this interpreter's environment) and `.stack` (a stack serving on free
ports, started by `scripts/stack.py`, which `up.sh` runs after installing). So the README
cannot drift from what works.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from _gateway import GatewayServer
from _servers import SeaweedFS

pytestmark = [pytest.mark.servers, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(
    r"<!-- walkthrough:begin(?: (?P<name>\w+))? -->\s*```sh\n(?P<body>.*?)```\s*"
    r"<!-- walkthrough:end -->",
    re.S,
)


def walkthrough() -> dict[str, str]:
    """The README's walk-through blocks by name ("" for the unnamed one)."""
    blocks = {m["name"] or "": m["body"] for m in BLOCK.finditer((ROOT / "README.md").read_text())}
    assert set(blocks) == {"", "spark", "proxy"}, "the README's walk-through markers moved"
    return blocks


@dataclass(frozen=True)
class Stack:
    state: Path  # what `.stack` is in a checkout
    direct: bool  # direct transfers on (the stack says so when its gateway is up)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A serving stack."""
    state = tmp_path_factory.mktemp("stack") / ".stack"
    env = os.environ | {"STACK_DIR": str(state), "STACK_MQTT_PORT": "0", "STACK_S3_PORT": "0",
                        "STACK_GATEWAY_PORT": "0", "STACK_PROXY_PORT": "0"}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "stack.py")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 240
    while not any(line.startswith("Serving.") for line in seen):
        assert proc.poll() is None and time.monotonic() < deadline, "".join(seen)
        seen.append(proc.stdout.readline())
    (gateway,) = [line for line in seen if line.startswith("==> gateway on ")]
    try:
        yield Stack(state, "direct transfers on" in gateway)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)  # it stops in seconds: a bound, not a pause


def _checkout(tmp_path: Path, stack: Stack) -> Path:
    """A directory laid out like a checkout after `up.sh`: `.venv` and `.stack`."""
    (tmp_path / ".venv").symlink_to(sys.prefix)
    (tmp_path / ".stack").symlink_to(stack.state)
    return tmp_path


@dataclass(frozen=True)
class Ran:
    """The walk-through's shell: its exit, outputs, and where it left its files."""

    returncode: int
    stdout: str
    stderr: str
    scratch: Path  # its working directory at the end
    left: list[str]  # what is in the checkout after it


def _bash(script: str, cwd: Path, timeout: float) -> Ran:
    own = ("OFFLOAD_", "VIRTUAL_ENV", "STACK_")  # the example's shell sets these itself
    env = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    env["OFFLOAD_CONFIG"] = os.devnull  # a user's own config file is not part of the example
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script + '\necho "scratch: $PWD"'],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    out, _, where = done.stdout.rpartition("scratch: ")
    left = sorted(p.name for p in cwd.iterdir())
    return Ran(done.returncode, out, done.stderr, Path(where.strip() or cwd), left)


#: A checkout after the walk-through: nothing but what up.sh made (issue 51: it left big.bin,
#: got.bin and received.jsonl untracked there).
CLEAN = [".stack", ".venv"]


def test_walkthrough_publish_subscribe_and_curl(stack: Stack, tmp_path: Path) -> None:
    cwd = _checkout(tmp_path, stack)
    done = _bash(walkthrough()[""], cwd, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "", done.stderr  # no warnings, no noise
    assert done.left == CLEAN
    digest = hashlib.sha256((done.scratch / "big.bin").read_bytes()).hexdigest()
    received = (done.scratch / "received.jsonl").read_text().splitlines()
    lines = [json.loads(line) for line in received]
    assert sorted(line["topic"] for line in lines) == ["demo/big", "demo/curl"]
    for line in lines:
        assert line["sha256"] == digest and line["size"] == 5_000_000
        assert line["route"] == "offloaded"
        assert "content_type" not in line  # curl's default form type is not kept
    assert f"{digest}  big.bin" in done.stdout
    # How each got in, from the gateway's access log: `offload publish` with SCRAM (a 401
    # challenge, then the request), over direct transfers (the stack has them on); curl
    # with Basic over TLS (no challenge).
    ids = {line["topic"]: line["id"] for line in lines}
    log = (stack.state / "gateway.log").read_text()
    assert stack.direct, "the stack serves direct transfers (scripts/stack.py)"
    grant = re.escape('"POST /direct/grant/demo/big HTTP/1.1"')
    assert re.search(rf"{grant} 401\n.*?{grant} 201\n", log, re.S), log
    # the self-check's commit and this one, each after its SCRAM challenge
    assert log.count('"POST /direct/commit HTTP/1.1" 201') >= 2, log
    assert f"PUT /msg/{ids['demo/big']}" not in log
    assert '"POST /publish/demo/curl?qos=1 HTTP/1.1" 201' in log
    assert '"POST /publish/demo/curl?qos=1 HTTP/1.1" 401' not in log


def test_walkthrough_plain_mosquitto_tools_through_the_proxy(stack: Stack, tmp_path: Path) -> None:
    """The proxy block after the first one, in one shell: 5 MB from plain mosquitto_pub to
    plain mosquitto_sub through offload-proxy, across the 256 KiB broker."""
    cwd = _checkout(tmp_path, stack)
    blocks = walkthrough()
    done = _bash(blocks[""] + blocks["proxy"], cwd, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.left == CLEAN
    assert "5 MB byte-exact through offload-proxy" in done.stdout, done.stdout
    assert (done.scratch / "got.bin").read_bytes() == (done.scratch / "big.bin").read_bytes()
    # The proxy stored it: it did not cross the broker whole.
    log = [json.loads(line) for line in (stack.state / "proxy.log").read_text().splitlines()
           if line.startswith("{")]  # fmt: skip
    assert any(e["message"] == "offloaded" and e.get("topic") == "demo/plain" for e in log), log


@pytest.mark.spark
def test_walkthrough_top_to_bottom_with_spark(stack: Stack, tmp_path: Path) -> None:
    """Both blocks in one shell, as a reader goes through them in one terminal."""
    cwd = _checkout(tmp_path, stack)
    blocks = walkthrough()
    done = _bash(blocks[""] + blocks["spark"], cwd, timeout=420)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.left == CLEAN
    digest = hashlib.sha256((done.scratch / "big.bin").read_bytes()).hexdigest()
    # Spark's table: this run's two messages (and those of any earlier run, other digests).
    rows = re.findall(rf"\|(demo/\w+)\s*\|5000000\|{digest}\|", done.stdout)
    assert sorted(rows) == ["demo/big", "demo/curl"], done.stdout


def _http_block() -> list[str]:
    """The README's curl commands that download a payload, as written there."""
    section = (ROOT / "README.md").read_text().split("### Plain HTTP and hop-client", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines()
            if line.startswith("curl") and "/payload" in line]  # fmt: skip


def test_the_readmes_payload_downloads_work_with_direct_transfers(
    gateway_factory: Callable[..., GatewayServer], seaweed: SeaweedFS, tmp_path: Path
) -> None:
    """Issue 51: on the stack (direct downloads) they got a 307 with an empty body."""
    gw = gateway_factory(None, s3_public_url=f"http://{seaweed.endpoint}")
    payload = os.urandom(1000)
    message_id = str(uuid.uuid4())
    stored = httpx.put(f"{gw.url}/msg/{message_id}?topic=readme/curl", content=payload)
    assert stored.status_code == 201, stored.text
    assert httpx.get(f"{gw.url}/msg/{message_id}/payload").status_code == 307  # direct
    commands = _http_block()
    assert len(commands) == 2, commands
    for command in commands:
        typed = command.replace("http://gateway:8080", gw.url).replace("<id>", message_id)
        done = subprocess.run(["bash", "-c", typed], capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        wanted = payload[100:200] if "-r 100-199" in command else payload
        assert done.stdout == wanted, command


def test_installing_by_hand_names_every_extra() -> None:
    """Issue 51: it left out `proxy` and `otel`."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    named = set(extras["optional-dependencies"]) - {"test"}  # in [all]: "the test tools"
    text = (ROOT / "README.md").read_text().split("**Installing by hand.**", 1)[1]
    paragraph = text.split("\n\n", 1)[0]
    assert {
        extra for extra in named if f"[{extra}]" in paragraph or f",{extra}]" in paragraph
    } == named
