"""Where settings come from: keyword overrides > environment > config file > defaults.

:func:`load_settings` is the library's one edge that reads the environment (given to it as
`environ`), used by the CLI and :meth:`client.Client.from_config`; :func:`merge_settings`
puts a constructor's keyword arguments over a settings object. Each value is parsed by its
field's own parser (:class:`client.config._settings.ClientSettings` declares them).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from ..core._exceptions import ConfigError
from ._file import ENV_PREFIX, config_file_path, read_settings_table
from ._parsers import parse_bool
from ._settings import ClientSettings

__all__ = ["load_settings", "merge_settings"]

_FIELDS = {f.name: f for f in dataclasses.fields(ClientSettings)}


def _coerce(name: str, value: object) -> object:
    """An environment string or TOML value as the field's type, by the field's own parser."""
    parse = _FIELDS[name].metadata["parse"]
    if isinstance(value, list) and name in ("discovery_allowlist", "identity_files", "no_compress"):
        return tuple(str(v) for v in value)
    if not isinstance(value, str):  # TOML already typed it: only a bool must be a bool
        if parse is parse_bool and not isinstance(value, bool):
            raise ConfigError(f"{name} must be a boolean, got {value!r}")
        return value
    try:
        return parse(value.strip())
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"{name}: cannot use {value!r}") from exc


def merge_settings(
    settings: ClientSettings | None, broker: str | None, overrides: Mapping[str, object]
) -> ClientSettings:
    """`settings` (default: the defaults) with `broker` and keyword overrides applied.

    Raises:
        TypeError: an unknown setting, as for any unknown keyword argument.
        ConfigError: a value that cannot be used.
    """
    changes = dict(overrides)
    if broker is not None:
        changes["broker"] = broker
    return dataclasses.replace(settings or ClientSettings(), **changes)  # type: ignore[arg-type]


def _read_config_file(path: Path) -> dict[str, object]:
    """The settings a TOML file sets (flat keys or a `[client]` table), parsed."""
    values: dict[str, object] = {}
    for key, value in read_settings_table(path).items():
        if key not in _FIELDS:
            raise ConfigError(f"config file {path}: unknown setting {key!r}")
        values[key] = _coerce(key, value)
    return values


def load_settings(
    overrides: Mapping[str, object] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
) -> ClientSettings:
    """Build settings from keyword overrides > environment > config file > defaults.

    Args:
        overrides: explicit values (e.g. CLI flags); None values are ignored so that an
            unset flag falls through to the lower layers.
        environ: the environment to read `OFFLOAD_*` from (pass `os.environ`); None reads none.
        config_file: TOML file; default `$OFFLOAD_CONFIG` from `environ`, else
            `~/.config/mqtt-offload/config.toml` when it exists.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, or an unreadable file.
    """
    env = dict(environ or {})
    values: dict[str, object] = {}
    path = config_file_path(env, config_file)
    if path is not None:
        values.update(_read_config_file(path))
    for name in _FIELDS:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = _coerce(name, raw)
    for key, value in (overrides or {}).items():
        if key not in _FIELDS:
            raise ConfigError(f"unknown setting {key!r}")
        if value is not None:
            values[key] = value
    try:
        return ClientSettings(**values)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc
