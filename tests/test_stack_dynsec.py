"""`STACK_AUTH=dynsec scripts/up.sh`: the stack on mosquitto's dynamic security plugin. Its
self-check (20 MiB through the 256 KiB broker with the CLI, and mosquitto_pub through
offload-proxy) passes with the plugin's file as the one source of users and rules; then a
client a user makes with `mosquitto_ctrl` (101 iterations: SCRAM impossible) offloads
through the stack's proxy and with the CLI, their default logins finding HTTP Basic (issue 51:
the proxy answered its large PUBLISH with 0x80)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from _dynsec import plugin_path

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(plugin_path() is None, reason="mosquitto's dynsec plugin missing"),
]


def _serve(env: dict[str, str]) -> tuple[subprocess.Popen[str], list[str]]:
    """`scripts/stack.py` serving (after its self-check), its output lines gathered."""
    stack = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "stack.py")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []

    def gather() -> None:
        assert stack.stdout is not None
        lines.extend(stack.stdout)

    threading.Thread(target=gather, daemon=True).start()
    deadline = time.monotonic() + 300
    while not any(line.startswith("Serving.") for line in lines):
        assert stack.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, "".join(lines)
        time.sleep(0.2)
    return stack, lines


def _typed(
    state: Path, command: str, stdin: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    """A command as a user types it in a shell that sourced the stack's env file."""
    with (stdin or Path(os.devnull)).open("rb") as given:
        return subprocess.run(
            ["bash", "-c", f"source {state / 'env'} && {command}"],
            stdin=given, capture_output=True, timeout=120,
        )  # fmt: skip


def test_the_stack_runs_on_dynamic_security(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    env = os.environ | {
        "STACK_AUTH": "dynsec",
        "STACK_DIR": str(state),
        **dict.fromkeys(
            ("STACK_MQTT_PORT", "STACK_S3_PORT", "STACK_GATEWAY_PORT", "STACK_PROXY_PORT"), "0"
        ),
    }
    stack, lines = _serve(env)
    try:
        assert "==> self-check PASSED\n" in lines, "".join(lines)
        # The README's `mosquitto_ctrl -u demo -P "$OFFLOAD_PASSWORD" -p 1883 dynsec ...`,
        # on this stack's port.
        ctrl = 'mosquitto_ctrl -u demo -P "$OFFLOAD_PASSWORD" -p "${OFFLOAD_BROKER##*:}" dynsec'
        for args in ("createClient dev1 -p pw-dev1", "addClientRole dev1 everything"):
            done = _typed(state, f"{ctrl} {args}")
            assert done.returncode == 0 and b"Error" not in done.stdout, done
        big = tmp_path / "big.bin"
        big.write_bytes(os.urandom(3 * 1024 * 1024))
        login = '-p "$STACK_PROXY_PORT" -u dev1 -P pw-dev1 -t demo/dev1 -V 5'
        sub = subprocess.Popen(
            ["bash", "-c", f"source {state / 'env'} && mosquitto_sub {login} -C 1 -W 90 -N"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        time.sleep(1.0)  # subscribed before the publish
        pub = _typed(state, f"mosquitto_pub {login} -q 1 -s", stdin=big)
        assert pub.returncode == 0, pub.stderr.decode()
        out, err = sub.communicate(timeout=120)
        assert sub.returncode == 0, err.decode()
        assert hashlib.sha256(out).digest() == hashlib.sha256(big.read_bytes()).digest()
        # The CLI, with the env file's settings and dev1's login.
        cli = f"offload publish --username dev1 --password pw-dev1 -t demo/dev1/cli -f {big}"
        sent = _typed(state, cli)
        assert sent.returncode == 0, sent.stderr.decode()
        assert json.loads(sent.stdout)["route"] == "offloaded"
    finally:
        stack.send_signal(signal.SIGINT)
        stack.wait(120)
    log = (state / "gateway.log").read_text()
    assert "authentication: passwords (SCRAM-SHA-512, Basic); anonymous refused; dynamic " in log
    conf = (state / "mosquitto" / "mosquitto.conf").read_text()
    assert "plugin_opt_config_file" in conf and "password_file" not in conf
    assert (state / "auth" / "dynamic-security.json").stat().st_mode & 0o777 == 0o600


def test_an_unknown_auth_mode_is_one_line(tmp_path: Path) -> None:
    env = os.environ | {"STACK_AUTH": "ldap", "STACK_DIR": str(tmp_path / "s")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "stack.py"), "--check"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "STACK_AUTH must be files or dynsec" in done.stderr
