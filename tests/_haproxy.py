"""HAProxy 2.6 in TCP mode for tests and benchmarks (Debian's `haproxy`), in front of
offload-proxy or mosquitto: one frontend per route, each on a free loopback port."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from _servers import PortInUse, _stop, free_port, port_answers, wait_until

_GLOBAL = """\
global
    maxconn 4096
defaults
    mode tcp
    timeout connect 5s
    timeout client 300s
    timeout server 300s
"""


@dataclass(frozen=True)
class Route:
    """A frontend that balances over `upstreams` (loopback ports) round robin.

    Attributes:
        upstreams: the ports it connects to.
        options: appended to each `server` line: `send-proxy-v2`, `send-proxy` (v1),
            `source 127.0.0.5` (the address HAProxy connects from), ...
    """

    upstreams: tuple[int, ...]
    options: str = ""


@dataclass
class HAProxy:
    """`haproxy -db` with one frontend per route; `ports[name]` is where clients connect."""

    routes: dict[str, Route]
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    _dir: Path | None = None

    def config(self, ready: int) -> str:
        # `ready` is probed for readiness instead of the routes: a probe through a route
        # would open a connection to its upstream (HAProxy connects at once in TCP mode).
        text = _GLOBAL + f"frontend ready\n    bind 127.0.0.1:{ready}\n"
        text += "    tcp-request connection reject\n"
        for name, route in self.routes.items():
            servers = "\n".join(
                f"    server {name}{i} 127.0.0.1:{port} {route.options}"
                for i, port in enumerate(route.upstreams)
            )
            text += (
                f"frontend {name}\n    bind 127.0.0.1:{self.ports[name]}\n"
                f"    default_backend {name}\nbackend {name}\n    balance roundrobin\n"
                f"{servers}\n"
            )
        return text

    def start(self) -> HAProxy:
        binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
        self._dir = Path(tempfile.mkdtemp(prefix="haproxy-"))
        for attempt in range(4):
            self.ports = {name: free_port() for name in self.routes}
            ready = free_port()
            cfg = self._dir / "haproxy.cfg"
            cfg.write_text(self.config(ready))
            log = self._dir / "haproxy.log"
            self.proc = subprocess.Popen(
                [binary, "-db", "-f", str(cfg)], stdout=log.open("wb"), stderr=subprocess.STDOUT
            )
            try:
                # Every frontend is bound before HAProxy accepts on any (or it exits).
                wait_until(lambda p=ready: port_answers(p), "haproxy", 20, self.proc, log)
                return self
            except (PortInUse, RuntimeError):
                self.stop()
                if attempt == 3:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None

    def close(self) -> None:
        self.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
