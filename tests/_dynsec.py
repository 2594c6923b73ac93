"""A mosquitto running the dynamic security plugin, administered with mosquitto_ctrl."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

PLUGIN = Path("/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so")
ADMIN, ADMIN_PASSWORD = "admin", "admin-password"


def plugin_path() -> Path | None:
    """The plugin as Debian ships it (mosquitto 2.0), or None where it is missing."""
    if PLUGIN.exists():
        return PLUGIN
    found = sorted(Path("/usr/lib").glob("*/mosquitto_dynamic_security.so"))
    return found[0] if found else None


@dataclass
class DynsecBroker:
    """The broker, its plugin file (rewritten by the plugin at every change) and `ctrl`."""

    broker: Any
    file: Path

    @property
    def port(self) -> int:
        return int(self.broker.port)

    def ctrl(self, *args: str) -> str:
        """`mosquitto_ctrl dynsec <args>` as the admin; its output (it fails on an error)."""
        login = ["-h", "127.0.0.1", "-p", str(self.port), "-u", ADMIN, "-P", ADMIN_PASSWORD]
        done = subprocess.run(
            ["mosquitto_ctrl", *login, "dynsec", *args],
            capture_output=True,
            text=True,
            timeout=20,
        )
        out = done.stdout + done.stderr
        assert done.returncode == 0 and "Error" not in out, (args, out)
        return out


@pytest.fixture
def directory() -> Iterator[Path]:
    """A directory the plugin can write after mosquitto drops root (it renames into it)."""
    path = Path(tempfile.mkdtemp(prefix="dynsec-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_dynsec_broker(
    mosquitto_factory: Callable[..., Any],
    directory: Path,
    *,
    extra_config: str = "",
    max_packet_size: int | None = None,
) -> DynsecBroker:
    """`mosquitto_ctrl dynsec init` a file in `directory`, then a broker loading it."""
    plugin = plugin_path()
    assert plugin is not None, "mosquitto's dynamic security plugin is not installed"
    file = directory / "dynamic-security.json"
    subprocess.run(
        ["mosquitto_ctrl", "dynsec", "init", str(file), ADMIN, ADMIN_PASSWORD],
        check=True,
        capture_output=True,
    )
    file.chmod(0o666)
    broker = mosquitto_factory(
        max_packet_size=max_packet_size,
        extra_config=f"plugin {plugin}\nplugin_opt_config_file {file}\n{extra_config}",
    )
    return DynsecBroker(broker, file)
