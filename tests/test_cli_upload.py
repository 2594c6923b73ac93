"""`offload upload` (tus) and progress bars: the real console script, gateway and mosquitto."""

from __future__ import annotations

import hashlib
import json
import os
import pty
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

OFFLOAD = shutil.which("offload") or "offload"
MiB = 1024 * 1024


#: Runs its arguments with SIGINT's default action: Python keeps an ignored SIGINT ignored
#: (no KeyboardInterrupt), and a background job starts with SIGINT ignored.
WITH_DEFAULT_SIGINT = [
    sys.executable, "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])",
]  # fmt: skip


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env["OFFLOAD_CONFIG"] = os.devnull
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # the default state directory
    return env


def _upload_args(gw: GatewayServer, topic: str, file: Path, *extra: str) -> list[str]:
    return [OFFLOAD, "upload", "--endpoint", gw.url, "--topic", topic, "--file", str(file),
            *extra]  # fmt: skip


@pytest.fixture
def gw(gateway_factory: Callable[..., GatewayServer], broker: Mosquitto) -> GatewayServer:
    return gateway_factory(broker)


def test_upload_publishes_and_prints_the_message(
    gw: GatewayServer, broker: Mosquitto, tmp_path: Path, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("cli")
    file = tmp_path / "scan.tiff"
    file.write_bytes(os.urandom(9 * MiB + 3))
    sub = subprocess.Popen(
        ["mosquitto_sub", "-V", "5", "-p", str(broker.port), "-t", topic, "-F", "%j",
         "-C", "1", "-W", "60"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(0.5)
    done = subprocess.run(
        _upload_args(gw, topic, file, "--content-type", "image/tiff"),
        capture_output=True, text=True, timeout=120, env=_env(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # piped: no progress bar
    line = json.loads(done.stdout)
    assert line["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
    assert line["resumed_from"] == 0
    out, _ = sub.communicate(timeout=70)
    placeholder = json.loads(json.loads(out)["payload"])
    assert placeholder["url"] == line["url"]
    fetched = httpx.get(line["url"] + "/payload")
    assert fetched.content == file.read_bytes()
    assert fetched.headers["content-type"] == "image/tiff"
    assert list((tmp_path / "cache" / "mqtt-offload" / "uploads").iterdir()) == []  # forgotten


def test_killed_upload_resumes_from_the_last_acknowledged_offset(
    gw: GatewayServer, tmp_path: Path, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("resume")
    segment = 1 * MiB
    file = tmp_path / "big.bin"
    file.write_bytes(os.urandom(96 * MiB))
    state_dir = tmp_path / "state"
    args = _upload_args(gw, topic, file, "--segment-size", str(segment),
                        "--state-dir", str(state_dir))  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(tmp_path))  # fmt: skip
    tus = {"Tus-Resumable": "1.0.0"}
    offset = 0
    deadline = time.monotonic() + 60
    try:
        while offset < 8 * segment:  # well under way, far from the end
            assert time.monotonic() < deadline and proc.poll() is None
            states = list(state_dir.glob("*.json")) if state_dir.exists() else []
            if states:
                location = json.loads(states[0].read_text())["url"]
                offset = int(httpx.head(location, headers=tus).headers["upload-offset"])
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)  # mid-PATCH: segments are sent back to back
        proc.wait(10)
    acknowledged = int(httpx.head(location, headers=tus).headers["upload-offset"])
    assert acknowledged % segment == 0
    assert 8 * segment <= acknowledged < file.stat().st_size

    done = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=300,
                          env=_env(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout)
    assert line["resumed_from"] == acknowledged
    assert line["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
    fetched = httpx.get(line["url"] + "/payload", timeout=120)
    assert hashlib.sha256(fetched.content).hexdigest() == line["sha256"]


def _run_on_tty(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal (stdout piped); the exit code and both outputs."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    out, _ = proc.communicate(timeout=120)
    os.close(master)
    return proc.returncode, out.decode(), b"".join(chunks).decode(errors="replace")


def test_progress_bars_on_a_terminal(
    gw: GatewayServer, tmp_path: Path, unique_topic: Callable[[str], str]
) -> None:
    file = tmp_path / "f.bin"
    file.write_bytes(os.urandom(20 * MiB))
    code, out, bar = _run_on_tty(
        _upload_args(gw, unique_topic("tty"), file, "--segment-size", str(MiB)), _env(tmp_path)
    )
    assert code == 0, bar
    assert "upload" in bar and "20.0 MiB / 20.0 MiB (100%)" in bar and "/s" in bar
    url = json.loads(out)["url"]

    target = tmp_path / "copy.bin"
    code, out, bar = _run_on_tty([OFFLOAD, "fetch", url, "-o", str(target)], _env(tmp_path))
    assert code == 0, bar
    assert target.read_bytes() == file.read_bytes()
    assert "fetch" in bar and "20.0 MiB / 20.0 MiB (100%)" in bar

    piped = subprocess.run([OFFLOAD, "fetch", url, "-o", str(target)], capture_output=True,
                           text=True, env=_env(tmp_path), timeout=60)  # fmt: skip
    assert piped.returncode == 0 and piped.stderr == ""


def test_subscribe_draws_a_bar_for_large_payloads_on_a_terminal(
    gw: GatewayServer, broker: Mosquitto, tmp_path: Path, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("tty-sub")
    file = tmp_path / "big.bin"
    file.write_bytes(os.urandom(12 * MiB))
    result: dict[str, tuple[int, str, str]] = {}

    def subscribe() -> None:
        result["sub"] = _run_on_tty(
            [OFFLOAD, "subscribe", "--broker", broker.url, "--topic", topic, "--count", "1",
             "--timeout", "60"],
            _env(tmp_path),
        )  # fmt: skip

    thread = threading.Thread(target=subscribe)
    thread.start()
    deadline = time.monotonic() + 30
    while f"\t{topic} (QoS" not in broker.log():  # mosquitto -v logs each subscription
        assert time.monotonic() < deadline, "not subscribed"
        time.sleep(0.05)
    published = subprocess.run(
        [OFFLOAD, "publish", "--broker", broker.url, "--topic", topic, "--file", str(file),
         "--qos", "1"],
        capture_output=True, text=True, env=_env(tmp_path), timeout=120,
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    thread.join(timeout=90)
    code, out, bar = result["sub"]
    assert code == 0, bar
    assert json.loads(out)["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
    assert f"fetch {topic}" in bar and "12.0 MiB / 12.0 MiB (100%)" in bar


class _Gate:
    """A TCP relay to a port that passes each connection's first bytes up to a shared budget,
    then holds the rest until opened: an upload through it is provably unfinished while held.
    """

    def __init__(self, target: int, limit: int) -> None:
        self.target, self.budget = target, limit
        self.lock = threading.Lock()
        self.held, self.opened = threading.Event(), threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:  # closed
                return
            up = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pump, args=(down, up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        try:
            while data := src.recv(65536):
                if counted and not self.opened.is_set():
                    with self.lock:
                        now, self.budget = data[: self.budget], max(0, self.budget - len(data))
                    dst.sendall(now)
                    if len(now) < len(data):
                        self.held.set()
                        self.opened.wait()
                        dst.sendall(data[len(now) :])
                    continue
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            src.close()

    def close(self) -> None:
        self.opened.set()
        self.listener.close()


@pytest.mark.parametrize("flag", ["", "--no-resume"])
def test_an_interrupted_upload_says_how_to_resume(
    gw: GatewayServer, tmp_path: Path, unique_topic: Callable[[str], str], flag: str
) -> None:
    """Issue 51: the hint said "with --resume", the default, even after --no-resume."""
    file = tmp_path / "big.bin"
    file.write_bytes(os.urandom(64 * MiB))
    state_dir = tmp_path / "state"
    # The gateway gets the first 8 MiB (several 1 MiB segments acknowledged), then nothing
    # until the gate opens: the upload is still running when Ctrl-C comes, however fast the
    # machine (a timed pause let a quick upload finish first: exit 0, not 130).
    gate = _Gate(gw.port, 8 * MiB)
    try:
        args = [OFFLOAD, "upload", "--endpoint", f"http://127.0.0.1:{gate.port}", "--topic",
                unique_topic("ctrl-c"), "--file", str(file), "--segment-size", str(MiB),
                "--state-dir", str(state_dir)]  # fmt: skip
        # As from a terminal: Ctrl-C's default action, whatever this run inherited (a suite
        # started in the background, e.g. under nohup, ignores SIGINT, and so would the CLI).
        typed = [*args, flag] if flag else args
        proc = subprocess.Popen([*WITH_DEFAULT_SIGINT, *typed], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=_env(tmp_path))  # fmt: skip
        assert gate.held.wait(120), "the upload never sent 8 MiB"
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert out == ""
        again = "without --no-resume " if flag else ""
        assert err == f"offload: interrupted; the same command {again}continues it\n"

        gate.opened.set()
        done = subprocess.run(args, capture_output=True, text=True,  # as the hint says
                              timeout=120, env=_env(tmp_path))  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["resumed_from"] > 0
    finally:
        gate.close()
