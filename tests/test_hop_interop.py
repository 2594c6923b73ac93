"""The real hop-client's wire format against our gateway: its BSON codec and its fetch checks."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx
import pytest
from hop import bson as hop_bson
from hop.io import Consumer

from _gateway import GatewayServer

pytestmark = pytest.mark.servers


def test_hop_upload_round_trips_in_the_nested_shape(
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    gw = gateway_factory(None)
    msg_id = uuid.uuid4()
    headers = [("_id", msg_id.bytes), ("_format", b"blob"), ("_sender", b"hop-test")]
    payload = bytes(range(256)) * 2000
    # Exactly what hop.io.Producer._send_large_message builds: message first, list of tuples.
    body = hop_bson.dumps({"message": payload, "headers": headers, "key": b"the-key"})
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        r = http.post("/topic/hop/large+oversized", content=body)
        assert r.status_code == 201, r.text
        # hop-client ignores the 201 body and builds the URL from its own id:
        fetched = http.get(f"{gw.url}/msg/{msg_id}")
    assert fetched.status_code == 200
    decoded = hop_bson.loads(fetched.content)
    assert Consumer._check_bson_message_structure(decoded, "url") is None
    assert decoded["message"] == payload
    assert [tuple(h) for h in decoded["metadata"]["headers"]] == headers
    assert decoded["metadata"]["key"] == b"the-key"
    assert decoded["metadata"]["topic"] == "hop/large"


def test_hop_upload_without_key_and_with_text_id(
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    gw = gateway_factory(None)
    msg_id = uuid.uuid4()
    body = hop_bson.dumps({"message": b"small", "headers": {"_id": str(msg_id).encode()}})
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        assert http.post("/topic/x+oversized", content=body).status_code == 201
        decoded = hop_bson.loads(http.get(f"/msg/{msg_id}").content)
    assert Consumer._check_bson_message_structure(decoded, "url") is None
    assert decoded["message"] == b"small"
