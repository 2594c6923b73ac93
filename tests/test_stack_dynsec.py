"""`STACK_AUTH=dynsec scripts/up.sh`: the stack on mosquitto's dynamic security plugin. Its
self-check (20 MiB through the 256 KiB broker with the CLI, and mosquitto_pub through
offload-proxy) passes with the plugin's file as the one source of users and rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _dynsec import plugin_path

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(plugin_path() is None, reason="mosquitto's dynsec plugin missing"),
]


def test_the_stack_runs_on_dynamic_security(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    env = os.environ | {
        "STACK_AUTH": "dynsec",
        "STACK_DIR": str(state),
        **dict.fromkeys(
            ("STACK_MQTT_PORT", "STACK_S3_PORT", "STACK_GATEWAY_PORT", "STACK_PROXY_PORT"), "0"
        ),
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "stack.py"), "--check"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "==> self-check PASSED" in done.stdout
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
