"""The running gateway's /openapi.json documents what each route answers, as it is called.

Every success answer has a real schema (ReDoc showed `null` for all of them), or, when it has
no body, says which headers carry it; the hop route is documented with its `+oversized`
suffix, as hop-client calls it. The real answers are checked against the documented ones by
schemathesis (`test_schemathesis.py`); here a stored message's JSON keys are compared with
its model, and the documented hop path is called as written.
"""

from __future__ import annotations

import uuid
from typing import Any

import bson
import httpx
import pytest

from _gateway import GatewayServer

pytestmark = pytest.mark.servers

NO_BODY = {204, 304}  # statuses that never carry one


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    node: Any = spec
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    assert isinstance(node, dict)
    return node


def _success_answers(spec: dict[str, Any]) -> list[tuple[str, str, int, dict[str, Any]]]:
    found = []
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            for status, answer in operation["responses"].items():
                if status[0] in "23":
                    found.append((method.upper(), path, int(status), answer))
    return found


def test_every_success_answer_is_documented(gateway: GatewayServer) -> None:
    spec = httpx.get(f"{gateway.url}/openapi.json", timeout=30).json()
    answers = _success_answers(spec)
    assert len(answers) >= 20, answers
    undocumented = []
    for method, path, status, answer in answers:
        content = answer.get("content")
        if content is None:  # no body: then the headers say it, or the status has none
            if status not in NO_BODY and not answer.get("headers"):
                undocumented.append((method, path, status, "no body and no headers"))
            continue
        for media_type, media in content.items():
            schema = _resolve(spec, media.get("schema") or {})
            if not (schema.get("type") or schema.get("properties")):
                undocumented.append((method, path, status, media_type, schema))
    assert not undocumented, undocumented
    hop_download = spec["paths"]["/msg/{message_id}"]["get"]["responses"]["200"]["content"]
    assert hop_download == {"application/bson": {"schema": {"type": "string", "format": "binary"}}}


def test_the_hop_route_is_documented_as_it_is_called(gateway: GatewayServer) -> None:
    spec = httpx.get(f"{gateway.url}/openapi.json", timeout=30).json()
    assert "/topic/{topic}+oversized" in spec["paths"]
    assert "/topic/{topic}" not in spec["paths"]
    operation = spec["paths"]["/topic/{topic}+oversized"]["post"]
    assert [p["name"] for p in operation["parameters"] if p["in"] == "path"] == ["topic"]
    stored = _resolve(spec, operation["responses"]["201"]["content"]["application/json"]["schema"])
    document = bson.encode({"message": b"payload", "headers": [["_id", uuid.uuid4().bytes]]})
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        # The documented template, filled in as hop-client fills it, is the real route ...
        url = "/topic/{topic}+oversized".replace("{topic}", f"openapi/{uuid.uuid4().hex[:8]}")
        r = http.post(url, content=document)
        assert r.status_code == 201, r.text
        assert set(r.json()) == set(stored["properties"]) == set(stored["required"])
        # ... and the routing is what it was: without the suffix, a 400 that names it.
        bare = http.post("/topic/openapi/x", content=document)
        assert bare.status_code == 400 and "+oversized" in bare.json()["detail"]
