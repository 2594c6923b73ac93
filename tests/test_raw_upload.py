"""The raw upload (`PUT /msg/<id>`): the native client's path for payloads of any size.

Real gateway, SeaweedFS and mosquitto; an "old gateway" is the real gateway with the raw
route taken out of its routing table, which is exactly what an older version serves.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from hop import bson as hop_bson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client import Client, Message, PublishProperties, Route, UploadError
from client.core._source import PayloadSource
from client.http._transport import HttpTransport
from client.http._upload_forms import header_fields
from client.protocol import MessageId
from gateway.storage import S3Store
from gateway.storage._multipart import MAX_PART_SIZE, MAX_PARTS, part_size_for

from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
GiB = 1024 * MiB
OFFLOAD = shutil.which("offload") or "offload"


def uploads(gw: GatewayServer, kind: str) -> float:
    """`offload_uploads_total{kind=...}` as the gateway's /metrics reports it."""
    text = httpx.get(gw.metrics_url, timeout=10).text
    found = re.search(rf'^offload_uploads_total\{{kind="{kind}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def keys(seaweed: SeaweedFS, bucket: str) -> list[str]:
    store = S3Store(
        seaweed.endpoint, bucket, access_key=seaweed.access_key, secret_key=seaweed.secret_key
    )
    return sorted(info.key for info in store.list(""))


def without_raw_route(gw: GatewayServer) -> GatewayServer:
    """The gateway as a version without `PUT /msg/{id}` serves it (answers 405).

    The raw route's router is taken out of this app's table only (the router object is
    shared by every gateway in the process, so it is not changed).
    """
    from gateway.http._routes_raw import router as raw_router

    def is_raw(route: object) -> bool:
        return route is raw_router or getattr(route, "original_router", None) is raw_router

    before = len(gw.app.router.routes)
    gw.app.router.routes[:] = [r for r in gw.app.router.routes if not is_raw(r)]
    assert len(gw.app.router.routes) == before - 1
    return gw


def put(
    http: httpx.Client, message_id: str, body: bytes, topic: str = "raw/t", **headers: str
) -> httpx.Response:
    return http.put(f"/msg/{message_id}", params={"topic": topic}, content=body, headers=headers)


def test_the_cli_publishes_raw_and_a_subscriber_gets_it_with_its_properties(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    broker: Mosquitto = gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("raw")
    reader = clients()
    reader.subscribe(topic, qos=1)
    path = tmp_path / "payload.bin"
    path.write_bytes(os.urandom(3 * MiB))  # over the 256 KiB broker limit
    raw_before, bson_before = uploads(gateway, "raw"), uploads(gateway, "envelope")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env["OFFLOAD_CONFIG"] = os.devnull
    done = subprocess.run(
        [OFFLOAD, "publish", "--broker", broker.url, "-t", topic, "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["route"] == "offloaded"
    # Counted by the gateway itself: one raw upload, no BSON document.
    assert uploads(gateway, "raw") == raw_before + 1
    assert uploads(gateway, "envelope") == bson_before
    got = reader.next_message(30)
    assert isinstance(got, Message) and got.route is Route.OFFLOADED
    assert got.payload == path.read_bytes()

    # User properties and the expiry reach the store as the BSON route stores them.
    writer = clients()
    props = PublishProperties(
        message_expiry_interval=600, user_properties=(("k", "v é"), ("a b", "x=y&z"))
    )
    sent = writer.publish(topic, b"p" * (300 * 1024), qos=1, properties=props)
    assert sent.route is Route.OFFLOADED and sent.message_id is not None
    doc = hop_bson.loads(httpx.get(f"{gateway.url}/msg/{sent.message_id}", timeout=10).content)
    assert [tuple(h) for h in doc["metadata"]["headers"]] == [
        ("_id", uuid.UUID(sent.message_id).bytes),
        ("k", "v é".encode()),
        ("a b", b"x=y&z"),
    ]
    back = reader.next_message(30)
    assert isinstance(back, Message) and back.properties.user_properties == props.user_properties


def test_same_id_same_content_is_created_false_other_content_409(
    gateway_factory: Callable[..., GatewayServer], seaweed: SeaweedFS, bucket_name: str
) -> None:
    gw = gateway_factory(None)
    body = os.urandom(200_000)
    msg_id = str(uuid.uuid4())
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        first = put(http, msg_id, body)
        assert first.status_code == 201, first.text
        assert first.json()["created"] is True
        assert first.json()["sha256"] == hashlib.sha256(body).hexdigest()
        assert first.headers["location"] == f"/msg/{msg_id}"
        again = put(http, msg_id, body)
        assert again.status_code == 201 and again.json()["created"] is False
        # One bit flipped: replacing the last byte with a constant was no change at all
        # whenever the random body already ended in it (1 run in 256; seen once in CI).
        other = put(http, msg_id, body[:-1] + bytes([body[-1] ^ 1]))
        assert other.status_code == 409, other.text
        moved = put(http, msg_id, body, topic="raw/elsewhere")
        assert moved.status_code == 409
        assert http.get(f"/msg/{msg_id}/payload").content == body
        # The BSON route sees the same message: one id, one set of rules.
        hop_doc = hop_bson.dumps({"message": body, "headers": [("_id", uuid.UUID(msg_id).bytes)]})
        assert http.post("/topic/raw/t+oversized", content=hop_doc).json()["created"] is False
    stored = keys(seaweed, bucket_name)
    assert len([k for k in stored if k.startswith("data/")]) == 2, stored  # payload + sidecar


def test_bad_input_is_refused_with_a_reason_and_nothing_is_kept(
    gateway_factory: Callable[..., GatewayServer], seaweed: SeaweedFS, bucket_name: str
) -> None:
    gw = gateway_factory(None, max_body_bytes=1 * MiB, max_header_bytes=100)
    body = b"x" * 1000
    good = str(uuid.uuid4())
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        cases = {
            "not-an-id": put(http, "not-an-id", body),
            "wildcard": put(http, good, body, topic="a/#"),
            "reserved": put(http, good, body, topic="$SYS/x"),
            "no topic": http.put(f"/msg/{good}", content=body),
            "header": put(http, good, body, **{"X-Offload-Header": "no-equals"}),
            "id header": put(http, good, body, **{"X-Offload-Header": "_id=1"}),
            "headers too big": put(http, good, body, **{"X-Offload-Header": "a=" + "b" * 200}),
            "sha256 junk": put(http, good, body, **{"X-Offload-Sha256": "zz"}),
            "sha256 wrong": put(http, good, body, **{"X-Offload-Sha256": "0" * 64}),
            "ttl": http.put(f"/msg/{good}", params={"topic": "a", "ttl": "-1"}, content=body),
        }
        too_big = put(http, good, b"x" * (MiB + 1))
    for name, response in cases.items():
        assert response.status_code == 400, (name, response.text)
        assert response.json()["detail"], name
    assert "nothing was kept" in cases["sha256 wrong"].json()["detail"]
    assert too_big.status_code == 413
    assert keys(seaweed, bucket_name) == []


def _recording() -> tuple[httpx.Client, list[str]]:
    """An httpx client that remembers the method of every request it sends."""
    methods: list[str] = []
    hooked = httpx.Client(timeout=60, event_hooks={"request": [lambda r: methods.append(r.method)]})
    return hooked, methods


def test_an_old_gateway_gets_bson_below_the_cap_and_a_clear_error_above(
    gateway_factory: Callable[..., GatewayServer], seaweed: SeaweedFS, bucket_name: str
) -> None:
    gw = without_raw_route(gateway_factory(None))
    bson_before = uploads(gw, "envelope")
    # Small payloads go straight to PUT; the 405 (body drained) sends them as BSON, and the
    # answer is remembered. The cap is lowered so that an over-the-cap payload is cheap.
    hooked, methods = _recording()
    with hooked, HttpTransport(client=hooked, bson_limit=1 * MiB) as http:
        for payload in (os.urandom(4000), os.urandom(5000)):
            with PayloadSource(payload) as source:
                receipt = http.upload(gw.url, "old/t", source, message_id=MessageId.new())
            assert httpx.get(f"{receipt.url}/payload", timeout=10).content == payload
        assert methods == ["PUT", "POST", "POST"]
        with PayloadSource(bytes(MiB + 1)) as source, pytest.raises(UploadError) as refused:
            http.upload(gw.url, "old/t", source, message_id=MessageId.new())
        assert methods == ["PUT", "POST", "POST"]  # nothing sent for it
    assert "no raw upload route" in str(refused.value)
    assert "upgrade the gateway" in str(refused.value)
    # A large payload (over the 16 MiB an old gateway drains) asks OPTIONS first: the body
    # travels once, as BSON, never to a 405.
    hooked, methods = _recording()
    large = os.urandom(20 * MiB)
    with hooked, HttpTransport(client=hooked) as http, PayloadSource(large) as source:
        receipt = http.upload(gw.url, "old/t", source, message_id=MessageId.new())
    assert methods == ["OPTIONS", "POST"]
    assert httpx.get(f"{receipt.url}/payload", timeout=30).content == large
    assert uploads(gw, "envelope") == bson_before + 3
    assert len([k for k in keys(seaweed, bucket_name) if k.startswith("ids/")]) == 3


def test_a_large_upload_asks_options_once_per_endpoint(
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    gw = gateway_factory(None)
    allowed = httpx.options(f"{gw.url}/msg/{uuid.uuid4()}", timeout=10)
    assert allowed.status_code == 204 and "PUT" in allowed.headers["allow"]
    hooked, methods = _recording()
    with hooked, HttpTransport(client=hooked) as http:
        for _ in range(2):
            with PayloadSource(bytes(17 * MiB)) as source:
                http.upload(gw.url, "probe/t", source, message_id=MessageId.new())
    assert methods == ["OPTIONS", "PUT", "PUT"]


def test_a_payload_over_the_bson_cap_is_published_raw_by_the_client(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
) -> None:
    """The cap lowered to 1 MiB: a 3 MiB message still goes (raw), whole and verified."""
    topic = unique_topic("cap")
    reader = clients()
    reader.subscribe(topic, qos=1)
    writer = clients(transport=HttpTransport(timeout=30, bson_limit=1 * MiB))
    payload = os.urandom(3 * MiB)
    sent = writer.publish(topic, payload, qos=1)
    assert sent.route is Route.OFFLOADED
    got = reader.next_message(30)
    assert isinstance(got, Message) and got.payload == payload


def test_large_headers_fall_back_to_bson_and_over_the_cap_they_are_an_error(
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    gw = gateway_factory(None)
    headers = [("big", b"v" * 9000)]  # over the 8 KiB of header fields
    with HttpTransport(timeout=30, bson_limit=100_000) as http:
        with PayloadSource(b"s" * 1000) as source:
            receipt = http.upload(
                gw.url, "h/t", source, message_id=MessageId.new(), headers=headers
            )
        doc = hop_bson.loads(httpx.get(receipt.url, timeout=10).content)
        assert ("big", b"v" * 9000) in [tuple(h) for h in doc["metadata"]["headers"]]
        with PayloadSource(b"s" * 200_000) as source, pytest.raises(UploadError, match="exceed"):
            http.upload(gw.url, "h/t", source, message_id=MessageId.new(), headers=headers)


def test_part_sizes_never_need_more_than_10000_parts() -> None:
    base = 8 * MiB
    assert part_size_for(1, 10 * GiB, base) == base  # 1,280 parts
    for length in (10 * GiB, 100 * GiB, 5 * 1024 * GiB):
        size = part_size_for(1, length, base)
        assert -(-length // size) <= MAX_PARTS and size % MiB == 0
    # Unknown length: sizes grow, and 10,000 parts hold more than S3's 5 TiB object limit.
    sizes = [part_size_for(n, -1, base) for n in range(1, MAX_PARTS + 1)]
    assert sizes[0] == base and sizes == sorted(sizes) and max(sizes) <= MAX_PART_SIZE
    assert sum(sizes) > 5 * 1024 * GiB


def test_a_chunked_body_of_unknown_length_is_stored_in_growing_parts(
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    gw = gateway_factory(None, s3_part_size=5 * MiB)
    data = os.urandom(12 * MiB)
    msg_id = str(uuid.uuid4())

    def body() -> object:
        for i in range(0, len(data), MiB):
            yield data[i : i + MiB]

    with httpx.Client(base_url=gw.url, timeout=60) as http:
        r = http.put(f"/msg/{msg_id}", params={"topic": "chunked/t"}, content=body())
        assert r.status_code == 201, r.text
        assert http.get(f"/msg/{msg_id}/payload").content == data


def test_any_header_bytes_are_stored_and_served_back_in_the_bson_document(
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    """Hostile names and values (NUL, CR LF, invalid UTF-8 values) are data, never a 5xx."""
    gw = gateway_factory(None)
    msg_id = str(uuid.uuid4())
    headers = [("a\x00b", b"\x00\xff"), ("é\r\n", b""), ("=", b"%=&")]
    fields = header_fields(headers)  # the client's encoder, the gateway's decoder
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        r = http.put(
            f"/msg/{msg_id}",
            params={"topic": "h/t"},
            content=b"body",
            headers=[("X-Offload-Header", field) for field in fields],
        )
        assert r.status_code == 201, r.text
        doc = hop_bson.loads(http.get(f"/msg/{msg_id}").content)
        bad_name = http.put(
            f"/msg/{uuid.uuid4()}",
            params={"topic": "h/t"},
            content=b"body",
            headers={"X-Offload-Header": "%FF=x"},
        )
    assert [tuple(h) for h in doc["metadata"]["headers"]][1:] == headers
    assert bad_name.status_code == 400 and "UTF-8" in bad_name.json()["detail"]


# Header field values as a client can send them (httpx refuses edge whitespace), `%` and `=`
# often: malformed escapes, missing names, `_id`, too many bytes.
_field = st.text(alphabet=st.sampled_from("ab=%0F9_-.~:/"), max_size=40) | st.sampled_from(
    ["_id=x", "=v", "%FF=1", "a=%", "x" * 300 + "=y"]
)


def test_fuzzed_raw_uploads_get_4xx_or_201_never_5xx(
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    gw = gateway_factory(None, max_header_bytes=256, max_body_bytes=4096)
    with httpx.Client(base_url=gw.url, timeout=30) as http:

        @settings(
            max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(
            message_id=st.one_of(
                st.uuids().map(str), st.text("0123456789abcdef-", min_size=1, max_size=40)
            ),
            topic=st.one_of(st.just("f/t"), st.text("ab/#+$ .", min_size=0, max_size=12)),
            fields=st.lists(_field, max_size=12),
            sha=st.one_of(st.none(), st.text("0123456789abcdefXYZ", max_size=70)),
            body=st.binary(max_size=5000),
        )
        def upload(
            message_id: str, topic: str, fields: list[str], sha: str | None, body: bytes
        ) -> None:
            headers = [("X-Offload-Header", f) for f in fields]
            if sha is not None:
                headers.append(("X-Offload-Sha256", sha))
            r = http.put(
                f"/msg/{message_id}", params={"topic": topic}, content=body, headers=headers
            )
            assert r.status_code in (201, 400, 409, 413), r.text
            assert r.status_code == 201 or r.json()["detail"]

        upload()
        assert http.get("/healthz").status_code == 200


def test_a_payload_over_the_gateways_limit_is_refused_not_chunked(
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
    unique_topic: Callable[[str], str],
) -> None:
    broker = mosquitto_factory(max_packet_size=262144)
    gw = gateway_factory(broker, max_body_bytes=1 * MiB)
    with Client(broker.url, endpoint=gw.url) as writer, pytest.raises(UploadError) as refused:
        writer.publish(unique_topic("limit"), bytes(2 * MiB), qos=1)
    assert refused.value.status == 413
    assert "exceeds the limit of 1048576 bytes" in str(refused.value)
