"""A download its client abandons stops reading the object store (docs/reliability.md).

uvicorn turns every send after a disconnect into a no-op, so a response stream nobody
stops reads its object to the end: open a download of a large object, drop it at once,
again and again, and the gateway reads the whole object from the store each time.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable

import httpx
import pytest
from prometheus_client import REGISTRY

from _gateway import GatewayServer
from _servers import wait_until

pytestmark = pytest.mark.servers

SIZE = 64 << 20
#: What an abandoned download may hand to the server in all: the client's 64 KiB, what
#: fills the buffers between the two (the gateway's send buffer is fixed at 64 KiB here),
#: and the piece or two sent after the disconnect before the gateway notices, with room to
#: spare. Measured: 0.52 to 0.59 MB with the check, 6.3 MB to the whole 64 MiB without it
#: (the stream ran on at no-op sends).
BOUND = 4 << 20


def _sample(name: str, **labels: str) -> float:
    """A counter of the test gateway, read from this process's registry (it runs in a
    thread here)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _requests(route: str, status: str) -> float:
    """GETs of `route` answered `status` that the gateway has finished (the middleware
    counts a request once its handler has returned)."""
    return _sample("offload_http_requests_total", method="GET", route=route, status=status)


def _drop_after_a_little(port: int, target: str, headers: str = "") -> bytes:
    """GET `target`, read 64 KiB past the head, close; the head.

    The receive buffer is set small before connecting, which turns off its autotuning:
    the kernel cannot take the object off the gateway's hands on the client's behalf.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n".encode())
        got = b""
        while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < 65536:
            piece = sock.recv(65536)
            assert piece, "the gateway closed the connection"
            got += piece
    return got.partition(b"\r\n\r\n")[0]


@pytest.mark.parametrize(
    ("target", "route", "status", "headers"),
    [
        ("/msg/{id}/payload", "/msg/{message_id}/payload", "200", ""),
        ("/msg/{id}/payload", "/msg/{message_id}/payload", "206", "Range: bytes=100-\r\n"),
        ("/msg/{id}", "/msg/{message_id}", "200", ""),
    ],
    ids=["payload", "range", "hop"],
)
def test_an_abandoned_download_stops_reading_the_store(
    gateway_factory: Callable[..., GatewayServer],
    target: str,
    route: str,
    status: str,
    headers: str,
) -> None:
    """Each drop: the request ends having sent far less than the object, is counted as
    abandoned and gives its transfer slot back; the object is still served whole afterwards.

    On SeaweedFS, read by the event loop: a store that keeps the stream fed lets it run on
    past the disconnect. (The file store's reads hop to a thread, which lets the
    disconnect's cancellation in after one batch of read-ahead, 2 MiB, even unchecked.)
    """
    # One transfer slot: each download after a drop finds the dropped one's slot given back.
    gw = gateway_factory(None, send_buffer=65536, sweep_interval=0, max_transfers=1)
    payload, msg_id = os.urandom(SIZE), uuid.uuid4()
    with httpx.Client(base_url=gw.url, timeout=60) as http:
        put = http.put(f"/msg/{msg_id}", params={"topic": "dl/drop"}, content=payload)
        assert put.status_code == 201, put.text
    path = target.format(id=msg_id)
    for _ in range(3):
        requests = _requests(route, status)
        sent = _sample("offload_http_sent_bytes_total", route=route)
        abandoned = _sample("offload_downloads_abandoned_total")
        head = _drop_after_a_little(gw.port, path, headers)
        assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
        wait_until(
            lambda before=requests: _requests(route, status) > before,
            "the end of the abandoned download",
            120,
        )
        served = _sample("offload_http_sent_bytes_total", route=route) - sent
        assert served < BOUND, f"{served} of {SIZE} bytes served to a client that read 64 KiB"
        assert _sample("offload_downloads_abandoned_total") == abandoned + 1
    with httpx.Client(base_url=gw.url, timeout=60) as http:
        whole = http.get(f"/msg/{msg_id}/payload")
        assert whole.status_code == 200 and whole.content == payload
