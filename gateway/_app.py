"""The FastAPI application and its lifespan (store, broker link, advertiser)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi_offline import FastAPIOffline

from discovery import Advertiser, DiscoveryRecord

from ._authz import BrokerRules, build_authenticator
from ._context import Context, get_context
from ._cors import BrowserUploads, parse_origins
from ._drain import DrainBeforeEarlyAnswer
from ._errors import install_error_handlers
from ._executors import Workers
from ._limits import UploadLimits
from ._mqtt import broker_link
from ._observability import ObservabilityMiddleware, metrics_endpoint
from ._presign import SignedUrls, UrlSigner
from ._presign import router as presign_router
from ._resumable import ResumableUploads
from ._routes import router
from ._routes_publish import router as publish_router
from ._routes_resumable import router as resumable_router
from ._service import OffloadService
from ._settings import Settings, get_settings
from ._sweeper import Sweeper
from .auth._fastapi import AuthenticationInfoMiddleware
from .storage import ObjectStore, StoreError, open_store

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
        timeout=settings.s3_timeout,
    )


def create_app(
    settings: Settings | None = None,
    *,
    store: ObjectStore | None = None,
    public_url: str | None = None,
) -> FastAPI:
    """The gateway application.

    Args:
        settings: defaults to the environment (`OFFLOAD_*`).
        store: an object store to use instead of the one `settings.storage_url` names.
        public_url: the endpoint URL clients are told to use (overrides the setting).
    """
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        the_store = store or build_store(settings)
        # Pools sized on purpose, one per kind of blocking work (gateway/_executors.py).
        workers = Workers.from_settings(settings)
        workers.start()
        try:
            await workers.store.run(the_store.ensure_bucket)
        except StoreError as exc:
            # Start anyway: /readyz reports the store, uploads answer 503 until it is back.
            log.warning("object store not ready at start-up: %s", exc)
        ctx = Context(
            settings=settings,
            service=OffloadService(
                the_store,
                default_ttl=settings.default_ttl,
                max_ttl=settings.max_ttl,
                delete_after_fetch=settings.delete_after_fetch,
                workers=workers,
            ),
            public_url=(public_url or settings.public_url or "").rstrip("/") or None,
        )
        # Always one: without credentials files it refuses everyone unless anonymous access
        # was asked for by name, and it logs which of those modes this gateway is in.
        authenticator = build_authenticator(settings)
        ctx.authorizer = BrokerRules(authenticator, hashing=workers.hashing)
        ctx.extras["mechanisms"] = authenticator.mechanisms
        # Resumable uploads; presigned URLs, whose signature stands in for credentials.
        ctx.uploads = ResumableUploads(
            the_store, expiry=settings.upload_expiry, transfers=workers.transfers
        )
        secret = settings.auth_secret.get_secret_value() if settings.auth_secret else None
        ctx.signer = UrlSigner.from_settings(secret)
        ctx.authorizer = SignedUrls(ctx.signer, ctx.authorizer)
        advertiser: Advertiser | None = None
        ctx.broker = broker_link(settings)
        if ctx.broker is not None:
            if ctx.public_url:
                record = DiscoveryRecord(
                    ctx.public_url,
                    max_upload_bytes=settings.max_body_bytes,
                    auth_mechanisms=ctx.extras.get("mechanisms", ()),  # type: ignore[arg-type]
                )
                broker = ctx.broker

                def publish(topic: str, payload: bytes, retain: bool, expiry: int) -> Any:
                    from client.protocol import PublishProperties

                    props = PublishProperties(
                        message_expiry_interval=expiry, content_type="application/json"
                    )
                    return broker.publish(topic, payload, qos=1, retain=retain, properties=props)

                advertiser = Advertiser(
                    publish,
                    record,
                    topic=settings.discovery_topic,
                    interval=settings.discovery_interval,
                )
                ctx.broker.on_connected(advertiser.refresh_now)
            ctx.broker.start()
            if advertiser is not None:
                advertiser.start()
        sweeper = Sweeper(the_store, interval=settings.sweep_interval, grace=settings.sweep_grace)
        ctx.extras["sweeper"] = sweeper
        sweeper.start()
        try:
            yield {"ctx": ctx}
        finally:
            await sweeper.stop()
            if advertiser is not None:
                advertiser.stop()
            if ctx.broker is not None:
                ctx.broker.close()
            workers.shutdown()

    # FastAPI's /docs and /redoc load their scripts from a CDN (blank pages without
    # internet); FastAPIOffline serves the same assets, shipped in its wheel, from here.
    app = FastAPIOffline(
        title="mqtt-offload gateway",
        version=VERSION,
        summary="Claim-check offload API for MQTT (hop-client compatible)",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(AuthenticationInfoMiddleware)
    app.add_middleware(ObservabilityMiddleware)
    app.add_middleware(
        UploadLimits,
        max_per_client=settings.max_uploads_per_client,
        body_idle_timeout=settings.body_idle_timeout,
        send_idle_timeout=settings.send_idle_timeout,
    )
    # Outermost but for CORS: a refusal sent before the body was read (401, 403, 429...)
    # must reach the peer even when the connection closes right after it (gateway/_drain.py).
    app.add_middleware(DrainBeforeEarlyAnswer, timeout=settings.body_idle_timeout)
    if settings.cors_origins:  # outermost: preflights are answered before authentication
        app.add_middleware(BrowserUploads, origins=parse_origins(settings.cors_origins))
    app.add_api_route(
        "/metrics",
        metrics_endpoint,
        methods=["GET"],
        tags=["operations"],
        response_class=PlainTextResponse,  # documents the Prometheus text format
    )
    app.include_router(router)
    app.include_router(publish_router)
    app.include_router(resumable_router)
    app.include_router(presign_router)

    # Longer than every timeout that should end a transfer: a full pool that moved nothing
    # for this long will not free itself.
    transfer_bound = (
        max(settings.body_idle_timeout, settings.store_stall_timeout, settings.send_idle_timeout)
        + settings.health_timeout
    )

    def worker_health(request: Request) -> tuple[bool, dict[str, Any]]:
        workers = get_context(request).service.workers
        health = workers.health(bound=settings.health_timeout, transfer_bound=transfer_bound)
        return health.ok, health.detail

    @app.get(
        "/healthz",
        tags=["operations"],
        responses={503: {"description": "wedged: the event loop or a worker pool is stuck"}},
    )
    async def healthz(request: Request) -> JSONResponse:
        """The process is alive: its event loop turns and every worker pool makes progress.

        Answers at once (it never waits on a pool): a job that waited longer than
        `OFFLOAD_HEALTH_TIMEOUT` for a thread, or every transfer slot taken with no byte
        moved for longer than any timeout allows, is a wedge that only a restart cures.
        Saturation (all transfers busy and moving) is not: that answers 503 to new
        transfers, and stays alive.
        """
        ok, detail = worker_health(request)
        return JSONResponse(
            {"status": "ok" if ok else "wedged", "workers": detail},
            status_code=200 if ok else 503,
        )

    @app.get(
        "/readyz",
        tags=["operations"],
        responses={
            503: {"description": "storage, broker or workers unavailable (`checks` says which)"}
        },
    )
    async def readyz(request: Request) -> JSONResponse:
        """Storage and broker reachable, worker pools making progress."""
        ctx = get_context(request)
        checks: dict[str, str] = {}
        ok, _ = worker_health(request)
        checks["workers"] = "ok" if ok else "wedged (see /healthz)"
        try:
            await asyncio.wait_for(ctx.service.workers.store.run(ctx.service.store.ping), 5)
            checks["storage"] = "ok"
        except (StoreError, TimeoutError) as exc:
            checks["storage"] = f"unavailable: {exc or 'no answer within 5 s'}"
        if ctx.broker is not None:
            checks["broker"] = "ok" if ctx.broker.connected else "unavailable: not connected"
        ready = all(v == "ok" for v in checks.values())
        return JSONResponse(
            {"status": "ready" if ready else "not ready", "checks": checks},
            status_code=200 if ready else 503,
        )

    return app
