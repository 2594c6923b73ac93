"""The real gateway application driven in-process through `httpx.ASGITransport`.

Where a socket adds nothing (no broker, the file store, plain HTTP), the composition root
runs its real lifespan and answers httpx without uvicorn: this also pins down what a
gateway without `OFFLOAD_MQTT_URL` does (its `NoBroker`).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope, Send

from client.protocol import encode_upload
from gateway import create_app
from gateway.core._settings import Settings


@asynccontextmanager
async def in_process(root: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A broker-less gateway on a file store, its lifespan run, and a client for it."""
    settings = Settings(
        storage_url=f"file://{root}", allow_anonymous=True, mqtt_url=None, sweep_interval=0
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app) as state:

        async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
            # What uvicorn does with the lifespan's state: a copy into every request.
            await app({**scope, "state": dict(state or {})}, receive, send)

        transport = httpx.ASGITransport(app=with_state)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as http:
            yield http


def test_a_broker_less_gateway_stores_and_serves_but_refuses_to_publish(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with in_process(tmp_path) as http:
            health = await http.get("/healthz")
            assert health.status_code == 200 and health.json()["status"] == "ok"
            ready = await http.get("/readyz")
            # No broker configured: nothing to wait for, so it is not among the checks.
            assert ready.status_code == 200
            assert set(ready.json()["checks"]) == {"workers", "storage"}

            refused = await http.post("/publish/cams/1", content=b"x" * 1000)
            assert refused.status_code == 503
            assert "no broker configured" in refused.json()["detail"]

            payload = b"in-process" * 1000
            head, tail = encode_upload(len(payload), headers=[])
            stored = await http.post("/topic/cams/1+oversized", content=head + payload + tail)
            assert stored.status_code == 201, stored.text
            assert stored.json()["sha256"] == hashlib.sha256(payload).hexdigest()
            fetched = await http.get(f"/msg/{stored.json()['id']}/payload")
            assert fetched.status_code == 200 and fetched.content == payload

    asyncio.run(scenario())
    # Refused before the body was read: the only payload on disk is the hop upload's.
    data = [p for p in (tmp_path / "data").rglob("*") if p.is_file() and p.suffix != ".json"]
    assert len(data) == 1


def test_no_route_hands_its_endpoint_or_a_dependency_to_a_thread(tmp_path: Path) -> None:
    """FastAPI runs a plain `def` endpoint or dependency in its thread pool: a thread hop,
    two GIL hand-overs and a task per request, and per dependency (they were a third of a
    small download's gateway CPU, bench/RESULTS.md "Round 16"). Every one is `async def`."""
    app = create_app(Settings(storage_url=f"file://{tmp_path}", allow_anonymous=True))
    synchronous: list[str] = []

    def visit(dependant: Dependant, where: str) -> None:
        call = dependant.call
        if call is not None and not inspect.iscoroutinefunction(call):
            synchronous.append(f"{where}: {getattr(call, '__qualname__', call)}")
        for sub in dependant.dependencies:
            visit(sub, where)

    def routes(table: list[Any]) -> Iterator[APIRoute]:
        for route in table:
            if isinstance(route, APIRoute):
                yield route
            included = getattr(route, "original_router", None)  # FastAPI's include_router
            if included is not None:
                assert not route.include_context.dependencies, "walk these too"
                yield from routes(included.routes)

    seen = list(routes(app.routes))
    assert len(seen) > 20
    for route in seen:
        visit(route.dependant, f"{sorted(route.methods)} {route.path}")
    assert synchronous == []
