"""Request bodies as the gateway's HTTP protocol reads them (`GatewayHttpProtocol`).

Its socket reads go into one buffer per event loop thread that every connection shares,
so a body reaches the app in pieces of up to 1 MiB. Served here by uvicorn on uvloop, as
`offload-gateway` serves, to an app that records the pieces it receives: each body must
arrive byte-exact while others are read through the same buffer at the same time, and a
body that waited in the socket must come in pieces larger than uvloop's own read
(256,000 bytes).
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import uvicorn

from gateway.middleware._protocol import READ_SIZE, GatewayHttpProtocol

MiB = 1024 * 1024
UVLOOP_READ = 256_000  # what uvloop reads at a time into a protocol that has no buffer


async def recorder(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers each POST with the SHA-256 of its body and the size of each piece."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    digest, pieces = hashlib.sha256(), []
    while True:
        message = await receive()
        body = message.get("body", b"")
        digest.update(body)
        pieces.append(len(body))
        if not message.get("more_body"):
            break
        await asyncio.sleep(0.01)  # a busy app: the client's bytes wait in the socket
    answer = json.dumps({"sha256": digest.hexdigest(), "pieces": pieces}).encode()
    head = [(b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": head})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(recorder, http=GatewayHttpProtocol, loop="uvloop", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: server.run(sockets=[sock]), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield int(sock.getsockname()[1])
    server.should_exit = True
    thread.join(30)


def upload(port: int, body: bytes) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/up", body=body)
        response = conn.getresponse()
        assert response.status == 200
        answer: dict[str, Any] = json.loads(response.read())
        return answer
    finally:
        conn.close()


def test_a_body_that_waited_in_the_socket_comes_in_large_pieces(port: int) -> None:
    body = os.urandom(16 * MiB + 7)
    answer = upload(port, body)
    assert answer["sha256"] == hashlib.sha256(body).hexdigest()
    assert sum(answer["pieces"]) == len(body)
    largest = max(answer["pieces"])
    assert UVLOOP_READ < largest <= READ_SIZE, sorted(answer["pieces"])[-3:]


def test_bodies_read_through_the_shared_buffer_at_once_each_arrive_intact(port: int) -> None:
    bodies = [os.urandom(4 * MiB + n) for n in range(12)]
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda body: upload(port, body), bodies))
    for body, answer in zip(bodies, answers, strict=True):
        assert answer["sha256"] == hashlib.sha256(body).hexdigest()
