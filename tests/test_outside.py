"""What the outside can read (issue 51 §3): spans never on stdout, the metrics where only the
operator reaches them, the access log naming the device behind a trusted hop. The real
`offload`, `offload-gateway` and `offload-proxy` in subprocesses, as a new user starts them."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from _gateway import GatewayServer
from _servers import Mosquitto, free_port, wait_for_port

pytestmark = pytest.mark.servers

ROOT = Path(__file__).resolve().parent.parent
CONSOLE = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "100"}


def _env(**extra: str) -> dict[str, str]:
    own = ("OFFLOAD_", "OTEL_", "TRACEPARENT", "TRACESTATE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    return {**env, "OFFLOAD_CONFIG": os.devnull, "PYTHONPATH": str(ROOT), **extra}


@dataclass
class Served:
    """A server process with its stdout and stderr kept apart, in files."""

    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    def stop(self) -> tuple[str, str]:
        """SIGTERM (it exports what is left of its spans), then both outputs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.out.read_text(errors="replace"), self.err.read_text(errors="replace")


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(args: list[str], env: dict[str, str], port: int) -> Served:
        name = Path(args[0]).name
        out, err = tmp_path / f"{name}-{port}.out", tmp_path / f"{name}-{port}.err"
        proc = subprocess.Popen(args, env=env, stdout=out.open("wb"), stderr=err.open("wb"))
        served = Served(proc, out, err)
        started.append(served)
        wait_for_port(port, 30, proc, err)
        return served

    yield start
    for served in started:
        served.stop()


def _gateway(
    serve: Callable[..., Served], tmp_path: Path, *args: str, **env: str
) -> tuple[str, Served]:
    """`offload-gateway` on a free port, anonymous, on a file store; its URL."""
    port = free_port()
    settings = {"OFFLOAD_STORAGE_URL": f"file://{tmp_path / 'store'}",
                "OFFLOAD_ALLOW_ANONYMOUS": "true", **env}  # fmt: skip
    served = serve(["offload-gateway", "--port", str(port), *args], _env(**settings), port)
    return f"http://127.0.0.1:{port}", served


# -- spans never go to stdout ---------------------------------------------------------------


def test_console_spans_go_to_stderr_never_into_the_fetched_payload(
    gateway_factory: Callable[..., GatewayServer], tmp_path: Path
) -> None:
    """`OTEL_TRACES_EXPORTER=console offload fetch ID > f.bin` wrote the spans into f.bin
    (5,000,976 bytes for 5,000,000), exit 0."""
    gw = gateway_factory(None)
    payload = os.urandom(5_000_000)
    message_id = str(uuid.uuid4())
    stored = httpx.put(f"{gw.url}/msg/{message_id}?topic=outside/console", content=payload)
    assert stored.status_code == 201, stored.text
    env = _env(OFFLOAD_PUBLIC_URL=gw.url, **CONSOLE)
    done = subprocess.run(
        ["bash", "-c", f"offload fetch {message_id} > f.bin"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "f.bin").read_bytes() == payload
    assert '"name": "fetch"' in done.stderr  # exported all the same, where logs go


def test_the_gateway_and_the_proxy_write_console_spans_to_stderr(
    serve: Callable[..., Served], mosquitto_factory: Callable[..., Mosquitto], tmp_path: Path
) -> None:
    small = mosquitto_factory(max_packet_size=65536)
    gw, gateway = _gateway(serve, tmp_path, OFFLOAD_MQTT_URL=small.url, **CONSOLE)
    proxy_port = free_port()
    proxy = serve(
        ["offload-proxy", "--broker", small.url, "--port", str(proxy_port), "--endpoint", gw],
        _env(**CONSOLE),
        proxy_port,
    )
    # An offloaded PUBLISH through the proxy: its span and the gateway's request span.
    payload = tmp_path / "big.bin"
    payload.write_bytes(os.urandom(200_000))
    sent = subprocess.run(
        ["mosquitto_pub", "-V", "5", "-p", str(proxy_port), "-t", "outside/spans", "-q", "1",
         "-f", str(payload)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    proxy_out, proxy_err = proxy.stop()
    assert '"name": "publish outside/spans"' in proxy_err, proxy_err[-3000:]
    assert proxy_out == f"offload-proxy listening on 127.0.0.1:{proxy_port}\n"
    gateway_out, gateway_err = gateway.stop()
    assert '"name": "PUT /msg/{message_id}"' in gateway_err, gateway_err[-3000:]
    assert gateway_out == ""
