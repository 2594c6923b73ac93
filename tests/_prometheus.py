"""Prometheus for tests (Debian's `prometheus`): its own free loopback port, a temporary
storage directory, short scrape and evaluation intervals, and its HTTP API for queries and
alerts (tests/test_prometheus.py)."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from _servers import TEMPORARY, PortInUse, _OwnWorkdir, _stop, free_port, wait_until


@dataclass(frozen=True)
class Job:
    """A scrape job: its targets (host:port), and TLS with a CA file for https."""

    name: str
    targets: tuple[str, ...]
    ca_file: str | None = None


@dataclass
class Prometheus(_OwnWorkdir):
    """`prometheus` scraping `jobs` every `scrape` and evaluating `rules` every `evaluate`;
    its configuration and storage in `workdir` (a temporary one that close() removes)."""

    _prefix = "prometheus-"

    jobs: list[Job]
    rules: dict[str, Any]
    scrape: str = "1s"
    evaluate: str = "250ms"
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    workdir: Path = TEMPORARY

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        scrape_configs = []
        for job in self.jobs:
            config: dict[str, Any] = {
                "job_name": job.name,
                "static_configs": [{"targets": list(job.targets)}],
            }
            if job.ca_file:
                config["scheme"] = "https"
                config["tls_config"] = {"ca_file": job.ca_file}
            scrape_configs.append(config)
        return {
            "global": {
                "scrape_interval": self.scrape,
                "scrape_timeout": self.scrape,
                "evaluation_interval": self.evaluate,
            },
            "rule_files": [str(self.workdir / "rules.yaml")],
            "scrape_configs": scrape_configs,
        }

    def start(self) -> Prometheus:
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        (self.workdir / "rules.yaml").write_text(yaml.safe_dump(self.rules))
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config()))
        log = self.workdir / "prometheus.log"
        for attempt in range(4):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--enable-feature=exemplar-storage",  # the latency panels' exemplars
                ],
                stdout=log.open("wb"),
                stderr=subprocess.STDOUT,
            )
            try:
                wait_until(self._ready, f"prometheus on port {self.port}", 30, self.proc, log)
                return self
            except PortInUse:
                self.stop()
                if attempt == 3:
                    raise
        raise AssertionError("unreachable")

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None

    def api(self, path: str, **params: str) -> Any:
        """`GET /api/v1/<path>`'s `data`, after checking its status."""
        answer = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        answer.raise_for_status()
        body = answer.json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's series."""
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def firing(self) -> set[str]:
        """The names of the alerts firing now."""
        return {
            a["labels"]["alertname"] for a in self.api("alerts")["alerts"] if a["state"] == "firing"
        }

    def wait_for(self, what: str, check: Any, timeout: float) -> float:
        """Seconds until `check()` holds (polled every 50 ms); TimeoutError after `timeout`."""
        start = time.monotonic()
        while not check():
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"{what}: not within {timeout} s; firing: {self.firing()}")
            time.sleep(0.05)
        return time.monotonic() - start
