"""Operational routes: /healthz (alive), /readyz (able to serve). The Prometheus metrics
are on a port of their own (`OFFLOAD_METRICS_PORT`, gateway/_app.py), never on the API's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request

from ..core import JSONAnswer, Settings
from ..ingest import OffloadService
from ..storage import StoreError
from ._context import NoBroker
from ._deps import AppSettings, BrokerLink, Service
from ._responses import Health, Ready

router = APIRouter(tags=["operations"])

#: Lifespan state key: a callable listing why auth rules or keys in force are stale (a
#: dynamic security file or JWKS gone bad: the last good ones serve meanwhile).
AUTH_PROBLEMS_KEY = "offload_auth_problems"


def worker_health(settings: Settings, service: OffloadService) -> tuple[bool, dict[str, Any]]:
    """Whether every worker pool makes progress, and each pool's figures."""
    # Longer than every timeout that should end a transfer: a full pool that moved nothing
    # for this long will not free itself.
    transfer_bound = (
        max(settings.body_idle_timeout, settings.store_stall_timeout, settings.send_idle_timeout)
        + settings.health_timeout
    )
    health = service.workers.health(bound=settings.health_timeout, transfer_bound=transfer_bound)
    return health.ok, health.detail


@router.get(
    "/healthz",
    response_model=Health,
    responses={503: {"description": "wedged: the event loop or a worker pool is stuck"}},
)
async def healthz(request: Request, settings: AppSettings, service: Service) -> JSONAnswer:
    """The process is alive: its event loop turns and every worker pool makes progress.

    Answers at once (it never waits on a pool): a job that waited longer than
    `OFFLOAD_HEALTH_TIMEOUT` for a thread, or every transfer slot taken with no byte
    moved for longer than any timeout allows, is a wedge that only a restart cures.
    Saturation (all transfers busy and moving) is not: that answers 503 to new
    transfers, and stays alive. Nor is a dynamic security file or JWKS gone bad: the last
    good version serves and `auth` says what is wrong (a restart would not fix it).
    """
    ok, detail = worker_health(settings, service)
    problems: Callable[[], list[str]] | None = getattr(request.state, AUTH_PROBLEMS_KEY, None)
    body: dict[str, Any] = {"status": "ok" if ok else "wedged", "workers": detail}
    body["auth"] = {"problems": problems() if problems is not None else []}
    return JSONAnswer(body, status_code=200 if ok else 503)


@router.get(
    "/readyz",
    response_model=Ready,
    responses={
        503: {"description": "storage, broker or workers unavailable (`checks` says which)"}
    },
)
async def readyz(settings: AppSettings, service: Service, broker: BrokerLink) -> JSONAnswer:
    """Storage and broker reachable, worker pools making progress."""
    checks: dict[str, str] = {}
    ok, _ = worker_health(settings, service)
    checks["workers"] = "ok" if ok else "wedged (see /healthz)"
    try:
        await asyncio.wait_for(service.workers.store.run(service.store.ping), 5)
        checks["storage"] = "ok"
    except (StoreError, TimeoutError) as exc:
        checks["storage"] = f"unavailable: {exc or 'no answer within 5 s'}"
    if not isinstance(broker, NoBroker):
        checks["broker"] = "ok" if broker.connected else "unavailable: not connected"
    ready = all(v == "ok" for v in checks.values())
    return JSONAnswer(
        {"status": "ready" if ready else "not ready", "checks": checks},
        status_code=200 if ready else 503,
    )
