"""Upload limits against the real gateway: stalled bodies, concurrent uploads, sizes."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator

import bson
import httpx
import pytest

from gateway.middleware._protocol import MAX_HEAD_BYTES
from gateway.storage import S3Store

from _gateway import GatewayServer
from _hostile import RawRequest
from _servers import SeaweedFS

pytestmark = pytest.mark.servers


def upload_doc(payload: bytes, msg_id: uuid.UUID, headers: int = 0) -> bytes:
    fields: list[list[object]] = [["_id", msg_id.bytes]]
    fields += [[f"h{i}", b"v" * 100] for i in range(headers)]
    return bson.encode({"message": bson.Binary(payload), "headers": fields})


@pytest.fixture
def stored(seaweed: SeaweedFS, bucket_name: str) -> Callable[[], list[str]]:
    store = S3Store(
        seaweed.endpoint, bucket_name, access_key=seaweed.access_key, secret_key=seaweed.secret_key
    )
    # blobs/: the account's payload records (dedup), kept beside the messages
    return lambda: [info.key for info in store.list("") if not info.key.startswith("blobs/")]


def bson_upload(gw: GatewayServer, body: bytes, topic: str = "l/raw") -> RawRequest:
    """hop's upload of `body` (a BSON document) over a bare socket, no body byte sent yet."""
    path = f"/topic/{topic}+oversized"
    return RawRequest.post(gw.port, path, len(body), content_type="application/bson", body=body)


@pytest.fixture
def raw_uploads() -> Iterator[list[RawRequest]]:
    made: list[RawRequest] = []
    yield made
    for upload in made:
        upload.close()


def test_slow_loris_body_times_out_with_408_and_stores_nothing(
    gateway_factory: Callable[..., GatewayServer],
    raw_uploads: list[RawRequest],
    stored: Callable[[], list[str]],
) -> None:
    gw = gateway_factory(None, body_idle_timeout=1.0)
    upload = bson_upload(gw, upload_doc(b"s" * 10_000, uuid.uuid4()))
    raw_uploads.append(upload)
    upload.send(40)  # past the document header: the payload upload has begun
    started = time.monotonic()
    answer = upload.response_head()
    waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert 0.8 < waited < 5
    # The rest of the body will not be read: the connection is closed at once, not left to
    # uvicorn's keep-alive timeout (5 s).
    assert b"connection: close" in answer.lower()
    assert upload.rest_until_closed(within=2) is not None
    assert stored() == []
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        assert http.get("/healthz").status_code == 200


def test_a_slow_but_moving_body_is_not_cut(
    gateway_factory: Callable[..., GatewayServer], raw_uploads: list[RawRequest]
) -> None:
    gw = gateway_factory(None, body_idle_timeout=1.0, min_body_rate=100)
    body = upload_doc(b"m" * 600, uuid.uuid4())
    upload = bson_upload(gw, body)
    raw_uploads.append(upload)
    step = len(body) // 8 + 1
    for _ in range(8):  # about 2.4 s in all at ~300 bytes/s, never 1 s without a byte
        upload.send(step)
        time.sleep(0.3)
    assert upload.response_head().startswith(b"HTTP/1.1 201")


def test_a_trickling_body_is_cut_below_the_minimum_rate(
    gateway_factory: Callable[..., GatewayServer],
    raw_uploads: list[RawRequest],
    stored: Callable[[], list[str]],
) -> None:
    """A byte now and then never trips the idle timeout, but cannot hold a slot for ever."""
    gw = gateway_factory(None, body_idle_timeout=1.0, min_body_rate=1000)
    upload = bson_upload(gw, upload_doc(b"t" * 10_000, uuid.uuid4()))
    raw_uploads.append(upload)
    answer = b""
    for _ in range(40):  # ~30 bytes/s, a piece every 0.3 s: never idle for 1 s
        try:
            upload.send(10)
        except OSError:  # the gateway answered and closed the connection
            break
        upload.sock.settimeout(0.3)
        try:
            answer += upload.sock.recv(65536)
        except TimeoutError:
            continue
        if answer:
            break
    if b"\r\n\r\n" not in answer:  # the head may have come whole in the loop
        answer += upload.response_head(timeout=5)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"connection: close" in answer.lower()
    rest = upload.rest_until_closed(within=2)  # the JSON body may come after the head
    assert rest is not None
    assert b"too slow" in answer + rest
    assert upload.sent < 200  # cut after about a second of waiting, not at the end
    assert stored() == []


def test_concurrent_uploads_per_client_are_limited(
    gateway_factory: Callable[..., GatewayServer], raw_uploads: list[RawRequest]
) -> None:
    gw = gateway_factory(None, max_uploads_per_client=2, body_idle_timeout=30)
    bodies = [upload_doc(b"c" * 1000, uuid.uuid4()) for _ in range(3)]
    for body in bodies[:2]:  # two uploads in progress, their bodies half sent
        upload = bson_upload(gw, body)
        upload.send(100)
        raw_uploads.append(upload)
    time.sleep(0.3)  # let the gateway start both
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        refused = http.post("/topic/l/third+oversized", content=bodies[2])
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert "limit 2" in refused.json()["detail"]
        assert http.get("/healthz").status_code == 200  # reads are not limited
        first = raw_uploads[0]
        first.send(len(first.body))
        assert first.response_head().startswith(b"HTTP/1.1 201")
        time.sleep(0.2)
        assert http.post("/topic/l/third+oversized", content=bodies[2]).status_code == 201


def test_a_body_declared_too_large_is_refused_and_the_connection_closed(
    gateway_factory: Callable[..., GatewayServer],
    raw_uploads: list[RawRequest],
    stored: Callable[[], list[str]],
) -> None:
    """413 before the body: the body is not drained, the socket is not kept for keep-alive."""
    gw = gateway_factory(None, max_body_bytes=1000)
    upload = RawRequest.post(
        gw.port, "/topic/l/big+oversized", 10_000_000, content_type="application/bson"
    )
    raw_uploads.append(upload)
    answer = upload.response_head(timeout=5)
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert b"connection: close" in answer.lower()
    assert upload.rest_until_closed(within=2) is not None
    assert stored() == []


def test_a_connection_that_sends_no_request_is_closed_at_the_header_timeout(
    gateway_factory: Callable[..., GatewayServer], raw_uploads: list[RawRequest]
) -> None:
    """uvicorn alone kept such a connection open for ever (1,100 of them, 32 s later)."""
    gw = gateway_factory(None, header_timeout=1)
    silent = RawRequest(gw.port, "")
    raw_uploads.append(silent)
    started = time.monotonic()
    assert silent.rest_until_closed(within=5) == b""  # closed, nothing said
    assert 0.8 < time.monotonic() - started < 4


def test_a_request_head_sent_a_line_at_a_time_is_answered_408_and_closed(
    gateway_factory: Callable[..., GatewayServer], raw_uploads: list[RawRequest]
) -> None:
    """Slow loris on the head: every header line arrives, but the head never completes."""
    gw = gateway_factory(None, header_timeout=1)
    slow = RawRequest(gw.port, "GET /healthz HTTP/1.1\r\nHost: gw\r\n")
    raw_uploads.append(slow)
    started = time.monotonic()
    with contextlib.suppress(OSError):  # the gateway may close while a line is on its way
        for n in range(40):
            slow.sock.sendall(b"X-Slow-%d: a\r\n" % n)
            time.sleep(0.1)
    answer = slow.rest_until_closed(within=5)
    assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
    assert b"request head" in answer and b"connection: close" in answer.lower()
    assert time.monotonic() - started < 6
    assert httpx.get(f"{gw.url}/healthz", timeout=10).status_code == 200


def _refused_line_flood(request: RawRequest, line: bytes) -> None:
    """Send `line` at full speed (up to 64 MiB): the gateway must close the connection long
    before, after a 431 when that answer is not lost to the reset its close causes."""
    sent = 0
    with contextlib.suppress(OSError):  # the gateway closes while lines are on their way
        while sent < 64 * 1024 * 1024:
            request.sock.sendall(line * 16)
            sent += len(line) * 16
    assert sent < 16 * 1024 * 1024  # refused long before: nothing like this was kept
    answer = request.rest_until_closed(within=10)
    if answer:
        assert answer.startswith(b"HTTP/1.1 431"), answer


def test_a_request_head_that_never_ends_is_answered_431_and_closed(
    gateway_factory: Callable[..., GatewayServer], raw_uploads: list[RawRequest]
) -> None:
    """Header lines at full speed: uvicorn with httptools kept every one (3.4 GB in 6 s on
    the stack); now the head stops at MAX_HEAD_BYTES. One just under it is served."""
    gw = gateway_factory(None)
    line = b"X-Pad: " + b"a" * 8000 + b"\r\n"
    within = RawRequest(gw.port, "GET /healthz HTTP/1.1\r\nHost: gw\r\n")
    raw_uploads.append(within)
    within.sock.sendall(line * ((MAX_HEAD_BYTES - 1000) // len(line)) + b"\r\n")
    assert within.response_head(timeout=10).startswith(b"HTTP/1.1 200")
    endless = RawRequest(gw.port, "GET /healthz HTTP/1.1\r\nHost: gw\r\n")
    raw_uploads.append(endless)
    _refused_line_flood(endless, line)
    assert httpx.get(f"{gw.url}/healthz", timeout=10).status_code == 200


def test_trailers_that_never_end_are_refused_and_nothing_is_stored(
    gateway_factory: Callable[..., GatewayServer],
    raw_uploads: list[RawRequest],
    stored: Callable[[], list[str]],
) -> None:
    """Trailer lines after a chunked body's last chunk: the parser kept them all (315 MB
    held for 315 MB sent); they count with the head now."""
    gw = gateway_factory(None)
    upload = RawRequest(
        gw.port,
        f"PUT /msg/{uuid.uuid4()}?topic=l/trailers HTTP/1.1\r\nHost: gw\r\n"
        "Transfer-Encoding: chunked\r\nContent-Type: application/octet-stream\r\n\r\n"
        "5\r\nhello\r\n0\r\n",
    )
    raw_uploads.append(upload)
    _refused_line_flood(upload, b"X-Trailer: " + b"a" * 8000 + b"\r\n")
    assert stored() == []


ENDLESS = {
    "request line": "GET /",
    "header name": "GET /healthz HTTP/1.1\r\nHost: gw\r\n",
    "header value": "GET /healthz HTTP/1.1\r\nHost: gw\r\nX-A: ",
    "trailer value": "PUT /msg/{id}?topic=l/endless HTTP/1.1\r\nHost: gw\r\n"
    "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: ",
    "chunk extension": "PUT /msg/{id}?topic=l/endless HTTP/1.1\r\nHost: gw\r\n"
    "Transfer-Encoding: chunked\r\n\r\n5;e=",
}


@pytest.mark.parametrize("part", list(ENDLESS))
def test_a_head_part_that_never_ends_is_refused_and_nothing_is_stored(
    part: str,
    gateway_factory: Callable[..., GatewayServer],
    raw_uploads: list[RawRequest],
    stored: Callable[[], list[str]],
) -> None:
    """One request line, header or trailer without end: the parser hands none of it over
    (so the head counts never saw it) and kept copying what it had, 150-350 MB in the
    10 s of the header timeout; it is counted raw now, and refused at MAX_HEAD_BYTES."""
    gw = gateway_factory(None)
    endless = RawRequest(gw.port, ENDLESS[part].format(id=uuid.uuid4()))
    raw_uploads.append(endless)
    started = time.monotonic()
    _refused_line_flood(endless, b"a" * 8000)
    assert time.monotonic() - started < 5  # long before the header timeout (10 s)
    assert stored() == []
    assert httpx.get(f"{gw.url}/healthz", timeout=10).status_code == 200


@pytest.mark.parametrize("part", ["request line", "header value"])
def test_an_oversized_head_part_in_one_read_is_refused_at_once(
    part: str, gateway_factory: Callable[..., GatewayServer], raw_uploads: list[RawRequest]
) -> None:
    """100 KB of an unfinished head part sent at once and then nothing: it came in the
    same read as the request's first byte, which the raw count used to skip, so it waited
    for the header timeout (a 408 after 10 s) instead of its 431."""
    gw = gateway_factory(None)
    conn = RawRequest(gw.port, ENDLESS[part] + "a" * 100_000)
    raw_uploads.append(conn)
    head = conn.response_head(timeout=5)
    assert head.startswith(b"HTTP/1.1 431"), head


def test_the_header_timeout_is_per_request_head_not_per_connection(
    gateway_factory: Callable[..., GatewayServer], raw_uploads: list[RawRequest]
) -> None:
    """A kept-alive connection serves request after request past the timeout, each head
    sent in two pieces with a pause inside the limit."""
    gw = gateway_factory(None, header_timeout=1)
    conn = RawRequest(gw.port, "")
    raw_uploads.append(conn)
    started = time.monotonic()
    for _ in range(4):
        conn.sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        time.sleep(0.5)
        conn.sock.sendall(b"Host: gw\r\n\r\n")
        head, _, body = conn.response_head(timeout=5).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(body) < length:  # the rest of the answer, so the next one starts clean
            body += conn.sock.recv(65536)
        time.sleep(0.3)
    assert time.monotonic() - started > 2.5  # well past one timeout, on one connection


def test_maximum_topic_length(gateway_factory: Callable[..., GatewayServer]) -> None:
    gw = gateway_factory(None, max_topic_bytes=32)
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        ok = http.post(f"/topic/{'t' * 32}+oversized", content=upload_doc(b"x", uuid.uuid4()))
        long = http.post(f"/topic/{'t' * 33}+oversized", content=upload_doc(b"x", uuid.uuid4()))
    assert ok.status_code == 201
    assert long.status_code == 400 and "longer than 32 bytes" in long.json()["detail"]


def test_maximum_header_bytes(
    gateway_factory: Callable[..., GatewayServer], stored: Callable[[], list[str]]
) -> None:
    gw = gateway_factory(None, max_header_bytes=4096)
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        ok = http.post("/topic/l/h+oversized", content=upload_doc(b"x", uuid.uuid4(), 10))
        big = http.post("/topic/l/h+oversized", content=upload_doc(b"x", uuid.uuid4(), 100))
    assert ok.status_code == 201
    assert big.status_code == 413, big.text
    assert len(stored()) == 3  # only the accepted message's payload, sidecar and index


def test_a_head_over_the_limit_gets_its_431_every_time(
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    """A 70 KB head sent whole: the gateway answers 431 after the read that passed the
    limit, with the rest of the head arrived but unread. A plain close then made the
    kernel reset the connection, and the reset threw away the 431 not yet sent (httpx:
    "Server disconnected without sending a response", in one run of two). The close
    lingers now: the answer, a FIN, and the rest read and dropped."""
    gw = gateway_factory(None)
    answers = []
    for _ in range(20):
        with httpx.Client(base_url=gw.url, timeout=10) as http:
            try:
                answers.append(http.get("/healthz", headers={"X-Pad": "a" * 70_000}).status_code)
            except httpx.TransportError as exc:
                answers.append(repr(exc))
    assert answers == [431] * 20
