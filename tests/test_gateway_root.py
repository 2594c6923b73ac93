"""`GET /` serves the discovery record, and a client configured with `endpoint` uses it.

Issue 26 item 2: a subscriber told its gateway by `endpoint` (no discovery topic) refused the
gateway's redirect to its own store, because only discovery told it where the store is. The
gateway now answers `GET /` with the record it advertises (issue 27 item 9: the root was a
bare 404), and the client reads it once when a redirect to an origin it does not know arrives.
Real gateway, SeaweedFS and mosquitto; the redirect is the gateway's own (`s3_public_url`).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import httpx
import pytest

from client import Client, FetchError, Message, MessageError
from client.protocol import DiscoveryRecord, MessageId, Placeholder

from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers


@pytest.fixture
def direct_gw(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto, seaweed: SeaweedFS
) -> GatewayServer:
    """A gateway that redirects payload downloads to SeaweedFS (and advertises it)."""
    return gateway_factory(broker, s3_public_url=f"http://{seaweed.endpoint}")


def test_the_root_is_the_advertised_record_with_links(
    direct_gw: GatewayServer, broker: Mosquitto, seaweed: SeaweedFS
) -> None:
    root = httpx.get(f"{direct_gw.url}/")
    assert root.status_code == 200, root.text
    doc = root.json()
    # The same record, by the same function, as the retained one on the discovery topic.
    with Client(broker.url, discovery_wait=10.0) as watcher:
        assert watcher.wait_for_endpoint(20) == direct_gw.url
        advertised = watcher.discovery_record
    assert DiscoveryRecord.from_json(root.content) == advertised
    assert advertised is not None and advertised.direct_store == f"http://{seaweed.endpoint}"
    assert doc["DirectStore"] == f"http://{seaweed.endpoint}"
    assert doc["links"] == {
        "docs": f"{direct_gw.url}/docs",
        "openapi": f"{direct_gw.url}/openapi.json",
        "health": f"{direct_gw.url}/healthz",
    }
    for link in doc["links"].values():
        assert httpx.get(link).status_code == 200, link
    assert "/" in httpx.get(f"{direct_gw.url}/openapi.json").json()["paths"]


def test_a_configured_endpoint_follows_its_gateways_redirect_to_the_store(
    direct_gw: GatewayServer, broker: Mosquitto, unique_topic: Any
) -> None:
    topic = unique_topic("root")
    payload = os.urandom(300_000)
    assert httpx.get(f"{direct_gw.url}/msg/{MessageId.new()}/payload").status_code == 404
    sub = Client(broker.url, endpoint=direct_gw.url)
    sub.connect()
    try:
        sub.subscribe(topic)
        sent = httpx.post(f"{direct_gw.url}/publish/{topic}", content=payload, params={"qos": 1})
        assert sent.status_code == 201, sent.text
        # The gateway answers the payload URL with a redirect to the store: the case.
        moved = httpx.get(f"{direct_gw.url}/msg/{sent.json()['id']}/payload")
        assert moved.status_code == 307
        got = sub.next_message(60)
    finally:
        sub.close()
    assert isinstance(got, Message), got
    assert got.payload == payload
    assert got.sha256 == hashlib.sha256(payload).hexdigest()


class _Gateway(http.server.BaseHTTPRequestHandler):
    """A stand-in gateway: its root declares `store`; payloads redirect to `redirect_to`."""

    store: ClassVar[str] = ""
    redirect_to: ClassVar[str] = ""
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.path)
        if self.path == "/":
            body = json.dumps({
                "LargeMessageUploadEndpoint": f"http://127.0.0.1:{self.server.server_address[1]}",
                "DirectStore": self.store,
            }).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(307)
        self.send_header("Location", f"{self.redirect_to}{self.path}")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[tuple[type[_Gateway], str]]:
    class Gateway(_Gateway):
        seen: ClassVar[list[str]] = []

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Gateway, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_redirect_to_a_store_the_gateway_did_not_declare_is_refused(
    stand_in: tuple[type[_Gateway], str], broker: Mosquitto, unique_topic: Any
) -> None:
    """Trust is never widened: only the origin the configured gateway declared is followed."""
    handler, endpoint = stand_in
    handler.store = "http://127.0.0.1:9"  # declared: not where the redirects lead
    handler.redirect_to = "http://127.0.0.2:9"
    topic = unique_topic("root")
    data = b"never fetched"
    errors = []
    with Client(broker.url, endpoint=endpoint) as sub:
        sub.subscribe(topic)
        for _ in range(2):
            mid = MessageId.new()
            ref = Placeholder(
                f"{endpoint}/msg/{mid}", len(data), hashlib.sha256(data).hexdigest(), mid
            )
            body, props = ref.encode(None)
            sub.connection.publish(topic, body, qos=1, properties=props).result(10)
            errors.append(sub.next_message(30))
    for err in errors:
        assert isinstance(err, MessageError) and isinstance(err.error, FetchError), err
        assert "redirect to http://127.0.0.2:9 refused" in str(err.error)
    # The record was read once, then kept; each payload was asked for once.
    assert handler.seen.count("/") == 1
    assert len(handler.seen) == 3


class _TricklingRoot(_Gateway):
    """Its root answer trickles in, a byte every `interval`: in its head, or in its body."""

    where: ClassVar[str] = "body"
    interval: ClassVar[float] = 0.5
    release: ClassVar[threading.Event]

    def do_GET(self) -> None:
        if self.path != "/":
            super().do_GET()
            return
        type(self).seen.append(self.path)
        try:
            if self.where == "head":
                self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            else:
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n{")
            while not self.release.wait(self.interval):
                self.wfile.write(b" ")
                self.wfile.flush()
        except OSError:
            pass  # the client hung up
        self.close_connection = True


@pytest.mark.parametrize("where", ["head", "body"])
def test_a_root_that_trickles_in_cannot_hold_the_fetch(
    where: str, broker: Mosquitto, unique_topic: Any
) -> None:
    """The record is read inside a fetch and under the lock every redirected fetch waits on;
    an answer that never finished (a byte every 0.5 s) held them all past fetch_deadline."""

    class Root(_TricklingRoot):
        seen: ClassVar[list[str]] = []
        release = threading.Event()

    Root.where = where
    Root.redirect_to = "http://127.0.0.2:9"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Root)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    topic = unique_topic("root")
    data = b"never fetched"
    mid = MessageId.new()
    ref = Placeholder(f"{endpoint}/msg/{mid}", len(data), hashlib.sha256(data).hexdigest(), mid)
    try:
        with Client(
            broker.url, endpoint=endpoint, fetch_deadline=1.0, fetch_min_rate=1_000_000
        ) as sub:
            sub.subscribe(topic)
            body, props = ref.encode(None)
            sub.connection.publish(topic, body, qos=1, properties=props).result(10)
            err = sub.next_message(60)
    finally:
        Root.release.set()
        server.shutdown()
        server.server_close()
    assert isinstance(err, MessageError) and isinstance(err.error, FetchError), err
    assert err.message_id == str(mid), err
    assert Root.seen == [f"/msg/{mid}/payload", "/"]
