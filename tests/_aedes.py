"""A second MQTT broker for the interop and chunked tests: aedes 2 (Node; MQTT 5 and 3.1.1,
with Maximum Packet Size in its CONNACK: ADR-23 chunks cross it) on a TCP port, and on a
WebSocket port of its own. aedes 1.x speaks 3.1.1 only; 2.0.0-beta.1 is the first release
with MQTT 5.

aedes comes from npm (tests/brokers/package.json and its lock), installed with `npm ci` into
a cache directory on first use, as tests/test_tus_js.py installs tus-js-client.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from _npm import npm_modules
from _servers import free_port, mqtt_answers, wait_until

PEERS = Path(__file__).parent / "brokers"


def aedes_modules() -> Path:
    """node_modules holding aedes, installed from the committed lock on first use.

    Raises:
        RuntimeError: node or npm missing, or the install failed.
    """
    return npm_modules(PEERS, "npm-brokers", "aedes")


@dataclass
class Aedes:
    """`node tests/brokers/aedes.mjs TCP WS MAX_PACKET` on free loopback ports."""

    port: int = field(default_factory=free_port)
    ws_port: int = field(default_factory=free_port)
    max_packet_size: int = 0  # 0: none stated
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.ws_port}/mqtt"

    def start(self) -> Aedes:
        modules = aedes_modules()
        self.proc = subprocess.Popen(
            [
                str(shutil.which("node")),
                str(PEERS / "aedes.mjs"),
                str(self.port),
                str(self.ws_port),
                str(self.max_packet_size),
            ],
            env={**os.environ, "NODE_PATH": str(modules)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            self.stop()
            raise RuntimeError(f"aedes did not start: {line!r}")
        wait_until(lambda: mqtt_answers(self.port), f"aedes on {self.port}", 10, self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None
