"""How one client setting is declared, and the parsers that read its text form.

A setting arrives as text from an `OFFLOAD_*` variable or a TOML string, so each field of
:class:`client.config._settings.ClientSettings` names its own parser in its metadata
(no switching on
stringified annotations). They live here, apart from the field list, so that adding a setting
touches only the declaration and the modules that use it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def setting(
    default: Any, meaning: str, parse: Callable[[str], object] = str, *, secret: bool = False
) -> Any:
    """One declared setting: its default, its documented meaning and its environment parser.

    Args:
        default: the value when no layer sets it.
        meaning: the settings table's text (Markdown, docs/settings.md).
        parse: turns an environment / config-file string into the value.
        secret: kept out of the settings' repr.
    """
    return field(default=default, repr=not secret, metadata={"meaning": meaning, "parse": parse})


def split_list(text: str) -> tuple[str, ...]:
    """A comma- or space-separated list, empty items dropped."""
    return tuple(item.strip() for item in text.replace(" ", ",").split(",") if item.strip())


def parse_bool(text: str) -> bool:
    """`1/true/yes/on` or `0/false/no/off`, any case; anything else is refused, not False."""
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError("must be true or false")


def optional(parse: Callable[[str], object]) -> Callable[[str], object]:
    """An empty string (`OFFLOAD_X=`) means None for an optional setting."""
    return lambda text: None if text == "" else parse(text)


def parse_protocol(text: str) -> int:
    """The MQTT protocol level: `5`, or `4` under any of its usual names."""
    return {"5": 5, "4": 4, "3.1.1": 4, "311": 4}[text]


OPT_INT = optional(int)
OPT_STR = optional(str)
