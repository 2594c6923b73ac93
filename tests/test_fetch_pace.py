"""A slow origin cannot starve the other topics (issue 26 item 4).

A placeholder may point at any allow-listed origin, and an origin that sends one byte now
and then kept every per-read timeout happy and a fetch thread busy for ever: four of them
filled the pool, and with `max_pending_deliveries` full behind one of them the whole client
stopped. Now a fetch has a pace (`fetch_deadline`, then `fetch_min_rate`) and one origin
holds at most `fetch_per_origin` fetch threads. Against a real trickling HTTP server, the
real gateway on SeaweedFS and mosquitto; every wait is for a state.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import httpx
import pytest

from client import Client, FetchError, Message, MessageError
from client.protocol import MessageId, Placeholder

from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

SLOW_SIZE = 1000
OFFLOAD = shutil.which("offload") or "offload"


class _Trickle(http.server.BaseHTTPRequestHandler):
    """Announces SLOW_SIZE bytes, then sends one byte per `interval` until released or cut."""

    interval: ClassVar[float] = 0.5
    closing: ClassVar[bool] = False  # the answer says `Connection: close`
    release: ClassVar[threading.Event]
    state: ClassVar[threading.Condition]
    active: ClassVar[int] = 0
    cut: ClassVar[int] = 0  # requests the client hung up on
    paths: ClassVar[list[str]] = []
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        cls = type(self)
        with cls.state:
            cls.active += 1
            cls.paths.append(self.path)
            cls.state.notify_all()
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(SLOW_SIZE))
            if cls.closing:
                self.send_header("Connection", "close")
            self.end_headers()
            for _ in range(SLOW_SIZE - 1):  # never the whole body
                self.wfile.write(b"x")
                self.wfile.flush()
                if cls.release.wait(cls.interval):
                    break
        except OSError:
            with cls.state:
                cls.cut += 1
        finally:
            self.close_connection = True
            with cls.state:
                cls.active -= 1
                cls.state.notify_all()

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _serving(base: type[_Trickle]) -> Iterator[tuple[type[_Trickle], str]]:
    """A slow origin of `base`'s kind with state of its own: the handler class, its URL."""

    class Handler(base):  # type: ignore[valid-type,misc]
        release = threading.Event()
        state = threading.Condition()
        active = 0
        cut = 0
        paths: ClassVar[list[str]] = []

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Handler, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        Handler.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def trickle() -> Iterator[tuple[type[_Trickle], str]]:
    with _serving(_Trickle) as served:
        yield served


def _wait(handler: type[_Trickle], predicate: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    with handler.state:
        while not predicate():
            left = deadline - time.monotonic()
            assert left > 0, f"active={handler.active} cut={handler.cut}"
            handler.state.wait(left)


def _slow_placeholder(client: Client, origin: str, topic: str, *, retain: bool = False) -> str:
    mid = MessageId.new()
    digest = hashlib.sha256(b"x" * SLOW_SIZE).hexdigest()
    body, props = Placeholder(f"{origin}/msg/{mid}", SLOW_SIZE, digest, mid).encode(None)
    client.connection.publish(topic, body, qos=1, retain=retain, properties=props).result(10)
    return str(mid)


def test_slow_placeholders_from_one_origin_leave_a_thread_for_other_topics(
    gateway: GatewayServer,
    broker: Mosquitto,
    trickle: tuple[type[_Trickle], str],
    unique_topic: Any,
) -> None:
    handler, origin = trickle
    slow_topic, fast_topic = unique_topic("slow"), unique_topic("fast")
    sub = Client(
        broker.url,
        endpoint=gateway.url,
        discovery_allowlist=(origin,),
        fetch_concurrency=4,
        fetch_deadline=3600.0,  # only the pool's per-origin limit is under test here
        fetch_retry_for=0.0,
    )
    sub.connect()
    try:
        sub.subscribe(f"{slow_topic}/#")
        sub.subscribe(fast_topic)
        slow = [_slow_placeholder(sub, origin, f"{slow_topic}/{i}") for i in range(4)]
        _wait(handler, lambda: handler.active == 3)  # three origin threads: the limit
        payload = os.urandom(200_000)
        sent = httpx.post(f"{gateway.url}/publish/{fast_topic}", content=payload, params={"qos": 1})
        assert sent.status_code == 201, sent.text
        got = sub.next_message(60)
        # Delivered while the slow fetches are still stuck on the origin, not after.
        with handler.state:
            assert handler.active == 3 and handler.cut == 0 and len(handler.paths) == 3
        assert isinstance(got, Message) and got.topic == fast_topic, got
        assert got.payload == payload
        handler.release.set()  # the origin hangs up: every slow fetch ends as an error
        errors = [sub.next_message(60) for _ in slow]
    finally:
        sub.close()
    assert sorted(e.message_id for e in errors if isinstance(e, MessageError)) == sorted(slow)
    assert all(isinstance(e, MessageError) and isinstance(e.error, FetchError) for e in errors)


def test_a_trickling_fetch_is_cut_off_and_the_client_goes_on(
    broker: Mosquitto, trickle: tuple[type[_Trickle], str], unique_topic: Any
) -> None:
    """One slow placeholder with 25 small messages behind it and 20 pending at most."""
    handler, origin = trickle
    topic, other = unique_topic("slow"), unique_topic("other")
    with Client(
        broker.url,
        discovery_allowlist=(origin,),
        max_pending_deliveries=20,
        fetch_deadline=1.0,
        fetch_min_rate=1_000_000,
    ) as sub:
        sub.subscribe(topic)
        sub.subscribe(other)
        stuck = _slow_placeholder(sub, origin, topic)
        for i in range(25):
            sub.connection.publish(topic, f"small {i}".encode(), qos=1).result(10)
        sub.connection.publish(other, b"elsewhere", qos=1).result(10)
        got: list[Message | MessageError] = []
        while len(got) < 27 and (item := sub.next_message(60)) is not None:
            got.append(item)
    assert len(got) == 27, got
    first = got[0]
    assert isinstance(first, MessageError) and first.message_id == stuck, first
    assert isinstance(first.error, FetchError) and "fetch_min_rate" in str(first.error)
    on_topic = [m for m in got[1:] if isinstance(m, Message) and m.topic == topic]
    assert [m.payload for m in on_topic] == [f"small {i}".encode() for i in range(25)]
    assert [m.payload for m in got if isinstance(m, Message) and m.topic == other] == [b"elsewhere"]
    _wait(handler, lambda: handler.cut == 1 and handler.active == 0)  # the client hung up


def test_subscribe_timeout_names_the_message_still_being_fetched(
    broker: Mosquitto, trickle: tuple[type[_Trickle], str], unique_topic: Any
) -> None:
    handler, origin = trickle
    topic = unique_topic("slow")
    with Client(broker.url, endpoint=origin) as pub:
        stuck = _slow_placeholder(pub, origin, topic, retain=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env |= {"OFFLOAD_CONFIG": os.devnull, "OFFLOAD_FETCH_DEADLINE": "3600"}
    proc = subprocess.Popen(
        [
            OFFLOAD,
            "subscribe",
            "--broker",
            broker.url,
            "--endpoint",
            origin,
            "--topic",
            topic,
            "--timeout",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    assert proc.returncode != 0, (out, err)
    assert stuck in out and "still being fetched" in out, (out, err)
    assert handler.paths == [f"/msg/{stuck}/payload"]


class _TrickleHead(_Trickle):
    """Sends its status line, then one byte of a header every `interval`: the head never ends."""

    def do_GET(self) -> None:
        cls = type(self)
        with cls.state:
            cls.active += 1
            cls.paths.append(self.path)
            cls.state.notify_all()
        try:
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            self.wfile.flush()
            while not cls.release.wait(cls.interval):
                self.wfile.write(b"x")
                self.wfile.flush()
        except OSError:
            with cls.state:
                cls.cut += 1
        finally:
            self.close_connection = True
            with cls.state:
                cls.active -= 1
                cls.state.notify_all()


def test_a_head_that_trickles_in_is_cut_off_like_a_body(
    broker: Mosquitto, unique_topic: Any
) -> None:
    """An origin that never finishes its headers kept every read under the per-read timeout,
    and the pace could not cut it off (it knew the socket only once the head was read)."""

    topic = unique_topic("slow-head")
    with (
        _serving(_TrickleHead) as (Head, origin),
        Client(
            broker.url,
            discovery_allowlist=(origin,),
            fetch_deadline=1.0,
            fetch_min_rate=1_000_000,
            fetch_retry_for=0.0,
            http_timeout=60.0,
        ) as sub,
    ):
        sub.subscribe(topic)
        stuck = _slow_placeholder(sub, origin, topic)
        sub.connection.publish(topic, b"after it", qos=1).result(10)
        first, second = sub.next_message(60), sub.next_message(60)
        _wait(Head, lambda: Head.cut == 1 and Head.active == 0)  # the client hung up
    assert isinstance(first, MessageError) and first.message_id == stuck, first
    assert isinstance(first.error, FetchError) and "fetch_min_rate" in str(first.error), first
    assert isinstance(second, Message) and second.payload == b"after it", second
    assert Head.paths == [f"/msg/{stuck}/payload"]


class _TrickleClosing(_Trickle):
    """Trickles as :class:`_Trickle`, its answer saying `Connection: close` (as uvicorn's
    does to a request that asks for it)."""

    closing = True


def test_a_trickling_answer_that_closes_its_connection_is_cut_off_too(
    broker: Mosquitto, unique_topic: Any
) -> None:
    """urllib3's connection lets go of its socket for such an answer (http.client hands it
    to the response), and the pace forgot the socket it knew for the one the response
    named, none: the body trickled on, unwatched (found through offload-proxy's fetches)."""
    topic = unique_topic("slow-closing")
    with (
        _serving(_TrickleClosing) as (Closing, origin),
        Client(
            broker.url,
            discovery_allowlist=(origin,),
            fetch_deadline=1.0,
            fetch_min_rate=1_000_000,
            fetch_retry_for=0.0,
        ) as sub,
    ):
        sub.subscribe(topic)
        stuck = _slow_placeholder(sub, origin, topic)
        first = sub.next_message(30)
        _wait(Closing, lambda: Closing.cut == 1 and Closing.active == 0)  # the client hung up
    assert isinstance(first, MessageError) and first.message_id == stuck, first
    assert isinstance(first.error, FetchError) and "fetch_min_rate" in str(first.error), first
