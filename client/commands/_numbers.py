"""The `offload` command line's numeric flags: each a type that refuses what cannot work.

argparse calls these with the flag's text; an `ArgumentTypeError` becomes the usual one
line naming the flag (`offload subscribe: error: argument --timeout: ...`, exit 2), before
anything connects. A negative wait, NaN, a count of 0: refused here, where the settings
layer would let them through or a command would trip over them later (a traceback, or a
subscription that never ends).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from ..config._settings import MAX_SECONDS

#: MQTT's largest packet: a Remaining Length of 268,435,455 and its five header bytes.
MAX_PACKET = 268_435_460
#: MQTT's Four Byte Integer (Session Expiry, Will Delay): seconds.
MAX_INTERVAL = 4_294_967_295


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """A whole number in `low..high` (no upper bound: None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            within = f"at least {low}" if high is None else f"{low} to {high}"
            raise argparse.ArgumentTypeError(f"must be {within}, got {text!r}")
        return value

    return parse


def seconds(*, zero: bool) -> Callable[[str], float]:
    """A finite number of seconds, above 0 (or 0 too, with `zero`), at most
    :data:`MAX_SECONDS`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            least = "0 or more" if zero else "more than 0"
            raise argparse.ArgumentTypeError(f"must be {least} seconds, got {text!r}")
        if value > MAX_SECONDS:  # a wait the platform's clocks cannot count: OverflowError
            raise argparse.ArgumentTypeError(f"must be at most {MAX_SECONDS} seconds, got {text!r}")
        return value

    return parse
