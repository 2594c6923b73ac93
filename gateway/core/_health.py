"""The gateway's health as metrics: the store probed, the broker link, the certificates served.

/readyz answers whoever asks (kubelet); these gauges are for Prometheus, so that an idle
gateway whose store or broker went away says so too, and the alert rules
(docs/operations.md, "Alerts") fire on them:

* `offload_store_up`: 1 when the last probe of the object store succeeded, else 0. A probe
  is the bucket check /readyz makes, on the store pool, every `OFFLOAD_STORE_PROBE_INTERVAL`
  seconds, with /readyz's 5 s bound; absent before the first probe and with the probe off.
* `offload_broker_up`: 1 while the broker link is connected, 0 while it reconnects, read
  when scraped; absent without a broker (`OFFLOAD_MQTT_URL` unset).
* `offload_tls_certificate_expiry_timestamp_seconds{certificate}`: when the certificate
  chain the gateway presents stops being valid (`serving`: `OFFLOAD_TLS_CERT_FILE`;
  `broker-client`: `OFFLOAD_MQTT_CERT_FILE`), read at start, as the process loads them.

One collector for the process reads the gateways started in it (one in production; several
in one test process report the least healthy). `offload-gateway --workers N` serves what its
workers write in files instead (Prometheus' multiprocess mode, gateway/core/_metrics_port.py),
where no worker's collector is read: there each worker writes these gauges every
`SHARE_INTERVAL` seconds (:class:`SharedHealth`), and the metrics port shows the least of the
living workers' (`livemin`: one worker whose store probe or broker link fails makes it 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from client.metrics import certificate_expiry

from ..storage import ObjectStore, StoreError
from ._executors import WorkerPool
from ._settings import Settings

log = logging.getLogger("gateway.health")

#: Seconds one probe may take, as /readyz allows its store check.
PROBE_TIMEOUT = 5.0

#: Seconds between a worker's writes of its health for `offload-gateway --workers N`'s
#: metrics port: what it shows is at most this much older than what the worker reads.
SHARE_INTERVAL = 1.0

# The gauges: name, help, labels.
_STORE_UP = ("offload_store_up", "1 when the last probe of the object store succeeded", ())
_BROKER_UP = ("offload_broker_up", "1 while the broker link is connected", ())
_EXPIRY = (
    "offload_tls_certificate_expiry_timestamp_seconds",
    "end of validity of a certificate chain the gateway presents (seconds since the "
    "epoch; certificate: serving, broker-client)",
    ("certificate",),
)


class StoreProbe:
    """Checks the store every `interval` seconds; `up` is the last answer (None: none yet).

    Args:
        store: the bucket to check (`ObjectStore.ping`).
        pool: the threads the check runs on (the gateway's store pool, as /readyz's).
        interval: seconds between the end of one probe and the next; 0: no probing.
    """

    def __init__(self, store: ObjectStore, pool: WorkerPool, *, interval: float) -> None:
        self.store = store
        self.pool = pool
        self.interval = interval
        self.up: bool | None = None
        self._probing = _Repeating("offload-store-probe", self.probe_once, interval)
        self._check: asyncio.Future[None] | None = None  # the store call under way

    async def probe_once(self) -> bool:
        """Check the store now; log only the changes (a down store is not a log flood).

        A check that outlives the bound counts as a failure but keeps its thread until the
        store client's own timeouts end it; the next probe waits for that same check rather
        than start another, so a store that never answers holds one store thread, not one
        per probe.
        """
        if self._check is None or self._check.done():
            self._check = asyncio.ensure_future(self.pool.run(self.store.ping))
        try:
            await asyncio.wait_for(asyncio.shield(self._check), PROBE_TIMEOUT)
        except (StoreError, TimeoutError) as exc:
            if self.up is not False:
                why = str(exc) or f"no answer within {PROBE_TIMEOUT:g} s"
                log.warning("object store probe failed: %s", why)
            self.up = False
        else:
            if self.up is False:
                log.info("object store probe succeeded again")
            self.up = True
        return self.up

    def start(self) -> None:
        """Probe in the running event loop until :meth:`stop` (no-op when interval is 0)."""
        if self.interval > 0:
            self._probing.start()

    async def stop(self) -> None:
        await self._probing.stop()
        if self._check is not None and not self._check.done():
            self._check.cancel()  # not started: never runs; running: its result is dropped


class _Repeating:
    """`step`, then `interval` seconds' sleep, again and again in the running event loop
    until :meth:`stop`."""

    def __init__(self, name: str, step: Callable[[], Awaitable[object]], interval: float) -> None:
        self.name = name
        self.step = step
        self.interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await self.step()
            await asyncio.sleep(self.interval)


@dataclass(frozen=True)
class Health:
    """What one gateway reports: its store probe, its broker link, its certificates."""

    store: StoreProbe
    broker_connected: Callable[[], bool] | None = None  # None: no broker configured
    certificates: Mapping[str, float] = field(default_factory=dict)  # which -> expiry


@dataclass(frozen=True)
class Readings:
    """The least healthy of the gateways in this process; None: nothing to say."""

    store: bool | None
    broker: bool | None
    certificates: dict[str, float]  # which -> the earliest expiry


class HealthCollector(Collector):
    """The health gauges of the gateways running in this process, read when scraped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: list[Health] = []

    def attach(self, health: Health) -> None:
        """Report `health` from now on (a gateway's lifespan, until :meth:`detach`)."""
        with self._lock:
            self._live.append(health)

    def detach(self, health: Health) -> None:
        with self._lock:
            self._live.remove(health)

    def read(self) -> Readings:
        with self._lock:
            live = list(self._live)
        stores = [h.store.up for h in live if h.store.up is not None]
        brokers = [h.broker_connected() for h in live if h.broker_connected is not None]
        expiries: dict[str, float] = {}
        for h in live:
            for which, when in h.certificates.items():
                expiries[which] = min(when, expiries.get(which, when))
        return Readings(
            min(stores) if stores else None, min(brokers) if brokers else None, expiries
        )

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # nothing until a gateway reports; names are checked by their use

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.read()
        for (name, documentation, _), value in ((_STORE_UP, now.store), (_BROKER_UP, now.broker)):
            if value is not None:
                yield GaugeMetricFamily(name, documentation, value=float(value))
        if now.certificates:
            name, documentation, labels = _EXPIRY
            family = GaugeMetricFamily(name, documentation, labels=labels)
            for which, when in sorted(now.certificates.items()):
                family.add_metric([which], when)
            yield family


class SharedHealth:
    """A worker's health in the files `offload-gateway --workers N` adds up, every
    `interval` seconds: the collector's readings as gauges of Prometheus' multiprocess
    mode, each the least of the living workers' (`livemin`; the parent forgets a worker
    that is gone). A gauge is made at its first value, so that what no worker measured yet
    (no store probe so far, no broker configured) stays absent, as from a single process.

    Args:
        collector: what to write (:data:`HEALTH`).
        interval: seconds between writes.
    """

    def __init__(self, collector: HealthCollector, *, interval: float = SHARE_INTERVAL) -> None:
        self.collector = collector
        self.interval = interval
        self._gauges: dict[str, Gauge] = {}
        self._writing = _Repeating("offload-shared-health", self.write, interval)

    async def write(self) -> None:
        now = self.collector.read()
        for gauge, value in ((_STORE_UP, now.store), (_BROKER_UP, now.broker)):
            if value is not None:
                self._gauge(*gauge).set(value)
        for which, when in now.certificates.items():
            self._gauge(*_EXPIRY).labels(which).set(when)

    def _gauge(self, name: str, documentation: str, labels: tuple[str, ...]) -> Gauge:
        gauge = self._gauges.get(name)
        if gauge is None:  # in no registry: the parent reads the files, never this process
            gauge = Gauge(name, documentation, labels, registry=None, multiprocess_mode="livemin")
            self._gauges[name] = gauge
        return gauge

    def start(self) -> None:
        """Write in the running event loop until :meth:`stop`."""
        self._writing.start()

    async def stop(self) -> None:
        await self._writing.stop()


HEALTH = HealthCollector()
REGISTRY.register(HEALTH)


def certificates(settings: Settings) -> dict[str, float]:
    """The expiry of each certificate chain the settings name (one that cannot be read is
    left out and logged: the server or the broker link that loads it says why)."""
    found: dict[str, float] = {}
    for which, path in (
        ("serving", settings.tls_cert_file),
        ("broker-client", settings.mqtt_cert_file),
    ):
        if path is None:
            continue
        try:
            found[which] = certificate_expiry(path)
        except (OSError, ValueError) as exc:
            log.warning("cannot read the %s certificate %s: %s", which, path, exc)
    return found
