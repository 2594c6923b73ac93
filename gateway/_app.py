"""The composition root: the FastAPI application, its services and their lifespan.

`create_app` wires routes and middleware and nothing else (as starlette's constructor
does); the lifespan builds the services once, with one small function per part, and hands
them out as one frozen `Context` (gateway/http/_context.py).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from client.protocol import PublishProperties
from client.tracing import TracerProviderLike, Tracing, exporting_from_environment, tracing_for
from discovery import Advertiser

from ._sweeper import Sweeper
from .auth import Authenticator
from .core import (
    HEALTH,
    MULTIPROC_ENV,
    TRACING_KEY,
    BrowserUploads,
    Health,
    ObservabilityMiddleware,
    Settings,
    SharedHealth,
    StoreProbe,
    Workers,
    broker_link,
    certificates,
    get_settings,
    install_error_handlers,
    parse_origins,
    serve_metrics,
)
from .direct import Direct
from .http._authz import AuthenticationInfoMiddleware, BrokerRules, build_authenticator
from .http._context import Broker, Context, NoBroker
from .http._ops import AUTH_PROBLEMS_KEY
from .http._ops import router as ops_router
from .http._presign import SignedUrls, UrlSigner
from .http._presign import router as presign_router
from .http._routes import HOP_PATH, router
from .http._routes_direct import router as direct_router
from .http._routes_info import MECHANISMS_KEY, advertised_record
from .http._routes_info import router as info_router
from .http._routes_publish import router as publish_router
from .http._routes_raw import router as raw_router
from .http._routes_retention import router as retention_router
from .http._routes_tus import router as resumable_router
from .ingest import OffloadService, Quotas
from .middleware import STALL_KEY as CLOSE_STALL_KEY
from .middleware import STATE_KEY as HEADER_TIMEOUT_KEY
from .middleware import DrainBeforeEarlyAnswer, TrustedProxies, UploadLimits, Utf8Target
from .retention import Groups, Retention
from .storage import ObjectStore, StoreError, open_store
from .tus import ResumableUploads

log = logging.getLogger("gateway")

VERSION = "0.1.0"


def build_store(settings: Settings) -> ObjectStore:
    """The store the settings name; S3 credentials fall back to the AWS variables."""
    import os

    access = settings.s3_access_key.get_secret_value() if settings.s3_access_key else None
    secret = settings.s3_secret_key.get_secret_value() if settings.s3_secret_key else None
    # The AWS names are read here, at the edge, like every other environment variable.
    access = access or os.environ.get("AWS_ACCESS_KEY_ID")
    secret = secret or os.environ.get("AWS_SECRET_ACCESS_KEY")
    return open_store(
        settings.storage_url,
        access_key=access,
        secret_key=secret,
        region=settings.s3_region,
        part_size=settings.s3_part_size,
        parallel_uploads=settings.s3_parallel_uploads,
        part_memory=settings.s3_part_memory,
        checksums=settings.s3_checksums,
        timeout=settings.s3_timeout,
    )


def build_broker(settings: Settings) -> Broker:
    """The broker link the settings name (not started); `NoBroker` without `OFFLOAD_MQTT_URL`."""
    link = broker_link(settings)
    return NoBroker() if link is None else link


def build_context(
    settings: Settings, store: ObjectStore, workers: Workers, broker: Broker, public_url: str
) -> tuple[Context, Authenticator]:
    """The services every handler gets, and the authenticator (its mechanisms are
    advertised, its problems shown on /healthz, and it is closed with the lifespan)."""
    # Always one authenticator: without credentials files it refuses everyone unless
    # anonymous access was asked for by name, and it logs which of those modes it is in.
    authenticator = build_authenticator(settings)
    secret = settings.auth_secret.get_secret_value() if settings.auth_secret else None
    signer = UrlSigner.from_settings(secret)
    retention = build_retention(settings, store, workers)
    service = OffloadService(
        store,
        default_ttl=settings.default_ttl,
        max_ttl=settings.max_ttl,
        min_ttl=settings.min_ttl,
        delete_after_fetch=settings.delete_after_fetch,
        workers=workers,
        retention=retention,
    )
    quotas = Quotas(
        store,
        workers.store,
        max_open=settings.max_open_uploads,
        max_bytes=settings.max_reserved_bytes,
    )
    ctx = Context(
        settings=settings,
        service=service,
        broker=broker,
        # A presigned URL's signature stands in for credentials; the rest go to the rules.
        authorizer=SignedUrls(signer, BrokerRules(authenticator, hashing=workers.hashing)),
        uploads=ResumableUploads(
            store,
            expiry=settings.upload_expiry,
            transfers=workers.transfers,
            calls=workers.store,
            quotas=quotas,
            retention=retention,
        ),
        signer=signer,
        public_url=public_url,
        direct=Direct.build(
            store,
            settings.s3_public_url,
            redirect=settings.redirect_downloads,
            grant_ttl=settings.direct_grant_ttl,
            redirect_ttl=settings.redirect_ttl,
        ),
        quotas=quotas,
        retention=retention,
    )
    return ctx, authenticator


def build_retention(settings: Settings, store: ObjectStore, workers: Workers) -> Retention:
    """Groups, one object per payload per account, stored-bytes quotas (gateway/retention).

    Raises:
        ValueError: a quota without records (`OFFLOAD_DEDUP=false`).
        AuthConfigError: the groups file cannot be read or parsed.
    """
    return Retention(
        store,
        workers.store,
        groups=Groups(settings.retention_groups_file),
        dedup=settings.dedup,
        cap=settings.max_stored_bytes_per_user,
        part=settings.s3_part_size,
    )


def build_advertiser(ctx: Context, mechanisms: tuple[str, ...]) -> Advertiser | None:
    """The retained discovery record's publisher; None without a broker or a public URL."""
    settings, broker = ctx.settings, ctx.broker
    if isinstance(broker, NoBroker) or not ctx.public_url:
        return None
    record = advertised_record(ctx, mechanisms, ctx.public_url)  # what `GET /` answers too

    def publish(topic: str, payload: bytes, retain: bool, expiry: int) -> Any:
        props = PublishProperties(message_expiry_interval=expiry, content_type="application/json")
        return broker.publish(topic, payload, qos=1, retain=retain, properties=props)

    advertiser = Advertiser(
        publish, record, topic=settings.discovery_topic, interval=settings.discovery_interval
    )
    broker.on_connected(advertiser.refresh_now)
    return advertiser


def start_health(
    settings: Settings, store: ObjectStore, workers: Workers, broker: Broker
) -> Health:
    """What the gateway reports of its health to Prometheus (gateway/core/_health.py), its
    store probe started."""
    probe = StoreProbe(store, workers.store, interval=settings.store_probe_interval)
    probe.start()
    connected = None if isinstance(broker, NoBroker) else (lambda: broker.connected)
    return Health(probe, connected, certificates(settings))


async def open_bucket(store: ObjectStore, workers: Workers) -> None:
    """Make sure the bucket exists; start anyway when the store is not reachable yet."""
    try:
        await workers.store.run(store.ensure_bucket)
    except StoreError as exc:
        # /readyz reports the store, uploads answer 503 until it is back.
        log.warning("object store not ready at start-up: %s", exc)


def build_tracing(provider: TracerProviderLike | None) -> tuple[Tracing, Any]:
    """The gateway's tracing, and the SDK provider it made (to shut down), if any.

    A provider given is used as it is. Otherwise the `OTEL_*` variables decide, the
    standard way (:func:`client.tracing.exporting_from_environment`; read here, at the
    edge, like the AWS names): an exporter asked for and the `otel` extra installed gives
    an SDK provider; anything else the seam's no-op, which imports nothing and still
    carries a caller's context on to the placeholder and the manifest.
    """
    if provider is not None:
        return tracing_for(provider), None
    made = exporting_from_environment("offload-gateway", os.environ)
    if made is None:
        return Tracing(), None
    return tracing_for(made), made


def make_lifespan(
    settings: Settings,
    store: ObjectStore | None,
    public_url: str,
    tracer_provider: TracerProviderLike | None = None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[dict[str, Any]]]:
    """The lifespan: services built and started in order, stopped in reverse."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        tracing, exporting = build_tracing(tracer_provider)
        the_store = store or build_store(settings)
        # Pools sized on purpose, one per kind of blocking work (gateway/core/_executors.py).
        workers = Workers.from_settings(settings)
        workers.start()
        await open_bucket(the_store, workers)
        ctx, authenticator = build_context(
            settings, the_store, workers, build_broker(settings), public_url
        )
        mechanisms = tuple(authenticator.mechanisms)
        advertiser = build_advertiser(ctx, mechanisms)
        ctx.broker.start()
        if advertiser is not None:
            advertiser.start()
        sweeper = Sweeper(
            the_store,
            interval=settings.sweep_interval,
            grace=settings.sweep_grace,
            direct=ctx.direct.store,
            keeper=ctx.retention.keeper,
            confirm_interval=settings.confirm_sweep_interval,
            cap=settings.max_stored_bytes_per_user,
            top_accounts=settings.top_accounts,
        )
        sweeper.start(workers.store)
        metrics = await serve_metrics(settings)  # its own port, never the API's
        health = start_health(settings, the_store, workers, ctx.broker)
        HEALTH.attach(health)  # offload_store_up, offload_broker_up, the certificates' expiry
        shared = SharedHealth(HEALTH)  # --workers N: the parent reads files, not HEALTH
        if os.environ.get(MULTIPROC_ENV):
            shared.start()
        try:
            # The HTTP protocol reads its head deadline and how long a closing connection's
            # peer may leave its answer untaken here (gateway/middleware/_protocol.py).
            yield {
                "ctx": ctx,
                HEADER_TIMEOUT_KEY: settings.header_timeout,
                CLOSE_STALL_KEY: settings.send_idle_timeout,
                # what `GET /` advertises (gateway/http/_routes_info.py)
                MECHANISMS_KEY: mechanisms,
                # rules or keys gone stale, for /healthz (gateway/http/_ops.py)
                AUTH_PROBLEMS_KEY: authenticator.problems,
                # every request's span and its children (gateway/core/_tracing.py)
                TRACING_KEY: tracing,
            }
        finally:
            await shared.stop()
            HEALTH.detach(health)
            await health.store.stop()
            if metrics is not None:
                metrics.close()
            await sweeper.stop()
            if advertiser is not None:
                advertiser.stop()
            ctx.broker.close()
            authenticator.close()
            workers.shutdown()
            if exporting is not None:
                exporting.shutdown()  # exports the spans still queued

    return lifespan


def _document_hop_path(app: FastAPI) -> None:
    """Show the hop route in /openapi.json as clients call it: `/topic/{topic}+oversized`.

    It routes `/topic/{topic:path}` (so a call without the suffix gets a 400 that names it),
    which FastAPI documents as `/topic/{topic}`; only the document changes, not the routing.
    """
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            paths = schema["paths"]
            schema["paths"] = {
                (HOP_PATH if path == "/topic/{topic}" else path): item
                for path, item in paths.items()
            }
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


# FastAPI (0.16x) traces every request itself once a global tracer provider is set, with
# spans per dependency: the gateway's own request span (gateway/core/_tracing.py) stands
# instead, one per request, its caller's context read by the bounded codec.
_NO_FASTAPI_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


def create_app(
    settings: Settings | None = None,
    *,
    store: ObjectStore | None = None,
    public_url: str | None = None,
    tracer_provider: TracerProviderLike | None = None,
) -> FastAPI:
    """The gateway application.

    Args:
        settings: defaults to the environment (`OFFLOAD_*`).
        store: an object store to use instead of the one `settings.storage_url` names.
        public_url: the endpoint URL clients are told to use (overrides the setting).
        tracer_provider: an OpenTelemetry `TracerProvider` for the gateway's spans;
            default: one from the `OTEL_*` variables when they ask for an exporter
            (docs/tracing.md), else none.
    """
    settings = settings or get_settings()
    public = (public_url or settings.public_url or "").rstrip("/")
    # FastAPI's /docs and /redoc load their scripts from a CDN (blank pages without
    # internet); FastAPIOffline serves the same assets, shipped in its wheel, from here.
    app = FastAPIOffline(
        title="mqtt-offload gateway",
        version=VERSION,
        summary="Claim-check offload API for MQTT (hop-client compatible)",
        lifespan=make_lifespan(settings, store, public, tracer_provider),
        **_NO_FASTAPI_TELEMETRY,
    )
    install_error_handlers(app)
    _document_hop_path(app)  # lazily: the document is generated once every route is in
    app.add_middleware(AuthenticationInfoMiddleware)
    app.add_middleware(Utf8Target)  # inside: its 400 is logged and counted, and drained
    app.add_middleware(ObservabilityMiddleware)
    app.add_middleware(
        UploadLimits,
        max_per_client=settings.max_uploads_per_client,
        body_idle_timeout=settings.body_idle_timeout,
        send_idle_timeout=settings.send_idle_timeout,
        min_body_rate=settings.min_body_rate,
        max_per_user=settings.max_uploads_per_user,
    )
    # Outermost but for CORS: a refusal sent before the body was read (401, 403, 429...)
    # must reach the peer even when the connection closes right after it
    # (gateway/middleware/_drain.py).
    app.add_middleware(DrainBeforeEarlyAnswer, timeout=settings.body_idle_timeout)
    if settings.cors_origins:  # outermost: preflights are answered before authentication
        app.add_middleware(BrowserUploads, origins=parse_origins(settings.cors_origins))
    if settings.trusted_proxies:  # before all: every per-address rule sees the device's
        app.add_middleware(TrustedProxies, networks=settings.trusted_networks)
    app.include_router(router)
    app.include_router(raw_router)
    app.include_router(retention_router)
    app.include_router(publish_router)
    app.include_router(resumable_router)
    app.include_router(presign_router)
    app.include_router(direct_router)
    app.include_router(ops_router)
    app.include_router(info_router)
    return app
