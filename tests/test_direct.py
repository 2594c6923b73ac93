"""Direct transfers: payload bytes between clients and SeaweedFS, the gateway only signs.

Real SeaweedFS (the session fixture), the real gateway under uvicorn, real mosquitto, the
real client; the store is reached through a recording TCP relay on loopback where a test
must see what the store receives (credentials must never arrive there).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from minio import Minio

from client import Client, FetchError, Message, MessageError, PayloadChecksumMismatch
from client.http._transport import HttpTransport
from client.protocol import MessageId, Placeholder

from _gateway import GatewayServer
from _hostile import accept_each
from _servers import Mosquitto, SeaweedFS, free_port

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
ACL = "user writer\ntopic readwrite direct/#\n"
WRITER = ("writer", "w-secret")


def _hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _received_bytes(gw: GatewayServer) -> tuple[float, float]:
    """Request and response body bytes the gateway process has counted (its /metrics)."""
    text = httpx.get(gw.metrics_url).text
    totals = {"offload_http_received_bytes_total": 0.0, "offload_http_sent_bytes_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals["offload_http_received_bytes_total"], totals["offload_http_sent_bytes_total"]


class RecordingRelay:
    """A TCP relay on loopback in front of the store that keeps what clients sent it.

    Bytes pass unchanged (the Host header too, so SigV4 signatures made for the relay's
    address hold at the store); up to 64 MiB of what clients send is kept, and
    `requests()` finds every request head in it (keep-alive connections carry several).
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._streams: list[bytearray] = []
        self._lock = threading.Lock()
        accept_each(self.sock, self._relay)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _relay(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        stream = bytearray()
        with self._lock:
            self._streams.append(stream)

        def keep(data: bytes) -> None:
            with self._lock:
                if len(stream) < 64 * MiB:
                    stream.extend(data)

        threading.Thread(target=_pump, args=(upstream, conn, None), daemon=True).start()
        _pump(conn, upstream, keep)

    def requests(self) -> list[bytes]:
        """Every request head (request line and headers) clients sent through the relay."""
        with self._lock:
            streams = [bytes(s) for s in self._streams]
        return [m.group(0) for s in streams for m in _HEAD.finditer(s)]

    def close(self) -> None:
        self.sock.close()


_HEAD = re.compile(rb"(?:GET|PUT|HEAD|POST|DELETE) /[^ \r\n]* HTTP/1\.1\r\n.*?\r\n\r\n", re.DOTALL)


def _pump(src: socket.socket, dst: socket.socket, keep: Callable[[bytes], None] | None) -> None:
    try:
        while data := src.recv(65536):
            if keep is not None:
                keep(data)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def relay(seaweed: SeaweedFS) -> Iterator[RecordingRelay]:
    r = RecordingRelay(seaweed.s3_port)
    yield r
    r.close()


@pytest.fixture
def auth_files() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="offload-direct-"))
    passwd = path / "passwd"
    args = ["mosquitto_passwd", "-c", "-b", "-H", "sha512-pbkdf2", "-I", "1000"]
    subprocess.run([*args, str(passwd), *WRITER], check=True, capture_output=True)
    (path / "acl").write_text(ACL)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def direct_gateway(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    relay: RecordingRelay,
    auth_files: Path,
) -> GatewayServer:
    """A gateway requiring credentials, advertising direct transfers via the relay."""
    return gateway_factory(
        broker,
        s3_public_url=relay.url,
        password_file=auth_files / "passwd",
        acl_file=auth_files / "acl",
        tls=True,  # "behind an HTTPS proxy": Basic credentials are accepted
        auth_secret="replicas-share-this",
    )


@pytest.fixture
def store(seaweed: SeaweedFS, bucket_name: str) -> Minio:
    return Minio(
        seaweed.endpoint,
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
        secure=False,
    )


def _client(broker: Mosquitto, **kw: object) -> Client:
    kw.setdefault("discovery_wait", 10.0)
    c = Client(broker.url, http_auth=httpx.BasicAuth(*WRITER), **kw)  # type: ignore[arg-type]
    c.connect()
    return c


def _objects(store: Minio, bucket: str) -> list[str]:
    return [
        o.object_name
        for o in store.list_objects(bucket, recursive=True)
        # not the store's probes, nor the payloads' records (tests/test_lifecycle_*.py)
        if o.object_name and not o.object_name.startswith(("probes/", "blobs/", "accounts/"))
    ]


def test_direct_publish_bytes_skip_the_gateway_and_carry_no_credentials(
    direct_gateway: GatewayServer, broker: Mosquitto, relay: RecordingRelay, unique_topic: Any
) -> None:
    topic = unique_topic("direct")
    # A cookie in the shared jar: httpx would send it to every port of 127.0.0.1.
    jar = httpx.Client(cookies={"session": "gateway-cookie"}, timeout=30)
    sub = _client(broker, transport=HttpTransport(client=jar))
    pub = _client(broker, transport=HttpTransport(client=jar))
    try:
        sub.subscribe(topic)
        assert pub.wait_for_endpoint(10) == direct_gateway.url
        record = pub.discovery_record
        assert record is not None and record.direct_store == f"{relay.url}"
        payload = os.urandom(13 * MiB)  # two parts: 8 MiB and 5 MiB
        before_in, before_out = _received_bytes(direct_gateway)
        result = pub.publish(topic, payload, qos=1)
        assert result.message_id is not None
        msg = next(sub.messages(timeout=60))
        assert isinstance(msg, Message), msg
        assert msg.payload == payload
        after_in, after_out = _received_bytes(direct_gateway)
        # Through the proxy the gateway would have counted 13 MiB in and 13 MiB out.
        assert after_in - before_in < MiB, after_in - before_in
        assert after_out - before_out < MiB, after_out - before_out
    finally:
        pub.close()
        sub.close()
        jar.close()
    sent = relay.requests()
    methods = sorted({head.split(b" ", 1)[0] for head in sent})
    assert methods == [b"GET", b"PUT"], methods  # parts went up, the payload came down here
    for head in sent:
        headers = head.lower()
        assert b"authorization:" not in headers
        assert b"cookie:" not in headers
        assert b"gateway-cookie" not in headers


def _grant(
    gw: GatewayServer, topic: str, size: int, sha256: str, parts: list[str], **extra: object
) -> httpx.Response:
    body = {"size": size, "sha256": sha256, "part_size": 8 * MiB, "parts": parts, **extra}
    return httpx.post(f"{gw.url}/direct/grant/{topic}", json=body, auth=WRITER)


def _commit(gw: GatewayServer, grant: str, etags: list[str]) -> httpx.Response:
    return httpx.post(f"{gw.url}/direct/commit", json={"grant": grant, "etags": etags}, auth=WRITER)


def test_objects_that_do_not_match_their_grant_are_refused_and_removed(
    direct_gateway: GatewayServer,
    broker: Mosquitto,
    store: Minio,
    bucket_name: str,
    unique_topic: Any,
) -> None:
    topic = unique_topic("direct")
    sub = _client(broker)
    try:
        sub.subscribe(topic)
        # Wrong content on a single PUT: the store itself refuses it (the checksum is signed).
        small = b"the bytes the grant was made for"
        msg_id = str(uuid.uuid4())
        r = _grant(direct_gateway, topic, len(small), _hex(small), [_hex(small)], id=msg_id)
        assert r.status_code == 201, r.text
        [url] = r.json()["urls"]
        forged = httpx.put(url, content=b"other bytes of the very same size!"[: len(small)])
        assert forged.status_code == 400 and b"BadDigest" in forged.content
        refused = _commit(direct_gateway, r.json()["grant"], [])
        assert refused.status_code == 400 and "no object" in refused.json()["detail"]
        assert httpx.get(f"{direct_gateway.url}/msg/{msg_id}", auth=WRITER).status_code == 404

        # Wrong size: parts that match their own hashes but not the size granted.
        first, short = os.urandom(8 * MiB), os.urandom(MiB)
        declared = 12 * MiB
        r = _grant(direct_gateway, topic, declared, _hex(first + short), [_hex(first), _hex(short)])
        assert r.status_code == 201, r.text
        urls = r.json()["urls"]
        pairs = zip(urls, (first, short), strict=True)
        etags = [httpx.put(u, content=d).headers["ETag"] for u, d in pairs]
        refused = _commit(direct_gateway, r.json()["grant"], etags)
        assert refused.status_code == 400, refused.text
        assert f"the grant {declared}" in refused.json()["detail"]

        # A part replaced by other bytes: refused by the store, then by the commit.
        a, b = os.urandom(8 * MiB), os.urandom(100)
        r = _grant(direct_gateway, topic, len(a + b), _hex(a + b), [_hex(a), _hex(b)])
        urls = r.json()["urls"]
        good = httpx.put(urls[0], content=a).headers["ETag"]
        assert httpx.put(urls[1], content=os.urandom(100)).status_code == 400
        refused = _commit(direct_gateway, r.json()["grant"], [good, good])
        assert refused.status_code == 400, refused.text

        # A grant altered by the client is no grant.
        token = r.json()["grant"]
        body, mac = token.split(".")
        claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        claims["s"] = 1
        forged_body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
        assert _commit(direct_gateway, f"{forged_body}.{mac}", []).status_code == 403

        assert _objects(store, bucket_name) == []  # nothing kept, nothing half-kept
        assert list(sub.messages(timeout=1.0)) == []  # and nothing was published
    finally:
        sub.close()


def test_grant_requests_are_checked(direct_gateway: GatewayServer, unique_topic: Any) -> None:
    topic = unique_topic("direct")
    h = _hex(b"x")
    gw = direct_gateway
    bad = [
        _grant(gw, topic, 1, h, [h, h]),  # two hashes for one part
        _grant(gw, topic, 20 * MiB, h, [h, h, h], part_size=MiB),  # parts under 5 MiB
        _grant(gw, topic, 1, "A" * 64, ["A" * 64]),  # not lowercase hex
        _grant(gw, topic, 1, h, [_hex(b"y")]),  # one part must be the payload
        _grant(gw, topic, -1, h, [h]),
        httpx.post(f"{gw.url}/direct/grant/{topic}", content=b"[" * 100_000, auth=WRITER),
        httpx.post(f"{gw.url}/direct/commit", content=b"{", auth=WRITER),
        httpx.post(f"{gw.url}/direct/commit", json={"grant": "x" * 5000}, auth=WRITER),
    ]
    assert [r.status_code for r in bad] == [400] * 5 + [400, 400, 403], [r.text for r in bad]
    assert _grant(gw, topic, 6 * 1024**3, h, [h] * 768).status_code == 413
    assert _grant(gw, "other/topic", 1, h, [h]).status_code == 403  # the ACL still holds
    anonymous = httpx.post(f"{gw.url}/direct/grant/{topic}", json={})
    assert anonymous.status_code == 401


def test_expired_grants_and_presigned_urls_are_refused(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    relay: RecordingRelay,
    store: Minio,
    bucket_name: str,
) -> None:
    # SigV4 dates have whole seconds: a URL signed at x.9 s with a 1 s expiry lasts 0.1 s.
    gw = gateway_factory(broker, s3_public_url=relay.url, direct_grant_ttl=3)
    a, b = os.urandom(5 * MiB), b"tail"
    body = {"size": len(a + b), "sha256": _hex(a + b), "part_size": 5 * MiB}
    r = httpx.post(f"{gw.url}/direct/grant/direct/x", json={**body, "parts": [_hex(a), _hex(b)]})
    assert r.status_code == 201, r.text
    urls, token = r.json()["urls"], r.json()["grant"]
    etag = httpx.put(urls[0], content=a).headers["ETag"]  # in time
    time.sleep(4.2)
    late = httpx.put(urls[1], content=b)
    assert late.status_code == 403 and b"expired" in late.content.lower()
    refused = httpx.post(f"{gw.url}/direct/commit", json={"grant": token, "etags": [etag, etag]})
    assert refused.status_code == 403 and "expired" in refused.json()["detail"]
    assert _objects(store, bucket_name) == []


def test_downloads_redirect_to_the_store_and_keep_head_range_etag(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    relay: RecordingRelay,
    unique_topic: Any,
) -> None:
    gw = gateway_factory(broker, s3_public_url=relay.url)
    payload = os.urandom(300_000)
    msg_id = str(uuid.uuid4())
    topic = unique_topic("direct")
    # curl's raw publish still goes through the gateway, unchanged.
    r = httpx.post(f"{gw.url}/publish/{topic}", content=payload, params={"qos": 0})
    assert r.status_code == 201, r.text
    msg_id = r.json()["id"]
    url = f"{gw.url}/msg/{msg_id}/payload"

    moved = httpx.get(url)
    assert moved.status_code == 307
    location = moved.headers["Location"]
    assert location.startswith(f"{relay.url}/")
    ranged = httpx.get(location, headers={"Range": "bytes=100-199"})
    assert ranged.status_code == 206 and ranged.content == payload[100:200]
    assert httpx.get(url, follow_redirects=True).content == payload

    head = httpx.head(url)  # answered by the gateway itself
    assert head.status_code == 200 and head.headers["Content-Length"] == str(len(payload))
    etag = head.headers["ETag"]
    assert httpx.get(url, headers={"If-None-Match": etag}).status_code == 304

    # hop-client's BSON download is never redirected.
    bson_doc = httpx.get(f"{gw.url}/msg/{msg_id}")
    assert bson_doc.status_code == 200 and payload in bson_doc.content

    # A page uploaded as HTML is no page at the store either: it comes as an attachment.
    r = httpx.post(
        f"{gw.url}/publish/{topic}",
        content=b"<script>alert(1)</script>",
        headers={"Content-Type": "text/html"},
        params={"qos": 0},
    )
    assert r.status_code == 201, r.text
    page = httpx.get(f"{gw.url}/msg/{r.json()['id']}/payload", follow_redirects=True)
    assert page.status_code == 200 and page.url.port == relay.port
    assert page.headers["Content-Disposition"] == "attachment", page.headers

    # curl -L follows the redirect; Range goes along.
    curl = subprocess.run(
        ["curl", "-sS", "-L", "-r", "0-9", url], capture_output=True, check=True, timeout=30
    )
    assert curl.stdout == payload[:10]


def test_old_gateway_falls_back_to_the_proxied_upload(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    seaweed: SeaweedFS,
    unique_topic: Any,
) -> None:
    """A record that advertises a store, a gateway without direct transfers: 404, then proxy."""
    gw = gateway_factory(None)  # no broker: it advertises nothing itself
    topic = unique_topic("direct")
    record = {"LargeMessageUploadEndpoint": gw.url, "DirectStore": f"http://{seaweed.endpoint}"}
    sub = Client(broker.url, endpoint=gw.url)
    sub.connect()
    pub = Client(broker.url, discovery_wait=10.0, discovery_topic=f"{topic}/meta")
    pub.connect()
    try:
        pub.connection.publish(f"{topic}/meta", json.dumps(record).encode(), qos=1, retain=True)
        assert pub.wait_for_endpoint(10) == gw.url
        assert pub.discovery_record is not None and pub.discovery_record.direct_store
        sub.subscribe(topic)
        payload = os.urandom(400_000)
        pub.publish(topic, payload, qos=1)
        msg = next(sub.messages(timeout=30))
        assert isinstance(msg, Message) and msg.payload == payload
    finally:
        pub.connection.publish(f"{topic}/meta", b"", qos=1, retain=True).result(10)
        pub.close()
        sub.close()


def test_cli_publish_goes_direct(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    relay: RecordingRelay,
    unique_topic: Any,
    tmp_path: Path,
) -> None:
    gw = gateway_factory(broker, s3_public_url=relay.url)
    topic = unique_topic("direct")
    source = tmp_path / "payload.bin"
    payload = os.urandom(9 * MiB)
    source.write_bytes(payload)
    sub = Client(broker.url, discovery_wait=10.0)
    sub.connect()
    try:
        sub.subscribe(topic)
        before, _ = _received_bytes(gw)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
        env["OFFLOAD_CONFIG"] = os.devnull
        offload = shutil.which("offload") or "offload"
        args = ["publish", "--broker", broker.url, "--topic", topic, "--file", str(source)]
        done = subprocess.run(
            [offload, *args], capture_output=True, text=True, timeout=120, env=env
        )
        assert done.returncode == 0, done.stderr
        msg = next(sub.messages(timeout=60))
        assert isinstance(msg, Message) and msg.payload == payload
        after, _ = _received_bytes(gw)
        assert after - before < MiB  # the 9 MiB went to the store, not through the gateway
        # `offload fetch` follows the payload redirect to the store (with and without --sha256).
        out = tmp_path / "fetched.bin"
        url = f"{gw.url}/msg/{msg.message_id}"
        fetched = subprocess.run(
            [offload, "fetch", url, "-o", str(out)], capture_output=True, timeout=60, env=env
        )
        assert fetched.returncode == 0, fetched.stderr
        assert out.read_bytes() == payload
        checked = subprocess.run(
            [offload, "fetch", url, "--sha256", _hex(payload)], capture_output=True, env=env
        )
        assert checked.returncode == 0 and checked.stdout == payload, checked.stderr
    finally:
        sub.close()
    heads = relay.requests()
    assert any(head.startswith(b"PUT ") for head in heads)
    assert sum(head.startswith(b"GET ") for head in heads) >= 2


def test_a_grant_commits_on_any_replica_with_the_secret(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    relay: RecordingRelay,
) -> None:
    def replica(secret: str) -> GatewayServer:
        return gateway_factory(broker, s3_public_url=relay.url, auth_secret=secret)

    granting, committing, stranger = replica("shared"), replica("shared"), replica("other")
    a, b = os.urandom(5 * MiB), os.urandom(1000)
    body = {"size": len(a + b), "sha256": _hex(a + b), "part_size": 5 * MiB}
    r = httpx.post(
        f"{granting.url}/direct/grant/direct/replicas", json={**body, "parts": [_hex(a), _hex(b)]}
    )
    assert r.status_code == 201, r.text
    pairs = zip(r.json()["urls"], (a, b), strict=True)
    etags = [httpx.put(u, content=d).headers["ETag"] for u, d in pairs]
    commit = {"grant": r.json()["grant"], "etags": etags}
    assert httpx.post(f"{stranger.url}/direct/commit", json=commit).status_code == 403
    done = httpx.post(f"{committing.url}/direct/commit", json=commit)
    assert done.status_code == 201, done.text
    assert done.json()["size"] == len(a + b) and done.json()["sha256"] == _hex(a + b)
    fetched = httpx.get(f"{granting.url}/msg/{done.json()['id']}/payload", follow_redirects=True)
    assert fetched.content == a + b
    # The same commit again (its answer lost, say) is the same message, not a second one.
    again = httpx.post(f"{granting.url}/direct/commit", json=commit)
    assert again.status_code == 201 and again.json()["id"] == done.json()["id"]


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Records each request; `redirect_to` set: answers 307 there, else 200 `payload`."""

    seen: ClassVar[list[str]] = []
    redirect_to: ClassVar[str | None] = None
    payload: ClassVar[bytes] = b""

    def do_GET(self) -> None:
        type(self).seen.append(self.path)
        if self.redirect_to is not None:
            self.send_response(307)
            self.send_header("Location", f"{self.redirect_to}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.payload)))
        self.end_headers()
        self.wfile.write(self.payload)

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type[_Recorder]) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_redirect_to_an_unadvertised_origin_is_refused(
    broker: Mosquitto, unique_topic: Any
) -> None:
    """A gateway (or whoever answers for it) must not steer subscribers into the network."""

    class Inside(_Recorder):
        seen: ClassVar[list[str]] = []
        payload = b"an internal service's secrets"

    class Hostile(_Recorder):
        seen: ClassVar[list[str]] = []

    inside, hostile = _serve(Inside), _serve(Hostile)
    Hostile.redirect_to = f"http://127.0.0.1:{inside.server_address[1]}"
    endpoint = f"http://127.0.0.1:{hostile.server_address[1]}"
    topic = unique_topic("direct")
    mid = MessageId.new()
    data = Inside.payload
    ref = Placeholder(f"{endpoint}/msg/{mid}", len(data), _hex(data), mid)
    body, props = ref.encode(None)
    sub = Client(broker.url, endpoint=endpoint, http_auth=httpx.BasicAuth(*WRITER))
    sub.connect()
    try:
        sub.subscribe(topic)
        sub.connection.publish(topic, body, qos=1, properties=props).result(10)
        err = sub.next_message(30)
    finally:
        sub.close()
        inside.shutdown()
        hostile.shutdown()
    assert isinstance(err, MessageError) and isinstance(err.error, FetchError), err
    assert "redirect to" in str(err.error) and "refused" in str(err.error)
    # The configured gateway's own record (`GET /`) was asked for the store it declares.
    assert Hostile.seen == [f"/msg/{mid}/payload", "/"]
    assert Inside.seen == []  # never contacted


def test_direct_operations_never_5xx_and_conform(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto, relay: RecordingRelay
) -> None:
    """Schemathesis on the direct-transfer operations of a gateway that offers them."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis import checks

    gw = gateway_factory(broker, s3_public_url=relay.url, max_body_bytes=64 * MiB)
    schema = schemathesis.openapi.from_url(f"{gw.url}/openapi.json")
    operations = [
        result.ok()  # type: ignore[union-attr]
        for result in schema.get_all_operations()
        if result.ok().path.startswith(("/direct/", "/msg/{message_id}/payload"))  # type: ignore[union-attr]
    ]
    assert len(operations) == 4, [op.label for op in operations]
    failures: dict[str, BaseException] = {}
    for operation in operations:

        @settings(
            max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(case=operation.as_strategy())
        def run(case: schemathesis.Case) -> None:  # type: ignore[type-arg]
            case.call_and_validate(
                base_url=gw.url,
                checks=[checks.not_a_server_error, checks.status_code_conformance],
                timeout=30,
            )

        try:
            run()
        except Exception as exc:
            failures[operation.label] = exc
    assert not failures, "\n\n".join(f"{label}: {exc}" for label, exc in failures.items())


def test_a_false_whole_payload_sha256_is_caught(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    relay: RecordingRelay,
    store: Minio,
    bucket_name: str,
    unique_topic: Any,
) -> None:
    """Parts true to their hashes, the whole-payload SHA-256 false (a lying producer).

    By default the gateway records the producer's statement and every consumer refuses the
    payload; with OFFLOAD_DIRECT_VERIFY_SHA256 the gateway reads it back and refuses it.
    """
    a, b = os.urandom(5 * MiB), os.urandom(1000)
    lie = _hex(b"not these bytes")
    body = {"size": len(a + b), "sha256": lie, "part_size": 5 * MiB}

    def upload(gw: GatewayServer) -> httpx.Response:
        r = httpx.post(
            f"{gw.url}/direct/grant/direct/lie", json={**body, "parts": [_hex(a), _hex(b)]}
        )
        assert r.status_code == 201, r.text
        pairs = zip(r.json()["urls"], (a, b), strict=True)
        etags = [httpx.put(u, content=d).headers["ETag"] for u, d in pairs]
        return httpx.post(
            f"{gw.url}/direct/commit", json={"grant": r.json()["grant"], "etags": etags}
        )

    strict = gateway_factory(broker, s3_public_url=relay.url, direct_verify_sha256=True)
    refused = upload(strict)
    assert refused.status_code == 400 and "hashes to" in refused.json()["detail"]
    assert _objects(store, bucket_name) == []
    strict.stop()  # the record on the broker is the next gateway's alone

    trusting = gateway_factory(broker, s3_public_url=relay.url)
    stored = upload(trusting)
    assert stored.status_code == 201, stored.text
    topic = unique_topic("direct")
    mid = MessageId.parse(stored.json()["id"])
    ref = Placeholder(stored.json()["url"], len(a + b), lie, mid)
    placeholder, props = ref.encode(None)
    sub = _client(broker)
    try:
        sub.subscribe(topic)
        sub.connection.publish(topic, placeholder, qos=1, properties=props).result(10)
        err = sub.next_message(30)
    finally:
        sub.close()
    assert isinstance(err, MessageError) and isinstance(err.error, PayloadChecksumMismatch)


def test_a_store_out_of_the_clients_reach_falls_back_to_the_proxy(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    store: Minio,
    bucket_name: str,
    unique_topic: Any,
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    gw = gateway_factory(broker, s3_public_url=nobody, redirect_downloads=False)
    topic = unique_topic("direct")
    sub = _client(broker)
    pub = Client(broker.url, discovery_wait=10.0)
    pub.connect()
    try:
        assert pub.wait_for_endpoint(10) == gw.url
        sub.subscribe(topic)
        payload = os.urandom(9 * MiB)  # two parts: the grant opens a multipart upload
        before, _ = _received_bytes(gw)
        pub.publish(topic, payload, qos=1)
        msg = next(sub.messages(timeout=60))
        assert isinstance(msg, Message) and msg.payload == payload
        after, _ = _received_bytes(gw)
        assert after - before >= len(payload)  # it went through the gateway
    finally:
        pub.close()
        sub.close()
    assert len(_objects(store, bucket_name)) == 3  # payload, sidecar, index: no leftovers


def test_a_fetch_error_after_a_redirect_never_names_the_presigned_url(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    relay: RecordingRelay,
    unique_topic: Any,
) -> None:
    """A placeholder whose size is off by one for a stored message: the fetch is refused at
    the store's Content-Length, and its error named the presigned store URL, signature and
    all (valid for OFFLOAD_REDIRECT_TTL), in every MessageError, log and CLI error line."""
    gw = gateway_factory(broker, s3_public_url=relay.url)
    topic = unique_topic("direct")
    data = os.urandom(2 * MiB)  # over the broker's limit: offloaded, through the store
    sub = _client(broker)
    try:
        sub.subscribe(topic)
        sent = sub.publish(f"{topic}/real", data, qos=1)
        assert sent.url is not None and sent.message_id is not None
        assert httpx.get(f"{sent.url}/payload").status_code == 307  # the store serves it
        wrong = [len(data) - 1, len(data) + 1]
        for size in wrong:
            body, props = Placeholder(sent.url, size, _hex(data), sent.message_id).encode(None)
            sub.connection.publish(topic, body, qos=1, properties=props).result(10)
        errors = [sub.next_message(30) for _ in wrong]
    finally:
        sub.close()
        gw.stop()
    for err in errors:
        assert isinstance(err, MessageError), err
        text = str(err.error)
        assert "differs from the declared size" in text, text
        assert text.startswith(f"{sent.url}/payload: "), text
        assert "X-Amz-Signature" not in text and relay.url not in text, text


def test_encrypted_payloads_go_direct_as_ciphertext_and_spool_both_ways(
    direct_gateway: GatewayServer,
    broker: Mosquitto,
    relay: RecordingRelay,
    unique_topic: Any,
    tmp_path: Path,
) -> None:
    """Issue 30: an encrypted payload takes the direct path unchanged, and no byte a client
    sent the store holds the plaintext. Above spool_threshold the publisher seals into a
    file (removed after) and the subscriber decrypts into one."""
    from client.protocol._age_keys import Identity

    topic = unique_topic("direct")
    identity = Identity.generate()
    key = tmp_path / "key.txt"
    key.write_text(f"{identity}\n")
    marker = b"DIRECT-PLAINTEXT-MARKER-51c2"
    payload = (marker + os.urandom(1000)) * 9000  # ~9 MiB: two parts, marker throughout
    spool = tmp_path / "spool"
    spool.mkdir()
    sub = _client(broker, identity_files=(str(key),), spool_threshold=MiB, spool_dir=str(spool))
    pub = _client(
        broker,
        encrypt_to={topic: [str(identity.recipient)]},
        spool_threshold=MiB,
        spool_dir=str(spool),
    )
    try:
        sub.subscribe(topic)
        assert pub.wait_for_endpoint(10) == direct_gateway.url
        before_in, _ = _received_bytes(direct_gateway)
        result = pub.publish(topic, payload, qos=1)
        msg = next(sub.messages(timeout=60))
        assert isinstance(msg, Message), msg
        assert msg.body.path is not None and msg.body.path.parent == spool  # decrypted to disk
        assert msg.payload == payload and msg.sha256 == result.sha256
        after_in, _ = _received_bytes(direct_gateway)
        assert after_in - before_in < MiB  # the ciphertext went straight to the store
    finally:
        pub.close()
        sub.close()
    with relay._lock:
        streams = [bytes(s) for s in relay._streams]
    assert sum(len(s) for s in streams) > len(payload)  # the bytes did cross the relay
    assert not [s for s in streams if marker in s]
    assert not [p for p in spool.iterdir() if p != msg.body.path]  # the seal spool is gone
