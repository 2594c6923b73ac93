"""The config-file layer of the client settings: which TOML file, and its table of values.

Kept apart from the settings' declaration because it is I/O (the one place the library
reads a file of its own accord, and only through :func:`client.config._load.load_settings`,
which the CLI and :meth:`Client.from_config` call) and because its errors must name the
file: a typo in `config.toml` is reported with the path, not as a bad keyword argument.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core._exceptions import ConfigError

ENV_PREFIX = "OFFLOAD_"
DEFAULT_CONFIG_FILE = Path("~/.config/mqtt-offload/config.toml")


def config_file_path(
    env: Mapping[str, str], config_file: str | os.PathLike[str] | None
) -> Path | None:
    """The file to read: `config_file`, else `$OFFLOAD_CONFIG`, else the default if it exists.

    Args:
        env: the environment given to `load_settings`.
        config_file: an explicit path, or None.
    """
    if config_file is not None:
        return Path(config_file)
    if env.get(ENV_PREFIX + "CONFIG"):
        return Path(env[ENV_PREFIX + "CONFIG"])
    default = DEFAULT_CONFIG_FILE.expanduser()
    return default if default.exists() else None


def read_settings_table(path: Path) -> dict[str, Any]:
    """The raw `name = value` pairs of a TOML file: flat keys or a `[client]` table.

    Raises:
        ConfigError: the file is unreadable, not TOML, or `client` is not a table.
    """
    try:
        doc: dict[str, Any] = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
    table = doc.get("client", doc)
    if not isinstance(table, dict):
        raise ConfigError(f"config file {path}: [client] must be a table")
    return table
