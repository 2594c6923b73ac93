"""What the outside can read (issue 51 §3): spans never on stdout, the metrics where only the
operator reaches them, the access log naming the device behind a trusted hop. The real
`offload`, `offload-gateway` and `offload-proxy` in subprocesses, as a new user starts them."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from _gateway import GatewayServer
from _pki import server_pki
from _servers import Mosquitto, SeaweedFS, free_port, wait_for_port, wait_until

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
        # Two uvicorn workers import the gateway before either listens: 45 s and more on a
        # loaded machine. Waited for while they use CPU; a start that uses none is a hang.
        wait_for_port(port, 180, proc, err, stall=10)
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


# -- the metrics where only the operator reaches them -------------------------------------

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _requests(metrics: str, route: str) -> float:
    """`offload_http_requests_total` of `route`, summed over methods and statuses."""
    sample = rf'^offload_http_requests_total{{[^}}]*route="{re.escape(route)}"[^}}]*}} (\S+)$'
    found = re.findall(sample, metrics, re.M)
    return sum(float(value) for value in found)


def test_metrics_are_on_their_own_port_never_the_apis(
    serve: Callable[..., Served], tmp_path: Path
) -> None:
    """An anonymous GET /metrics on the API port read exemplars naming other users' traces."""
    metrics_port = free_port()
    gw, gateway = _gateway(serve, tmp_path, "--metrics-port", str(metrics_port))
    stored = httpx.put(f"{gw}/msg/{uuid.uuid4()}?topic=outside/m", content=b"x",
                       headers={"traceparent": TRACEPARENT})  # fmt: skip
    assert stored.status_code == 201, stored.text
    assert httpx.get(f"{gw}/metrics").status_code == 404
    scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics",
                        headers={"Accept": "application/openmetrics-text"})  # fmt: skip
    assert scraped.status_code == 200
    assert _requests(scraped.text, "/msg/{message_id}") == 1
    assert 'trace_id="4bf92f3577b34da6a3ce929d0e0e4736"' in scraped.text  # the operator's view
    _, err = gateway.stop()
    assert f"metrics on http://127.0.0.1:{metrics_port}/metrics" in err  # loopback by default


def test_a_taken_metrics_port_is_one_line(serve: Callable[..., Served], tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as squatter:
        taken = squatter.getsockname()[1]
        done = subprocess.run(
            ["offload-gateway", "--port", str(free_port()), "--metrics-port", str(taken)],
            env=_env(OFFLOAD_STORAGE_URL=f"file://{tmp_path}", OFFLOAD_ALLOW_ANONYMOUS="true"),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.endswith(
        f"offload-gateway: cannot serve metrics on 127.0.0.1:{taken}: address already in use\n"
    ), done.stderr
    assert "Traceback" not in done.stderr


def test_the_metrics_port_adds_up_every_worker(
    serve: Callable[..., Served], tmp_path: Path
) -> None:
    metrics_port = free_port()
    gw, _ = _gateway(serve, tmp_path, "--workers", "2", OFFLOAD_METRICS_PORT=str(metrics_port))
    wait_for_port(metrics_port, 30)
    for _ in range(20):  # a new connection each: both workers answer some
        assert httpx.get(f"{gw}/healthz", headers={"Connection": "close"}).status_code == 200
    scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    assert _requests(scraped, "/healthz") >= 20, scraped


def _samples(metrics: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of `name` in an exposition, by its labels."""
    from prometheus_client.parser import text_string_to_metric_families

    families = text_string_to_metric_families(metrics)
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in families
        for s in family.samples
        if s.name == name
    }


def _worker_pids(parent: int) -> list[int]:
    import psutil

    children = psutil.Process(parent).children()
    return [c.pid for c in children if "--multiprocessing-fork" in c.cmdline()]


def test_the_health_of_every_worker_reaches_the_metrics_port(
    serve: Callable[..., Served], mosquitto_factory: Callable[..., Mosquitto], tmp_path: Path
) -> None:
    """The store probe, the broker link, the certificate and the sweeper, which the alerts
    read, were missing from the sum of the workers (each worker's own collector) or came once
    per worker (`pid`), and a worker that died held its last value for ever."""
    from cryptography import x509

    store = SeaweedFS().start()
    broker = mosquitto_factory()
    metrics_port = free_port()
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    with server_pki() as pki:
        try:
            _, gateway = _gateway(
                serve, tmp_path, "--workers", "2",
                OFFLOAD_STORAGE_URL=store.storage_url("health"),
                OFFLOAD_S3_ACCESS_KEY=store.access_key, OFFLOAD_S3_SECRET_KEY=store.secret_key,
                OFFLOAD_MQTT_URL=broker.url, OFFLOAD_METRICS_PORT=str(metrics_port),
                OFFLOAD_TLS_CERT_FILE=str(pki / "server.pem"),
                OFFLOAD_TLS_KEY_FILE=str(pki / "server.key"),
                OFFLOAD_STORE_PROBE_INTERVAL="0.5", OFFLOAD_SWEEP_INTERVAL="1",
            )  # fmt: skip
            expiry = x509.load_pem_x509_certificate((pki / "server.pem").read_bytes())
            serving = expiry.not_valid_after_utc.timestamp()
            _the_health_adds_up(metrics, gateway, store, broker, serving)
        finally:
            store.close()


def _reads(metrics: str, **want: float) -> Callable[[], bool]:
    def check() -> bool:
        scraped = httpx.get(metrics).text
        return all(_samples(scraped, name) == {(): value} for name, value in want.items())

    return check


def _the_health_adds_up(
    metrics: str, gateway: Served, store: SeaweedFS, broker: Mosquitto, serving: float
) -> None:
    wait_until(_reads(metrics, offload_store_up=1, offload_broker_up=1), "both up", 60)
    swept = "offload_sweeper_last_success_timestamp_seconds"
    wait_until(lambda: _samples(httpx.get(metrics).text, swept).get((), 0) > 0, "a sweep", 30)
    scraped = httpx.get(metrics).text
    assert list(_samples(scraped, swept)) == [()], scraped  # one series, not one per worker
    assert _samples(scraped, "offload_tls_certificate_expiry_timestamp_seconds") == {
        (("certificate", "serving"),): serving
    }
    store.stop()
    wait_until(_reads(metrics, offload_store_up=0, offload_broker_up=1), "the store down", 30)
    runs, failed = "offload_sweeper_runs_total", (("result", "failed"),)
    wait_until(lambda: _samples(httpx.get(metrics).text, runs)[failed] > 0, "a failed sweep", 30)
    # A worker that dies holding offload_broker_up 0 is started again by uvicorn; what it
    # said last leaves with it.
    broker.stop()
    wait_until(_reads(metrics, offload_broker_up=0), "the broker down", 30)
    time.sleep(2 * 1.0)  # each worker has said so (gateway/core/_health.py: SHARE_INTERVAL)
    os.kill(_worker_pids(gateway.proc.pid)[0], signal.SIGKILL)
    broker.start()
    wait_until(_reads(metrics, offload_broker_up=1), "the broker back", 60)


def _render(accept: str = "") -> tuple[bytes, str]:
    return b"metric 1\n", "text/plain"


def test_the_metrics_port_bounds_its_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """At most 16 connections at once, each closed when it sends nothing for the exchange's
    time (10 s; 0.5 here), so idle peers cannot hold the operator's scrapes off for ever."""
    import asyncio

    import client.metrics

    monkeypatch.setattr(client.metrics, "_EXCHANGE_TIMEOUT", 0.5)

    async def scrape(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            answer = await asyncio.wait_for(reader.read(), 5)
        except ConnectionResetError:  # closed with the request unread
            answer = b""
        writer.close()
        return answer

    async def run() -> None:
        server = await client.metrics.serve(_render, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(16)]
        await asyncio.sleep(0.1)
        assert await scrape(port) == b""  # the 17th: closed unanswered
        for reader, _ in idle:  # each idle one is closed by the server
            assert await asyncio.wait_for(reader.read(), 5) == b""
        assert (await scrape(port)).endswith(b"\r\n\r\nmetric 1\n")
        for _, writer in idle:
            writer.close()
        server.close()

    asyncio.run(run())


def _closed_at_once(sock: socket.socket) -> bool:
    """Whether the peer closed `sock` within half a second (False: it holds it open)."""
    sock.settimeout(0.5)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


def test_one_address_holding_the_metrics_port_leaves_the_scrapers_their_turn(
    serve: Callable[..., Served], tmp_path: Path
) -> None:
    """`offload-gateway --metrics-port`: connections from one address that send nothing
    held every slot of the port (16) for the exchange's 10 s, and again after each
    reconnect, so the operator's scrape was closed unanswered. One address holds at most a
    quarter of the slots now: its others are closed at once, and a scrape from another
    address is answered while it holds them."""
    metrics_port = free_port()
    _gateway(serve, tmp_path, "--metrics-port", str(metrics_port))  # bound before the API
    idle = [
        socket.create_connection(("127.0.0.1", metrics_port), 5, ("127.0.8.1", 0))
        for _ in range(20)
    ]
    try:
        assert sum(_closed_at_once(sock) for sock in idle) == 16  # 4 held: its share
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
        assert scraped.status_code == 200
    finally:
        for sock in idle:
            sock.close()


# -- the access log names the device behind a trusted hop ---------------------------------


def test_the_access_log_names_the_device_behind_a_trusted_proxy(
    serve: Callable[..., Served], tmp_path: Path
) -> None:
    """With OFFLOAD_TRUSTED_PROXIES, the gateway's own lines named the device and uvicorn's
    access log 127.0.0.1 (the proxy), for every request, refusals included."""
    from _auth import write_password_file

    passwd = tmp_path / "passwd"
    write_password_file(passwd, [("alice", "s3cret", 4096)])
    gw, gateway = _gateway(
        serve, tmp_path, OFFLOAD_PASSWORD_FILE=str(passwd), OFFLOAD_TRUSTED_PROXIES="127.0.0.1",
        OFFLOAD_ALLOW_ANONYMOUS="false",
    )  # fmt: skip
    message_id = uuid.uuid4()
    with httpx.Client(base_url=gw, timeout=30) as http:
        ok = http.get("/healthz", headers={"X-Forwarded-For": "192.0.2.7"})
        refused = http.put(f"/msg/{message_id}?topic=t", content=b"x" * 100_000,
                           headers={"X-Forwarded-For": "192.0.2.8"})  # fmt: skip
    assert (ok.status_code, refused.status_code) == (200, 401)
    _, log = gateway.stop()
    assert '192.0.2.7:0 - "GET /healthz HTTP/1.1" 200' in log, log
    assert f'192.0.2.8:0 - "PUT /msg/{message_id}?topic=t HTTP/1.1" 401' in log, log
    assert "127.0.0.1:" not in "".join(line for line in log.splitlines() if "HTTP/1.1" in line)
