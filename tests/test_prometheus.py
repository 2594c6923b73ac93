"""A real Prometheus scraping a running gateway and proxy: the alerts fire and resolve, and
every dashboard panel's query returns data (docs/operations.md, "Alerts" and "Dashboard").

The stack is the one the other tests start: SeaweedFS and mosquitto of its own (this test
stops and restarts them), `offload-gateway` as its own process serving HTTPS (so its
certificate's expiry is exported), offload-proxy with its metrics port. Prometheus scrapes
both every second and evaluates the chart's rules, rendered from the same template as
helm/monitoring/alerts.yaml with `for: 2s` instead of minutes, ten times a second.

The gateway's /metrics is on its metrics port (plain HTTP, 127.0.0.1), never the API's.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from _auth import write_password_file
from _gateway import GatewayProcess
from _pki import server_pki
from _prometheus import Job, Prometheus
from _proxy import ProxyServer
from _servers import S3_ACCESS_KEY, S3_SECRET_KEY, Mosquitto, SeaweedFS, free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import monitoring  # noqa: E402

pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(
        shutil.which("prometheus") is None and not os.environ.get("CI"),
        reason="prometheus: apt-get install prometheus",
    ),
]

SCRAPE = 1.0  # seconds between scrapes
FOR = 2.0  # every rule's `for:` in this test
KiB = 1024


def test_rules_fire_and_resolve_and_every_panel_has_data(tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        stack_ = start_stack(stack, tmp_path)
        traffic = stack.enter_context(running(Traffic(stack_)))
        prometheus = stack_.prometheus
        prometheus.wait_for("both targets scraped", lambda: scraped(prometheus) == 2, 30)
        once(stack_)
        wait_until(lambda: traffic.rounds >= 5 and traffic.received >= 5, "traffic", 60)

        store_outage(stack_)
        broker_outage(stack_)
        every_panel_has_data(prometheus)
        certificates_expire_when_openssl_says(prometheus, stack_.certificate)
        exemplars_name_the_traces(prometheus, traffic.trace_ids)
        assert traffic.received >= 10  # the proxy resolved payloads throughout


# --- the stack ---------------------------------------------------------------------------------


@dataclass
class Stack:
    store: SeaweedFS
    broker: Mosquitto
    gateway: GatewayProcess
    gateway_url: str
    ca: str
    certificate: Path  # the gateway's and the proxy's
    proxy: ProxyServer
    prometheus: Prometheus

    def tls(self) -> ssl.SSLContext:
        """What an HTTPS client of the gateway verifies it with."""
        return ssl.create_default_context(cafile=self.ca)


def metrics_target(port: int) -> str:
    """Where the gateway serves /metrics: its metrics port, never the API's."""
    return f"127.0.0.1:{port}"


def start_stack(stack: contextlib.ExitStack, tmp_path: Path) -> Stack:
    """Prometheus first (it takes 5 s to apply its targets), then the servers it scrapes."""
    from proxy import ProxySettings

    pki = stack.enter_context(server_pki())
    ca = str(pki / "ca.pem")
    gateway = GatewayProcess({})
    metrics_port, gateway_metrics_port = free_port(), free_port()
    jobs = [
        Job("mqtt-offload-gateway", (metrics_target(gateway_metrics_port),)),
        Job("mqtt-offload-proxy", (f"127.0.0.1:{metrics_port}",)),
    ]
    prometheus = Prometheus(jobs, short_rules(), scrape=f"{SCRAPE:g}s", evaluate="100ms").start()
    stack.callback(prometheus.close)
    store = SeaweedFS().start()
    stack.callback(store.close)
    broker = Mosquitto(max_packet_size=256 * KiB).start()
    stack.callback(broker.close)
    passwords = tmp_path / "passwords"
    write_password_file(passwords, [("ops", "right", 1000)])  # for one refused login
    gateway.env = {
        "OFFLOAD_STORAGE_URL": store.storage_url("alerts"),
        "OFFLOAD_S3_ACCESS_KEY": S3_ACCESS_KEY,
        "OFFLOAD_S3_SECRET_KEY": S3_SECRET_KEY,
        "OFFLOAD_MQTT_URL": broker.url,
        "OFFLOAD_ALLOW_ANONYMOUS": "true",
        "OFFLOAD_PASSWORD_FILE": str(passwords),
        "OFFLOAD_TLS_CERT_FILE": str(pki / "server.pem"),
        "OFFLOAD_TLS_KEY_FILE": str(pki / "server.key"),
        "OFFLOAD_METRICS_PORT": str(gateway_metrics_port),
        "OFFLOAD_STORE_PROBE_INTERVAL": "0.1",
        "OFFLOAD_SWEEP_INTERVAL": "1",
        "OFFLOAD_LOG_LEVEL": "WARNING",
    }
    gateway.start()
    stack.callback(gateway.kill)
    url = f"https://127.0.0.1:{gateway.port}"
    settings = ProxySettings(
        broker=broker.url,
        endpoint=url,
        ca_file=ca,
        port=0,
        metrics_port=metrics_port,
        max_reassembly_bytes=1024 * KiB,  # one chunked message of the test is over it
        tls_cert_file=pki / "server.pem",  # devices connect over TLS: its expiry is exported
        tls_key_file=pki / "server.key",
    )
    proxy = ProxyServer(settings).start()
    stack.callback(proxy.stop)
    return Stack(store, broker, gateway, url, ca, pki / "server.pem", proxy, prometheus)


def short_rules() -> dict[str, Any]:
    """The chart's rules with `for: 2s`, and the sweeper judged over 3 s instead of an hour."""
    short = {name: {"for": f"{FOR:g}s"} for name in monitoring.DEFAULT_RULES}
    short["OffloadSweeperFailing"]["staleSeconds"] = 3
    return monitoring.render_rules({"rules": short})


def scraped(prometheus: Prometheus) -> int:
    return sum(float(s["value"][1]) == 1 for s in prometheus.query("up"))


@contextlib.contextmanager
def running(traffic: Traffic) -> Iterator[Traffic]:
    traffic.start()
    try:
        yield traffic
    finally:
        traffic.stop()


# --- traffic -------------------------------------------------------------------------------------


@dataclass
class Traffic:
    """Light traffic until stopped, outages or not: each round, a device connects to the proxy
    and publishes a small and a 300 KiB message (offloaded), an HTTP client publishes through
    the gateway and fetches the payload with a sampled trace context; a device subscribed
    through the proxy receives everything (placeholders resolved)."""

    stack: Stack
    rounds: int = 0
    received: int = 0
    trace_ids: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _subscriber: mqtt.Client | None = None

    def start(self) -> None:
        self._subscriber = device(f"sub-{uuid.uuid4().hex[:8]}", self.stack.ca)

        def on_connect(client: mqtt.Client, *_: Any) -> None:
            client.subscribe("load/#", qos=1)

        def on_message(*_: Any) -> None:
            self.received += 1

        self._subscriber.on_connect = on_connect
        self._subscriber.on_message = on_message
        self._subscriber.reconnect_delay_set(0.2, 1)
        self._subscriber.connect_async("127.0.0.1", self.stack.proxy.port)
        self._subscriber.loop_start()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self._subscriber is not None:
            self._subscriber.disconnect()
            self._subscriber.loop_stop()

    def _run(self) -> None:
        with httpx.Client(
            base_url=self.stack.gateway_url, verify=self.stack.tls(), timeout=5
        ) as http:
            while not self._stop.wait(0.3):
                with contextlib.suppress(Exception):  # outages are part of the test
                    self._publish_through_proxy()
                with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                    self._publish_over_http(http)
                self.rounds += 1

    def _publish_through_proxy(self) -> None:
        publisher = device(f"pub-{uuid.uuid4().hex[:8]}", self.stack.ca)
        publisher.connect("127.0.0.1", self.stack.proxy.port, keepalive=10)
        publisher.loop_start()
        try:
            for size in (100, 300 * KiB):
                publisher.publish("load/proxy", os.urandom(size), qos=1).wait_for_publish(5)
        finally:
            publisher.disconnect()
            publisher.loop_stop()

    def _publish_over_http(self, http: httpx.Client) -> None:
        answer = http.put("/publish/load/http", content=os.urandom(KiB), params={"qos": "1"})
        answer.raise_for_status()
        trace_id = secrets.token_hex(16)
        self.trace_ids.append(trace_id)
        headers = {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
        http.get(f"/msg/{answer.json()['id']}/payload", headers=headers).raise_for_status()


def device(client_id: str, ca: str | None = None) -> mqtt.Client:
    """A plain MQTT 5 client, as a device's firmware would be: no offload library; over TLS
    verified with `ca` when given."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    if ca is not None:
        client.tls_set(ca_certs=ca)
    return client


def once(stack: Stack) -> None:
    """What the traffic does not do each round, for the panels of rarer events: a refused
    login, a missing message, chunked messages (one over the proxy's reassembly bound) and a
    placeholder whose payload does not exist."""
    from client import Client, Route

    with httpx.Client(base_url=stack.gateway_url, verify=stack.tls(), timeout=5) as http:
        assert http.get(f"/msg/{uuid.uuid4()}/payload", auth=("ops", "wrong")).status_code == 401
        assert http.get(f"/msg/{uuid.uuid4()}/payload").status_code == 404
    producer = Client(stack.broker.url, automatic_offload=False, discovery_wait=0)
    producer.connect()
    try:
        for size in (600 * KiB, 1536 * KiB):
            assert producer.publish("load/chunked", os.urandom(size), qos=1).route is Route.CHUNKED
    finally:
        producer.close()
    missing = uuid.uuid4()
    placeholder = {
        "_format": "external",
        "_id": str(missing),
        "url": f"{stack.gateway_url}/msg/{missing}",
        "size": 10,
        "sha256": "0" * 64,
    }
    forger = device("forger")
    forger.connect("127.0.0.1", stack.broker.port)
    forger.loop_start()
    forger.publish("load/forged", json.dumps(placeholder), qos=1).wait_for_publish(5)
    forger.disconnect()
    forger.loop_stop()
    proxy = stack.proxy
    wait_until(
        lambda: (
            proxy.metric("offload_proxy_placeholders_passed_total", why="fetch-failed") >= 1
            and proxy.metric("offload_proxy_reassembled_total") >= 1
            and proxy.metric("offload_proxy_chunk_failures_total", why="ChunkBufferOverflow") >= 1
        ),
        "the proxy saw the rarer events",
        30,
    )


# --- outages -------------------------------------------------------------------------------------


def store_outage(stack: Stack) -> None:
    """The store crashes: OffloadStoreDown fires within `for:` plus two scrapes (the broker's
    does not), the sweeper's once its sweeps fail; both resolve once the store is back."""
    prometheus = stack.prometheus
    assert not {"OffloadStoreDown", "OffloadSweeperFailing"} & prometheus.firing()
    stopping = time.monotonic()
    assert stack.store.proc is not None
    os.killpg(stack.store.proc.pid, signal.SIGKILL)  # the store crashes, all of it at once
    stack.store.stop()  # reaped
    prometheus.wait_for("OffloadStoreDown", lambda: "OffloadStoreDown" in prometheus.firing(), 30)
    took = time.monotonic() - stopping
    assert took <= FOR + 2 * SCRAPE, f"OffloadStoreDown fired after {took:.2f} s"
    print(f"OffloadStoreDown fired {took:.2f} s after the store stopped")
    assert "OffloadBrokerLinkDown" not in prometheus.firing()
    prometheus.wait_for(
        "OffloadSweeperFailing", lambda: "OffloadSweeperFailing" in prometheus.firing(), 30
    )
    assert prometheus.query('offload_sweeper_runs_total{result="failed"} > 0')  # counted
    stack.store.start()  # the same ports and data
    prometheus.wait_for(
        "the store's alerts resolved",
        lambda: not {"OffloadStoreDown", "OffloadSweeperFailing"} & prometheus.firing(),
        60,
    )
    assert [float(s["value"][1]) for s in prometheus.query("offload_store_up")] == [1.0]


def broker_outage(stack: Stack) -> None:
    """The broker stops: OffloadBrokerLinkDown fires within `for:` plus two scrapes, the
    proxy refuses devices (OffloadProxyBrokerUnreachable); the link's alert resolves after
    the restart (the proxy's counts refusals over 5 minutes, longer than this test)."""
    prometheus = stack.prometheus
    assert "OffloadBrokerLinkDown" not in prometheus.firing()
    stopping = time.monotonic()
    stack.broker.stop()
    prometheus.wait_for(
        "OffloadBrokerLinkDown", lambda: "OffloadBrokerLinkDown" in prometheus.firing(), 30
    )
    took = time.monotonic() - stopping
    assert took <= FOR + 2 * SCRAPE, f"OffloadBrokerLinkDown fired after {took:.2f} s"
    print(f"OffloadBrokerLinkDown fired {took:.2f} s after the broker stopped")
    assert "OffloadStoreDown" not in prometheus.firing()
    prometheus.wait_for(
        "OffloadProxyBrokerUnreachable",
        lambda: "OffloadProxyBrokerUnreachable" in prometheus.firing(),
        30,
    )
    stack.broker.start()  # the same port
    prometheus.wait_for(
        "OffloadBrokerLinkDown resolved",
        lambda: "OffloadBrokerLinkDown" not in prometheus.firing(),
        60,
    )


# --- the dashboard -------------------------------------------------------------------------------


def panel_queries() -> Iterator[tuple[str, str]]:
    """Every query of every panel (title, PromQL), with Grafana's variables filled in."""
    board = json.loads(monitoring.DASHBOARD_FILE.read_text())
    for panel in board["panels"]:
        for target in panel.get("targets", ()):
            expr = target["expr"].replace("$__rate_interval", "5m").replace("$job", ".+")
            yield panel["title"], expr


def every_panel_has_data(prometheus: Prometheus) -> None:
    time.sleep(2 * SCRAPE)  # the restarted broker's and store's last samples
    empty = [(title, expr) for title, expr in panel_queries() if not prometheus.query(expr)]
    assert empty == []
    assert len(list(panel_queries())) >= 30


def certificates_expire_when_openssl_says(prometheus: Prometheus, certificate: Path) -> None:
    """The gateway's and the proxy's serving certificate: the notAfter openssl reads."""
    end = subprocess.run(
        ["openssl", "x509", "-enddate", "-noout", "-in", str(certificate)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()  # notAfter=Dec  8 04:17:00 2025 GMT
    expected = calendar.timegm(time.strptime(end.split("=", 1)[1], "%b %d %H:%M:%S %Y %Z"))
    found = {
        s["metric"]["job"]: float(s["value"][1])
        for s in prometheus.query(
            'offload_tls_certificate_expiry_timestamp_seconds{certificate="serving"}'
        )
    }
    assert found == {"mqtt-offload-gateway": expected, "mqtt-offload-proxy": expected}


def exemplars_name_the_traces(prometheus: Prometheus, trace_ids: list[str]) -> None:
    """The latency panel's exemplars carry the trace ids the requests were sent with."""
    now = time.time()
    found = prometheus.api(
        "query_exemplars",
        query='offload_http_request_seconds_bucket{job=~".+"}',
        start=str(now - 600),
        end=str(now),
    )
    seen = {e["labels"].get("trace_id") for series in found for e in series["exemplars"]}
    assert seen & set(trace_ids)
