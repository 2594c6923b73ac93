"""Prometheus metrics and the small HTTP port that serves them with /healthz.

Its own registry (not the process-global one), so several proxies in one process (the
tests) count apart. The HTTP side is :func:`client.metrics.serve`, the gateway's too: two GET
paths, one answer per connection, each bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from client.metrics import exposition, serve

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
#: The proxy's pools (proxy._server.Proxy._pool) and the bounds that refuse (proxy._shares).
POOLS = ("connections", "uploads", "fetches", "logins")
SHARES = ("total", "user", "address")


class Metrics:
    """What the proxy counts."""

    def __init__(self) -> None:
        # A table, one declaration a metric (issue 51 §6 asked to shorten it: a table stays
        # whole); what is made of them (series from the start, the relay's) is `_derived`.
        self.registry = CollectorRegistry()
        r = self.registry
        # Gauges of several workers (offload-proxy --workers) add up over the living ones.
        self.connections = Gauge(
            "offload_proxy_connections",
            "client connections",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.refused = Counter(
            "offload_proxy_refused_connections", "connections refused", ["why"], registry=r
        )
        self.uploads = Gauge(
            "offload_proxy_uploads",
            "offloaded PUBLISHes streaming",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.offloaded = Counter(
            "offload_proxy_offloaded", "PUBLISHes stored and replaced by a placeholder", registry=r
        )
        self.failed = Counter(
            "offload_proxy_offload_failures", "offloads refused or failed", ["why"], registry=r
        )
        self.bytes_up = Counter(
            "offload_proxy_uploaded_bytes", "payload bytes streamed to the gateway", registry=r
        )
        self.fetches = Gauge(
            "offload_proxy_fetches",
            "gateway requests for placeholders under way (a HEAD, a shared GET, a GET for one)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.resolved = Counter(
            "offload_proxy_resolved", "placeholders replaced by their payload", registry=r
        )
        self.passed = Counter(
            "offload_proxy_placeholders_passed",
            "placeholders delivered as they are",
            ["why"],
            registry=r,
        )
        # A gateway or store that trickles its answer: the fetches' pace (fetch_deadline,
        # fetch_min_rate) shut the request's connection (request: head, payload, record).
        self.fetches_cut_off = Counter(
            "offload_proxy_fetches_cut_off",
            "gateway or store answers to the proxy's fetches cut off, slower than their pace",
            ["request"],
            registry=r,
        )
        for request in ("head", "payload", "record"):  # 0 is an answer
            self.fetches_cut_off.labels(request=request)
        self.bytes_down = Counter(
            "offload_proxy_fetched_bytes", "payload bytes fetched for clients", registry=r
        )
        # One fetch for a broadcast (proxy/_flights.py): deliveries fed from a fetch another
        # device's delivery started, and the bytes the shared payloads hold (memory and disk).
        self.joined = Counter(
            "offload_proxy_fetches_joined",
            "placeholders resolved from a fetch of the payload already under way for others",
            registry=r,
        )
        self.shared_bytes = Gauge(
            "offload_proxy_shared_bytes",
            "bytes of payloads fetched once for several devices, held while they are read",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.reassembled = Counter(
            "offload_proxy_reassembled", "chunked messages delivered whole", registry=r
        )
        self.chunk_failures = Counter(
            "offload_proxy_chunk_failures",
            "chunked messages not delivered (why: the reassembly error, total, client-limit)",
            ["why"],
            registry=r,
        )
        self.resends = Counter(
            "offload_proxy_resends",
            "QoS 2 resends of a stored PUBLISH answered with its placeholder, not stored again",
            registry=r,
        )
        self.shares_full = Counter(
            "offload_proxy_shares_full",
            "transfers refused (uploads, logins) or made to wait (fetches) for a full pool "
            "(share: total, user, address)",
            ["pool", "share"],
            registry=r,
        )
        self.pool_limit = Gauge(
            "offload_proxy_pool_limit",
            "size of each pool (connections, uploads, fetches; logins: CONNECT bytes)",
            ["pool"],
            registry=r,
            multiprocess_mode="livesum",
        )
        # Small messages pass in runs, as they came; a packet is framed one by one only when
        # the proxy must read it (direction: up, client to broker; down, broker to client).
        self.packets_decoded = Counter(
            "offload_proxy_packets_decoded",
            "packets the relay framed and read one by one",
            ["direction"],
            registry=r,
        )
        self.packets_relayed = Counter(
            "offload_proxy_packets_relayed",
            "packets relayed in runs as they came, not framed one by one",
            ["direction"],
            registry=r,
        )
        # A connection waited for its account's next turn of the event loop (proxy/_turns.py).
        self.turns_waited = Counter(
            "offload_proxy_turns_waited",
            "times a connection waited for its account's next turn of the event loop, the "
            "account's share of this one spent",
            registry=r,
        )
        self.protocol_errors = Counter(
            "offload_proxy_protocol_errors", "connections ended for malformed input", registry=r
        )
        self.certificate_expiry = Gauge(
            "offload_tls_certificate_expiry_timestamp_seconds",
            "end of validity of a certificate chain the proxy presents (seconds since the "
            "epoch; certificate: serving)",
            ["certificate"],
            registry=r,
            multiprocess_mode="livemin",
        )
        # Latencies with an exemplar naming the trace (OpenMetrics; proxy/_tracing.py).
        self.offload_seconds = Histogram(
            "offload_proxy_offload_seconds",
            "an offloaded PUBLISH from its header to the gateway's answer",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.fetch_seconds = Histogram(
            "offload_proxy_fetch_seconds",
            "a placeholder resolved for a client, from the fetch's start to its last byte",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._counting = self._derived()

    def _derived(self) -> dict[str, dict[str, Callable[[float], None]]]:
        """The series shown from the start (0 is an answer), and what each direction's
        :class:`proxy._stream.PacketStream` counts with (made once: `counting`)."""
        for pool in POOLS:  # every pool's and share's series
            for share in SHARES:
                self.shares_full.labels(pool=pool, share=share)
        self.refused.labels(why="broker-unreachable")  # the broker alert's series
        return {
            direction: {
                "on_heads": self.packets_decoded.labels(direction=direction).inc,
                "on_run": self.packets_relayed.labels(direction=direction).inc,
            }
            for direction in ("up", "down")
        }

    def counting(self, direction: str) -> dict[str, Callable[[float], None]]:
        """What a :class:`proxy._stream.PacketStream` of one `direction` (`up`: client to
        broker, `down`) reports to."""
        return self._counting[direction]

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition and its media type: OpenMetrics (with exemplars) when `accept`
        asks for it, else Prometheus text."""
        encode, media_type = exposition(accept)
        return encode(self.registry), media_type


class Renders(Protocol):
    """What `/metrics` shows: one proxy's :class:`Metrics`, or the sum of several workers'
    (:class:`proxy._workers.Supervisor`)."""

    def render(self, accept: str = "") -> tuple[bytes, str]: ...


async def serve_metrics(
    metrics: Renders, healthy: Callable[[], tuple[bool, str]], host: str, port: int
) -> asyncio.Server:
    """`GET /metrics` and `GET /healthz` on `host:port` (:func:`client.metrics.serve`, as
    the gateway's metrics port)."""
    return await serve(metrics.render, host, port, health=healthy)
