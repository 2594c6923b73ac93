"""Hostile input from the gateway's own OpenAPI document (schemathesis), plus fuzzed bodies.

The real app runs under uvicorn on real SeaweedFS; every generated request goes over HTTP.
Example counts are bounded so the module stays well under a minute.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import bson
import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import checks

from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

EXAMPLES = 40  # per operation
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


@pytest.fixture
def gw(gateway_factory: Callable[..., GatewayServer], broker: Mosquitto) -> GatewayServer:
    # Small limits so generated bodies and topics reach them.
    return gateway_factory(broker, sweep_interval=0, max_body_bytes=65536, max_topic_bytes=64)


def test_openapi_operations_never_5xx_and_conform(gw: GatewayServer) -> None:
    schema = schemathesis.openapi.from_url(f"{gw.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    paths = {op.path for op in operations}
    assert paths >= {"/topic/{topic}+oversized", "/msg/{message_id}", "/publish/{topic}", "/readyz"}
    failures: dict[str, BaseException] = {}
    for operation in operations:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def run(case: schemathesis.Case) -> None:  # type: ignore[type-arg]
            case.call_and_validate(base_url=gw.url, checks=CHECKS, timeout=30)

        try:
            run()
        except Exception as exc:  # collect every operation's failure, then report them all
            failures[operation.label] = exc
    assert not failures, "\n\n".join(f"{label}: {exc}" for label, exc in failures.items())
    # Fuzzed topics and user properties on /publish never reach the broker in a form it
    # refuses: the gateway's own MQTT link is still up.
    assert httpx.get(f"{gw.url}/readyz", timeout=10).json()["checks"]["broker"] == "ok"


def _document(payload: bytes, extra: list[list[object]]) -> bytes:
    headers: list[list[object]] = [["_id", uuid.uuid4().bytes], *extra]
    return bson.encode({"message": bson.Binary(payload), "headers": headers})


header_values = st.one_of(
    st.binary(max_size=64).map(bson.Binary),
    st.text(max_size=32),
    st.integers(-(2**63), 2**63 - 1),
    st.none(),
    st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3),
)
documents = st.one_of(
    st.binary(max_size=2048),  # noise
    st.builds(
        _document,
        st.binary(max_size=4096),
        st.lists(st.lists(st.one_of(st.text(max_size=8), header_values), max_size=3), max_size=4),
    ),
    # a valid document, then cut, extended or bit-flipped
    st.tuples(
        st.builds(_document, st.binary(max_size=1024), st.just([])),
        st.integers(0, 2000),
        st.binary(max_size=16),
    ).map(lambda t: t[0][: t[1]] + t[2]),
)


def test_fuzzed_upload_bodies_are_refused_with_4xx_never_5xx(gw: GatewayServer) -> None:
    with httpx.Client(base_url=gw.url, timeout=30) as http:

        @settings(
            max_examples=150,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(body=documents, ttl=st.one_of(st.none(), st.integers(-5, 2**33)))
        def upload(body: bytes, ttl: int | None) -> None:
            params = {} if ttl is None else {"ttl": ttl}
            r = http.post("/topic/fuzz/t+oversized", content=body, params=params)
            assert r.status_code < 500, r.text
            assert r.status_code in (201, 400, 409, 413), r.text
            assert "detail" in r.json() or r.status_code == 201

        upload()
        assert http.get("/healthz").status_code == 200
