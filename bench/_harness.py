"""Shared pieces of the benchmarks: real servers, the gateway as a subprocess, result rows.

Every benchmark prints its own human-readable lines and, last, one machine-readable line
`RESULT <json list of rows>` that bench/run_all.py collects into the table. A row is
`{"bench", "metric", "baseline", "candidate", "unit", "ratio", "target", "met"}`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from _servers import Mosquitto, SeaweedFS, free_port, wait_for_port  # noqa: E402

MiB = 1024 * 1024


@dataclass
class Gateway:
    """`offload-gateway` running as its own process (as in production)."""

    proc: subprocess.Popen[bytes]
    port: int
    metrics_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Its Prometheus metrics: on a port of their own, never the API's."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        return self.proc.pid


@contextmanager
def gateway_process(
    seaweed: SeaweedFS,
    bucket: str,
    *,
    broker: Mosquitto | None = None,
    workers: int = 1,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Gateway]:
    """Start `offload-gateway` on `bucket` of `seaweed`; stop it on exit."""
    port, metrics_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env.update(
        {
            "OFFLOAD_STORAGE_URL": seaweed.storage_url(bucket),
            "OFFLOAD_S3_ACCESS_KEY": seaweed.access_key,
            "OFFLOAD_S3_SECRET_KEY": seaweed.secret_key,
            "OFFLOAD_LOG_LEVEL": "WARNING",
            # Benchmarks send from one address: the per-client cap is not what is measured.
            "OFFLOAD_MAX_UPLOADS_PER_CLIENT": "0",
            "OFFLOAD_SWEEP_INTERVAL": "0",
            "OFFLOAD_ALLOW_ANONYMOUS": "true",  # no credentials files: opt in by name
            "OFFLOAD_METRICS_PORT": str(metrics_port),
            "PYTHONPATH": str(ROOT),
        }
    )
    if broker is not None:
        env["OFFLOAD_MQTT_URL"] = broker.url
    env.update(extra_env or {})
    # Experiments: BENCH_GATEWAY_ENV="OFFLOAD_S3_PART_SIZE=8388608,MALLOC_ARENA_MAX=2".
    for item in filter(None, os.environ.get("BENCH_GATEWAY_ENV", "").split(",")):
        name, _, value = item.partition("=")
        env[name] = value
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "--port", str(port), "--workers", str(workers)],
        env=env,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        wait_for_port(port, 60, proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        spy = None
        if os.environ.get("BENCH_PROFILE"):
            # py-spy on the gateway (and its workers): collapsed stacks for the profile notes.
            spy = subprocess.Popen(
                ["py-spy", "record", "--subprocesses", "-r", "200", "-f", "raw",
                 "-o", os.environ["BENCH_PROFILE"], "--pid", str(proc.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1.0)
        try:
            yield Gateway(proc, port, metrics_port)
        finally:
            if spy is not None:
                spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
                spy.wait(60)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def minio_client(seaweed: SeaweedFS) -> object:
    from minio import Minio

    return Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)


def make_bucket(seaweed: SeaweedFS, bucket: str) -> None:
    client = minio_client(seaweed)
    if not client.bucket_exists(bucket):  # type: ignore[attr-defined]
        client.make_bucket(bucket)  # type: ignore[attr-defined]


def row(
    bench: str,
    metric: str,
    baseline: float,
    candidate: float,
    unit: str,
    target: str,
    *,
    higher_is_better: bool,
    limit: float,
) -> dict[str, object]:
    """One table row; `ratio` is candidate / baseline, checked against `limit`."""
    ratio = candidate / baseline if baseline else float("nan")
    met = ratio >= limit if higher_is_better else ratio <= limit
    return {
        "bench": bench,
        "metric": metric,
        "baseline": round(baseline, 3),
        "candidate": round(candidate, 3),
        "unit": unit,
        "ratio": round(ratio, 3),
        "target": target,
        "met": bool(met),
    }


def info_row(
    bench: str, metric: str, baseline: float, candidate: float, unit: str
) -> dict[str, object]:
    """A ratio shown beside the targets (a floor, a cost), with no target of its own."""
    result = row(bench, metric, baseline, candidate, unit, "info", higher_is_better=False, limit=0)
    result["met"] = None
    return result


def absolute_row(
    bench: str, metric: str, value: float, unit: str, target: str, met: bool
) -> dict[str, object]:
    """A row with an absolute target (no same-run baseline applies)."""
    return {
        "bench": bench,
        "metric": metric,
        "baseline": None,
        "candidate": round(value, 3),
        "unit": unit,
        "ratio": None,
        "target": target,
        "met": bool(met),
    }


def emit(rows: list[dict[str, object]]) -> None:
    print("RESULT " + json.dumps(rows), flush=True)


def emit_rate(bench: str, metric: str, baseline: float, candidate: float, unit: str) -> None:
    """One informative rate row (higher is better, no target)."""
    emit([row(bench, metric, baseline, candidate, unit, "info", higher_is_better=True, limit=0.0)])


def vm_hwm_kib(pid: int) -> int:
    """Peak resident set (VmHWM) of a process, KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise KeyError("VmHWM")


def reset_hwm(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to clear_refs); False if not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@contextmanager
def py_spy(pid: int, out: Path, *, native: bool = False) -> Iterator[None]:
    """`py-spy record` of `pid` (and its children) into `out` (raw, 500 Hz) while the block
    runs; `native`: C frames too (the loop's, the kernel's calls), pausing the process to
    read them."""
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = subprocess.Popen(
        ["py-spy", "record", "--pid", str(pid), "--subprocesses", "-r", "500", "-f", "raw",
         "--native" if native else "--nonblocking", "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)
    try:
        yield
    finally:
        spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
        spy.wait(60)
        print(f"  profile: {out}")


class CpuMeter:
    """CPU seconds (user + system) spent by named processes and their live children.

    On 2 shared cores wall time moves with everyone else's load; CPU seconds per GiB or
    per request are what a change of ours actually moved. Children are summed while they
    run (uvicorn workers), threads always are.

    Args:
        pids: name -> process id, counted with its children; `None` means this process
            alone (the benchmark's own client: the servers are its children).
    """

    def __init__(self, **pids: int | None) -> None:
        import psutil

        self._procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self._alone = {name for name, pid in pids.items() if pid is None}

    def read(self) -> dict[str, float]:
        """CPU seconds so far per name."""
        import psutil

        out: dict[str, float] = {}
        for name, proc in self._procs.items():
            total = 0.0
            children = [] if name in self._alone else proc.children(recursive=True)
            for p in [proc, *children]:
                try:
                    t = p.cpu_times()
                except psutil.NoSuchProcess:
                    continue
                total += t.user + t.system
            out[name] = total
        return out

    @staticmethod
    def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {name: after[name] - before[name] for name in after}


def cpu_text(spent: dict[str, float], per: float, unit: str) -> str:
    """`gateway 1.23, store 4.56, client 0.12 CPU-s per GiB` (seconds / `per` units)."""
    parts = ", ".join(f"{name} {seconds / per:.2f}" for name, seconds in spent.items())
    return f"{parts} CPU-s per {unit}"


_NGINX_CONF = """\
worker_processes 1;
daemon off;
error_log {root}/error.log warn;
pid {root}/nginx.pid;
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {root}/body;
  proxy_temp_path {root}/proxy;
  fastcgi_temp_path {root}/fcgi;
  uwsgi_temp_path {root}/uwsgi;
  scgi_temp_path {root}/scgi;
  upstream store {{
    server 127.0.0.1:{upstream};
    keepalive 16;
  }}
  server {{
    listen 127.0.0.1:{port};
    client_max_body_size 0;
    location / {{
      proxy_pass http://store;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_request_buffering off;
      # Streamed, in 256 KiB reads (the 4 KiB default reads at 0.42 of direct here, 256 KiB
      # at 0.84, 1 MiB or buffering in memory at 0.80-0.81: python /tmp script, 8 runs each).
      proxy_buffering off;
      proxy_buffer_size 256k;
      proxy_buffers 4 256k;
      proxy_busy_buffers_size 512k;
    }}
  }}
}}
"""


@dataclass
class Nginx:
    """A running `nginx_proxy`."""

    port: int
    pid: int


@contextmanager
def nginx_proxy(upstream: int) -> Iterator[Nginx | None]:
    """nginx as a plain reverse proxy in front of 127.0.0.1:`upstream` (streaming both ways,
    upstream keep-alive, the Host passed on so S3 signatures still match); yields it, or
    None when nginx is not installed (scripts/_bootstrap.sh installs it for the tests).

    A floor for any proxy on this machine: a proxy in C adds its copies of every byte and
    one more process on the same cores."""
    if shutil.which("nginx") is None:
        yield None
        return
    root = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
    port = free_port()
    (root / "nginx.conf").write_text(_NGINX_CONF.format(root=root, upstream=upstream, port=port))
    proc = subprocess.Popen(
        ["nginx", "-e", str(root / "error.log"), "-p", str(root), "-c", str(root / "nginx.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, 20, proc)
        yield Nginx(port, proc.pid)
    finally:
        proc.terminate()
        proc.wait(20)
        shutil.rmtree(root, ignore_errors=True)
