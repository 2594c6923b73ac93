"""Each extra installed alone, from a built wheel, in a fresh virtual environment, and used.

The scripts and the other tests install `.[all]`, which hides an extra that forgot one of its
dependencies (`[client]` without scramp gave an `offload` that crashed on start). Here every
extra is installed on its own, not editable, and its commands are run for real: the CLI
publishes to a real broker, the gateway serves requests (and its offline /docs assets), the
Spark reader is imported. pip's cache keeps a repeated run fast.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import venv
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from _servers import Mosquitto, free_port

pytestmark = [pytest.mark.slow, pytest.mark.servers]

ROOT = Path(__file__).resolve().parent.parent


def _clean_env() -> dict[str, str]:
    """No PYTHONPATH and no OFFLOAD_*: only what the fresh environment itself holds."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    return {
        k: v for k, v in os.environ.items() if k not in drop and not k.startswith("OFFLOAD_")
    } | {"OFFLOAD_CONFIG": os.devnull}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mqtt-offload built once as a wheel, from a copy of the sources (no build/ left here)."""
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for name in files:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes((ROOT / name).read_bytes())
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
         "-w", str(out), str(src)],
        check=True, capture_output=True,
    )  # fmt: skip
    (built,) = out.glob("mqtt_offload-*.whl")
    return built


def _fresh(tmp: Path, wheel: Path, extra: str) -> Path:
    """A new venv holding `mqtt-offload[extra]` and its dependencies, nothing else."""
    env_dir = tmp / f"venv-{extra}"
    venv.create(env_dir, with_pip=True, symlinks=True)
    bindir = env_dir / "bin"
    subprocess.run(
        [str(bindir / "python"), "-m", "pip", "install", "-q", f"{wheel}[{extra}]"],
        check=True, capture_output=True, env=_clean_env(), timeout=600,
    )  # fmt: skip
    return bindir


def _run(
    *args: str, timeout: float = 60, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # cwd: anywhere but the checkout, whose client/ gateway/ folders would shadow the install.
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        env=_clean_env() | (env or {}),
        timeout=timeout,
        cwd=cwd or "/",
    )


@pytest.fixture
def broker() -> Iterator[Mosquitto]:
    server = Mosquitto().start()
    yield server
    server.close()


def test_client_extra_alone_runs_the_cli(wheel: Path, tmp_path: Path, broker: Mosquitto) -> None:
    bindir = _fresh(tmp_path, wheel, "client")
    assert _run(str(bindir / "offload"), "--help").returncode == 0
    published = _run(str(bindir / "offload"), "publish", "--broker", broker.url, "-t", "x/y",
                     "-m", "hello")  # fmt: skip
    assert published.returncode == 0, published.stderr
    assert '"route":"direct"' in published.stdout
    # SCRAM (scramp) and httpx are imported on the way to a gateway that is not there.
    dead = f"http://127.0.0.1:{free_port()}"
    upload = _run(str(bindir / "offload"), "upload", "--endpoint", dead, "-t", "x/y",
                  "-f", str(bindir / "python"), "--username", "u", "--password", "p")  # fmt: skip
    assert upload.returncode == 5, upload.stderr
    assert "cannot connect" in upload.stderr
    pkgs = _run(str(bindir / "python"), "-m", "pip", "list").stdout.lower()
    assert "fastapi" not in pkgs and "pyspark" not in pkgs  # only what [client] asks for
    assert "opentelemetry" not in pkgs  # tracing is the `otel` extra's
    # Asked for traces without the extra: the message still goes (with the caller's
    # context), and the operator is told why nothing is exported.
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    asks = {"OTEL_EXPORTER_OTLP_ENDPOINT": dead, "TRACEPARENT": caller}
    traced = _run(str(bindir / "offload"), "publish", "--broker", broker.url, "-t", "x/y",
                  "-m", "hello", env=asks)  # fmt: skip
    assert traced.returncode == 0, traced.stderr
    assert "OpenTelemetry is not installed" in traced.stderr


def test_gateway_extra_alone_serves(wheel: Path, tmp_path: Path) -> None:
    bindir = _fresh(tmp_path, wheel, "gateway")
    assert _run(str(bindir / "offload-gateway"), "--help").returncode == 0
    port = free_port()
    env = _clean_env() | {
        "OFFLOAD_STORAGE_URL": f"file://{tmp_path / 'store'}",
        "OFFLOAD_ALLOW_ANONYMOUS": "true",
    }
    proc = subprocess.Popen(
        [str(bindir / "offload-gateway"), "--port", str(port)],
        env=env, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
        docs = httpx.get(f"{url}/docs")
        assert docs.status_code == 200 and "swagger-ui-bundle.js" in docs.text
        assert httpx.get(f"{url}/static-offline-docs/swagger-ui-bundle.js").status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)


def test_spark_extra_alone_imports_the_reader(wheel: Path, tmp_path: Path) -> None:
    bindir = _fresh(tmp_path, wheel, "spark")
    done = _run(str(bindir / "python"), "-c", "import client.spark; print(client.spark.register)")
    assert done.returncode == 0, done.stderr
    # The executors decode what a Client compressed or encrypted (issue 30): zstd and
    # cryptography come with this extra.
    decode = ("from client.spark._read import decoded; from client.protocol._zstd import "
              "compress; import client.protocol._age; "
              "assert decoded(compress(b'x' * 999), (), 'u') == b'x' * 999")  # fmt: skip
    done = _run(str(bindir / "python"), "-c", decode)
    assert done.returncode == 0, done.stderr
    assert _run(str(bindir / "offload-spark"), "--help").returncode == 0


def test_proxy_extra_alone_relays(wheel: Path, tmp_path: Path, broker: Mosquitto) -> None:
    bindir = _fresh(tmp_path, wheel, "proxy")
    port = free_port()
    proc = subprocess.Popen(
        [str(bindir / "offload-proxy"), "--broker", broker.url, "--port", str(port)],
        env=_clean_env(), cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == f"offload-proxy listening on 127.0.0.1:{port}\n"
        sub = subprocess.Popen(
            ["mosquitto_sub", "-p", str(port), "-t", "x/proxy", "-C", "1", "-W", "30"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1)  # subscribed before the publish
        sent = _run("mosquitto_pub", "-p", str(port), "-t", "x/proxy", "-m", "through", "-q", "1")
        assert sent.returncode == 0, sent.stderr
        assert sub.communicate(timeout=30)[0] == "through\n"
    finally:
        proc.terminate()
        proc.wait(30)


def test_otel_extra_beside_the_client_exports_spans_to_stderr(wheel: Path, tmp_path: Path) -> None:
    bindir = _fresh(tmp_path, wheel, "client,otel")
    small = Mosquitto(max_packet_size=65536).start()  # no gateway: chunked, and traced
    try:
        done = _run(str(bindir / "offload"), "publish", "--broker", small.url, "-t", "x/otel",
                    "-m", "x" * 100_000, "--discovery-wait", "0.2",
                    env={"OTEL_TRACES_EXPORTER": "console"})  # fmt: skip
    finally:
        small.close()
    assert done.returncode == 0, done.stderr
    assert '"route":"chunked"' in done.stdout and done.stdout.count("\n") == 1  # no span
    assert '"name": "publish x/otel"' in done.stderr
