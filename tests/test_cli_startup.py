"""`offload` starts without loading what its command does not use (issue 15, CLI start-up).

Every `offload publish` in a shell loop pays the interpreter's start-up, so the CLI module
imports argument parsing and error reporting only, and each command imports its libraries
when it runs. Timing is measured in bench/startup.py; these tests guard the cause instead,
without a clock: which modules a fresh interpreter holds after each step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from _servers import free_port

OFFLOAD = shutil.which("offload") or "offload"

# Third-party packages (and our own I/O modules) that cost milliseconds each to import.
# httpx pulls rich, click and pygments for its own CLI where they are installed; paho pulls
# dnspython; scramp pulls asn1crypto.
HEAVY = (
    "anyio", "asn1crypto", "bson", "click", "dns", "h2", "httpcore", "httpx", "minio", "paho",
    "pydantic", "pygments", "rich", "scramp", "client._client", "client.http._transport",
    "client.mqtt._paho", "client.http._scram", "client.http._upload", "opentelemetry",
)  # fmt: skip
# The protocol codecs: `client.protocol` loads them on first use.
CODECS = ("client.protocol._chunk", "client.protocol._envelope", "client.protocol._reassembly")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OFFLOAD_", "OTEL_"))}
    env["OFFLOAD_CONFIG"] = os.devnull
    return {**env, **extra}


@dataclass(frozen=True)
class After:
    loaded: list[str]  # which of HEAVY and CODECS were in sys.modules
    result: object = None  # the code's `result` variable, if it set one


def loaded_after(code: str, **env: str) -> After:
    """Run `code` in a fresh interpreter (`env` added to its environment); which of HEAVY
    and CODECS it left loaded, and its `result` variable if it set one."""
    script = (
        f"{code}\n"
        "import json, sys\n"
        f"names = {HEAVY + CODECS!r}\n"
        "loaded = sorted(n for n in names if n in sys.modules)\n"
        "print(json.dumps({'loaded': loaded, 'result': globals().get('result')}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=_env(**env)
    )
    assert done.returncode == 0, done.stderr
    return After(**json.loads(done.stdout.splitlines()[-1]))


def run_main(*argv: str) -> str:
    """`offload ARGV` as the console script runs it (`main()` reads sys.argv), in a fresh
    interpreter; `--help` exits, so catch that."""
    return (
        "import sys\n"
        "from client.cli import main\n"
        f"sys.argv = ['offload', *{list(argv)!r}]\n"
        "try:\n"
        "    result = main()\n"
        "except SystemExit as exc:\n"
        "    result = exc.code\n"
    )


def test_importing_the_cli_loads_no_io_library_and_no_codec() -> None:
    assert loaded_after("import client.cli") == After([])


def test_help_loads_nothing_heavy_and_lists_every_command() -> None:
    assert loaded_after(run_main("--help")) == After([], 0)
    assert loaded_after(run_main("publish", "--help")) == After([], 0)
    shown = subprocess.run(
        [OFFLOAD, "--help"], capture_output=True, text=True, timeout=60, env=_env()
    )
    assert shown.returncode == 0, shown.stderr
    for command in ("publish", "subscribe", "fetch", "upload", "discover", "Exit codes"):
        assert command in shown.stdout


def test_a_usage_error_is_reported_before_any_library_loads() -> None:
    after = loaded_after(
        run_main("publish", "--broker", "mqtt://127.0.0.1:1", "-t", "a/#", "-m", "x")
    )
    assert after == After([], 2)


def test_fetch_loads_httpx_but_not_paho_or_scramp() -> None:
    # A real download attempt from a closed loopback port: refused, exit 5.
    url = f"http://127.0.0.1:{free_port()}/msg/x"
    after = loaded_after(run_main("fetch", url))
    assert after.result == 5
    assert "httpx" in after.loaded  # the check sees a library that did load
    assert not {"paho", "dns", "scramp", "asn1crypto", "client._client"} & set(after.loaded)
    assert "opentelemetry" not in after.loaded
    # httpx's own command line (rich, click, pygments where installed) is skipped too.
    assert not {"rich", "click", "pygments"} & set(after.loaded)


def test_publish_loads_paho_but_neither_dnspython_nor_httpx_cli() -> None:
    # A real connection attempt to a closed loopback port: refused, exit 3.
    broker = f"mqtt://127.0.0.1:{free_port()}"
    after = loaded_after(run_main("publish", "--broker", broker, "-t", "a/b", "-m", "x"))
    assert after.result == 3
    assert {"paho", "httpx", "client._client"} <= set(after.loaded)
    assert not {"dns", "rich", "click", "pygments", "scramp"} & set(after.loaded)
    # No exporter asked for: OpenTelemetry stays unloaded, installed or not (22 ms saved).
    assert "opentelemetry" not in after.loaded


def test_publish_loads_opentelemetry_when_the_environment_asks_for_traces() -> None:
    broker = f"mqtt://127.0.0.1:{free_port()}"
    code = run_main("publish", "--broker", broker, "-t", "a/b", "-m", "x")
    endpoint = f"http://127.0.0.1:{free_port()}"
    after = loaded_after(code, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_BSP_EXPORT_TIMEOUT="1")
    assert after.result == 3
    assert "opentelemetry" in after.loaded


def test_an_application_importing_the_cli_keeps_every_optional_import() -> None:
    # main(argv) is a library call: the process is not `offload`'s to trim.
    code = (
        "from client.cli import main\n"
        "result = main(['publish', '-t', 'a/#', '-m', 'x'])\n"
        "import paho.mqtt.client, httpx\n"
    )
    after = loaded_after(code)
    assert after.result == 2
    assert "dns" in after.loaded  # paho found dnspython: its SRV lookup still works
    assert "httpx" in after.loaded


def test_a_client_loads_scramp_only_when_it_logs_in() -> None:
    code = (
        "from client import Client\n"
        "from client.http._scram import gateway_auth\n"
        "result = repr(gateway_auth(username='u', password='p', token=None))\n"
    )
    after = loaded_after(code)
    assert after.result == "ScramAuth(username='u', mechanism='SCRAM-SHA-512')"
    assert "paho" in after.loaded
    assert "scramp" not in after.loaded


def test_the_protocol_package_loads_a_codec_when_a_name_from_it_is_used() -> None:
    assert loaded_after("import client.protocol") == After([])
    after = loaded_after("from client.protocol import EnvelopeParser").loaded
    assert "client.protocol._envelope" in after
    assert "client.protocol._reassembly" not in after
