"""The CLI's rough edges a new user met (issue 51 §4): the real `offload` in subprocesses,
against a real mosquitto and gateway, each command as the user typed it."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_cli_upload import _run_on_tty

from _auth import credential_files
from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers

OFFLOAD = shutil.which("offload") or "offload"
MiB = 1024 * 1024


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    return {**env, "OFFLOAD_CONFIG": os.devnull, **extra}


def offload(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OFFLOAD, *args], capture_output=True, text=True, timeout=120, env=_env(**env)
    )


# -- a publish the broker refuses -----------------------------------------------------------


@pytest.fixture
def guarded(mosquitto_factory: Callable[..., Mosquitto]) -> Iterator[Mosquitto]:
    """A broker whose ACL lets alice write under alice/ only."""
    acl = "user alice\ntopic readwrite alice/#\n"
    with credential_files("offload-rough-", {"alice": "s3cret"}, acl) as files:
        config = f"password_file {files / 'passwd'}\nacl_file {files / 'acl'}\n"
        yield mosquitto_factory(extra_config=config)


def test_a_small_publish_the_broker_refuses_names_its_topic_and_exits_3(
    guarded: Mosquitto,
) -> None:
    """It said "publish to 'mid 1' rejected" (the packet id), exit 1: a code docs/cli.md
    does not list."""
    done = offload("publish", "--broker", guarded.url, "--username", "alice", "--password",
                   "s3cret", "--topic", "bob/x", "--message", "hi", "--qos", "1")  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stderr == "offload: publish to 'bob/x' rejected: Not authorized\n"
    assert done.stdout == ""
    allowed = offload("publish", "--broker", guarded.url, "--username", "alice", "--password",
                      "s3cret", "--topic", "alice/x", "--message", "hi", "--qos", "1")  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr


# -- the publish progress bar ---------------------------------------------------------------


def test_a_direct_upload_reads_the_file_in_two_passes_as_the_bar_says(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    seaweed: SeaweedFS,
    tmp_path: Path,
) -> None:
    """docs/cli.md shows `publish 1/2`, `publish 2/2`; a direct upload (the stack's) drew
    `publish 3/3`: it read the file a third time, for its parts' SHA-256s."""
    gateway_factory(broker, s3_public_url=f"http://{seaweed.endpoint}")
    file = tmp_path / "big.bin"
    file.write_bytes(os.urandom(9 * MiB))
    code, out, bar = _run_on_tty(
        [OFFLOAD, "publish", "--broker", broker.url, "-t", "rough/bar", "-f", str(file),
         "--discovery-wait", "10"],
        _env(),
    )  # fmt: skip
    assert code == 0, bar
    assert json.loads(out)["route"] == "offloaded"
    assert set(re.findall(r"publish \d/\d", bar)) <= {"publish 1/2", "publish 2/2"}, bar
    assert "publish 2/2  9.0 MiB / 9.0 MiB (100%)" in bar


# -- offload-proxy on a port that is taken --------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "taken_by"),
    [([], "--port"), (["--workers", "2"], "--port"), (["--port", "0"], "--metrics-port")],
    ids=["mqtt", "workers", "metrics"],
)
def test_offload_proxy_on_a_taken_port_is_one_line(flags: list[str], taken_by: str) -> None:
    """It was a traceback (socket.bind's OSError, or asyncio's naming a tuple)."""
    with socket.create_server(("127.0.0.1", 0)) as squatter:
        port = squatter.getsockname()[1]
        args = ["offload-proxy", "--broker", "mqtt://127.0.0.1:1", taken_by, str(port), *flags]
        done = subprocess.run(args, capture_output=True, text=True, timeout=60, env=_env())
    what = "serve metrics" if taken_by == "--metrics-port" else "listen"
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"offload-proxy: cannot {what} on 127.0.0.1:{port}: address already in use"
    )
    assert "Traceback" not in done.stderr and done.stdout == ""


# -- the servers' numeric flags ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["offload-proxy", "--port", "-1"], {},
         "offload-proxy: error: --port: input should be greater than or equal to 0, got -1"),
        (["offload-proxy", "--workers", "0"], {},
         "offload-proxy: error: --workers: input should be greater than or equal to 1, got 0"),
        (["offload-proxy"], {"OFFLOAD_PROXY_MAX_CONNECTIONS": "-5"},
         "offload-proxy: error: OFFLOAD_PROXY_MAX_CONNECTIONS: input should be greater than 0, "
         "got '-5'"),
        (["offload-gateway", "--port", "99999"], {},
         "offload-gateway: error: --port must be a port number (0-65535), got 99999"),
        (["offload-gateway", "--metrics-port", "-1"], {},
         "offload-gateway: error: --metrics-port must be a port number (0-65535), got -1"),
        (["offload-gateway"], {"OFFLOAD_MAX_TRANSFERS": "-1"},
         "offload-gateway: error: OFFLOAD_MAX_TRANSFERS: input should be greater than or "
         "equal to 1, got '-1'"),
        # A wait past what the clocks count started, then broke every large publish
        # (the proxy) or every upload (the gateway: 503).
        (["offload-proxy"], {"OFFLOAD_PROXY_IDLE_TIMEOUT": "1e10"},
         "offload-proxy: error: OFFLOAD_PROXY_IDLE_TIMEOUT: input should be less than or "
         "equal to 4294967295, got '1e10'"),
        (["offload-gateway"], {"OFFLOAD_BODY_IDLE_TIMEOUT": "1e10"},
         "offload-gateway: error: OFFLOAD_BODY_IDLE_TIMEOUT: input should be less than or "
         "equal to 4294967295, got '1e10'"),
    ],
    ids=["proxy-port", "proxy-workers", "proxy-variable", "gateway-port", "gateway-metrics",
         "gateway-variable", "proxy-wait", "gateway-wait"],
)  # fmt: skip
def test_a_servers_number_out_of_range_is_one_line(
    args: list[str], env: dict[str, str], says: str, tmp_path: Path
) -> None:
    """offload-proxy printed pydantic's five-line report, offload-gateway a traceback for a
    variable out of range; offload-gateway --port 99999 hung after uvicorn's error (-1:
    uvicorn's 'Servname not supported', exit 3)."""
    settings = {"OFFLOAD_STORAGE_URL": f"file://{tmp_path}", "OFFLOAD_ALLOW_ANONYMOUS": "true"}
    done = subprocess.run(args, capture_output=True, text=True, timeout=30,
                          env=_env(**settings, **env))  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == says
    assert "Traceback" not in done.stderr and "pydantic" not in done.stderr


@pytest.mark.parametrize("variable", ["OFFLOAD_HTTP_TIMEOUT", "OFFLOAD_DISCOVERY_WAIT"])
def test_a_wait_from_the_environment_past_what_the_clocks_count_is_a_usage_error(
    gateway: GatewayServer, variable: str
) -> None:
    """A finite wait too long for the platform's clocks (1e10 s: they count nanoseconds in
    64 bits) passed the checks: `offload fetch` with OFFLOAD_HTTP_TIMEOUT=1e10 ended in an
    OverflowError traceback, exit 1. Now one line, exit 2, as for a negative wait."""
    name = variable.removeprefix("OFFLOAD_").lower()
    url = f"{gateway.url}/msg/00000000-0000-4000-8000-000000000000"
    done = subprocess.run(
        [OFFLOAD, "fetch", url, "-o", os.devnull],
        capture_output=True, text=True, timeout=60, env=_env(**{variable: "1e10"}),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"offload fetch: error: {name} must be at most 4294967295 seconds, got 10000000000.0 "
        "(see 'offload fetch --help')\n"
    )


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_a_wait_from_the_environment_out_of_range_is_a_usage_error(
    broker: Mosquitto, value: str, tmp_path: Path
) -> None:
    """OFFLOAD_DISCOVERY_WAIT=nan hung `offload publish` of a large message (NaN passed the
    'not negative' check); the flags refuse it too (tests/test_cli.py)."""
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(300_000))  # over the broker's 256 KiB: it looks for a gateway
    done = subprocess.run(
        [OFFLOAD, "publish", "--broker", broker.url, "-t", "rough/wait", "-f", str(big)],
        capture_output=True, text=True, timeout=60, env=_env(OFFLOAD_DISCOVERY_WAIT=value),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "offload publish: error: discovery_wait must be a number of seconds, 0 or more, got "
        f"{float(value)} (see 'offload publish --help')\n"
    )
