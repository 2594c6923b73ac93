"""Start-up of the `offload` CLI: what every `offload publish` in a shell loop pays first.

Each measure is the median of N fresh interpreters, run round-robin so that a disturbance
of the shared machine falls on every measure alike:

* `import client.cli` as `python -X importtime` reports it (cumulative, the issue's
  measure), against `import paho.mqtt.client` in the same processes' reports: the MQTT
  library that publish, subscribe and discover cannot do without.
* wall time of `python -c "import client.cli"` and of `offload --help`, against
  `python -c pass` (the interpreter and site-packages alone).
* wall time of `offload publish` to a closed loopback port (refused: exit 3), everything a
  publish pays before its broker answers, against `python -c "import paho.mqtt.client"`.

    python bench/startup.py              # 20 runs of each
    python bench/startup.py --runs 50

Prints human-readable lines and, last, one machine-readable `RESULT` JSON line.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _harness import ROOT, absolute_row, emit, row


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


OFFLOAD = str(Path(sys.executable).with_name("offload"))
TARGET_MS = 100.0  # issue 15: `import client.cli` <= 0.10 s

# name -> command; the importtime ones also report a module's cumulative import time.
COMMANDS = {
    "pass": [sys.executable, "-c", "pass"],
    "cli": [sys.executable, "-c", "import client.cli"],
    "help": [OFFLOAD, "--help"],
    "paho": [sys.executable, "-c", "import paho.mqtt.client"],
    "publish": [OFFLOAD, "publish", "--broker", f"mqtt://127.0.0.1:{_closed_port()}", "-t", "b/s",
                "-m", "x"],
    # Each module in its own process: one loaded first would lend the other its imports.
    "importtime client.cli": [sys.executable, "-X", "importtime", "-c", "import client.cli"],
    "importtime paho.mqtt.client": [
        sys.executable, "-X", "importtime", "-c", "import paho.mqtt.client",
    ],
}  # fmt: skip


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env["PYTHONPATH"] = str(ROOT)  # this checkout, not whatever is installed
    env["OFFLOAD_CONFIG"] = os.devnull
    return env


def _cumulative_ms(stderr: str, module: str) -> float:
    """The cumulative microseconds `-X importtime` reports for `module`, in ms."""
    for line in stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[2].strip() == module:
            return int(parts[1]) / 1000
    raise ValueError(f"{module} not in the importtime report")


def measure(runs: int) -> dict[str, list[float]]:
    env = _env()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(runs):
        for name, cmd in COMMANDS.items():
            start = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
            elapsed = (time.perf_counter() - start) * 1000
            if done.returncode != (3 if name == "publish" else 0):  # publish: refused
                raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")
            if name.startswith("importtime "):
                times[name].append(_cumulative_ms(done.stderr, name.removeprefix("importtime ")))
            else:
                times[name].append(elapsed)
    return times


def _informative(r: dict[str, object]) -> dict[str, object]:
    """A row shown for context: the issue's target is the importtime row's absolute one."""
    return {**r, "met": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    times = measure(args.runs)
    med = {name: statistics.median(xs) for name, xs in times.items() if xs}
    for name, value in med.items():
        print(
            f"{name:30} median {value:7.1f} ms  min {min(times[name]):7.1f} ms  ({args.runs} runs)"
        )
    cli_ms = med["importtime client.cli"]
    rows = [
        absolute_row("startup", "import client.cli (-X importtime, cumulative)", cli_ms, "ms",
                     f"<= {TARGET_MS:.0f} ms", cli_ms <= TARGET_MS),
        _informative(row("startup", "import client.cli / import paho.mqtt.client (importtime)",
                         med["importtime paho.mqtt.client"], cli_ms, "ms", "informative",
                         higher_is_better=False, limit=1.0)),
        _informative(row("startup", "python -c 'import client.cli' / python -c pass (wall)",
                         med["pass"], med["cli"], "ms", "informative",
                         higher_is_better=False, limit=1.0)),
        _informative(row("startup", "offload --help / python -c pass (wall)", med["pass"],
                         med["help"], "ms", "informative", higher_is_better=False, limit=1.0)),
        _informative(row("startup", "offload publish, refused / import paho.mqtt.client (wall)",
                         med["paho"], med["publish"], "ms", "informative",
                         higher_is_better=False, limit=1.0)),
    ]  # fmt: skip
    emit(rows)


if __name__ == "__main__":
    main()
