"""The serving stack's watch: a part that dies is named, with why (its last log lines), and
restarted where it was; one that keeps dying stops the stack.

A part is one of the stack's processes (the gateway, offload-proxy, mosquitto, SeaweedFS).
Each is looked at every second. One found dead is reported on stdout (which part, its exit
status, the last lines of its log), its log is kept as `<log>.1` as an earlier run's is, and
it is started again on the same port, so the env file, the banner and every client's
settings stay right. A part that dies `LIMIT` times within `WINDOW` seconds, or cannot be
started again (its port taken meanwhile), ends the watch: the stack then stops everything
and exits 1, saying why.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from _stack_state import rotate_log

from _servers import PortInUse

#: Restarts of one part allowed within WINDOW seconds; one more death stops the stack.
LIMIT = 3
WINDOW = 300.0
#: Lines of a dead part's log shown.
TAIL = 12


@dataclass
class Part:
    """One process of the stack, and how to start it again.

    Args:
        name: what the user knows it as (`gateway`, `mosquitto`, ...).
        where: its address, for the lines that say it is back.
        log: its log file.
        proc: the running process.
        restart: starts it again where it was; the new process.
    """

    name: str
    where: str
    log: Path
    proc: subprocess.Popen[bytes] | None
    restart: Callable[[], subprocess.Popen[bytes] | None]
    restarts: list[float] = field(default_factory=list)


def last_lines(log: Path, n: int = TAIL) -> list[str]:
    """The last `n` lines of `log` (none when it does not exist)."""
    try:
        with log.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-n:]


def watch(parts: Sequence[Part], every: float = 1.0) -> str:
    """Look after `parts` until interrupted (KeyboardInterrupt, raised out of here) or one
    cannot be kept running; then why, in words."""
    while True:
        time.sleep(every)
        for part in parts:
            if part.proc is None or part.proc.poll() is None:
                continue
            problem = _revive(part)
            if problem is not None:
                return problem


def _revive(part: Part) -> str | None:
    """Report `part`'s death and start it again; why not, when it cannot be."""
    assert part.proc is not None
    print(f"==> {part.name} died (exit {part.proc.returncode}); the last lines of {part.log}:")
    for line in last_lines(part.log):
        print(f"    {line}")
    now = time.monotonic()
    part.restarts = [t for t in part.restarts if now - t < WINDOW] + [now]
    if len(part.restarts) > LIMIT:
        return f"{part.name} died {len(part.restarts)} times within {WINDOW:.0f} s"
    rotate_log(part.log)
    print(f"==> restarting {part.name} on {part.where}", flush=True)
    try:
        part.proc = part.restart()
    except (PortInUse, RuntimeError, TimeoutError) as exc:
        part.proc = None
        return f"{part.name} could not be started again: {exc}"
    print(f"==> {part.name} on {part.where} again", flush=True)
    return None
