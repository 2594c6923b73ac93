"""Benchmark: what the gateway's HTTP protocol class costs per request.

`gateway/middleware/_protocol.py` subclasses uvicorn's httptools protocol to give every request
head a deadline and a size limit (a timer armed and cancelled per request, the request line
and headers counted as the parser hands them over), and serves it through a buffered-read
wrapper. Two uvicorn servers in this process
serve the same trivial ASGI app, one with `http="httptools"` (the baseline) and one with
`GatewayHttpProtocol`; a keep-alive `http.client` connection sends sequential GETs with
eight 20-byte headers to each in turn, and the ratio is the protocol's median rate over
the baseline's (1.0: free).

    python bench/http_protocol.py
    python bench/http_protocol.py --requests 5000 --rounds 20
"""

from __future__ import annotations

import argparse
import http.client
import socket
import statistics
import threading
import time
from typing import Any

import uvicorn
from _harness import emit_rate

HEADERS = {f"X-H{i}": "v" * 20 for i in range(8)}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    head = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": head})
    await send({"type": "http.response.body", "body": b"ok"})


def serve(protocol: Any) -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, http=protocol, log_level="warning"))
    threading.Thread(target=lambda: server.run(sockets=[sock]), daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return int(sock.getsockname()[1])


def rate(port: int, requests: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    t0 = time.perf_counter()
    for _ in range(requests):
        conn.request("GET", "/x?y=1", headers=HEADERS)
        conn.getresponse().read()
    elapsed = time.perf_counter() - t0
    conn.close()
    return requests / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="per round and server")
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    from gateway.middleware._protocol import GatewayHttpProtocol  # after _harness set sys.path

    ports = {"httptools": serve("httptools"), "head deadline": serve(GatewayHttpProtocol)}
    rates: dict[str, list[float]] = {name: [] for name in ports}
    for port in ports.values():
        rate(port, 500)  # warm-up
    for _ in range(args.rounds):
        for name, port in ports.items():
            rates[name].append(rate(port, args.requests))
    base, ours = (statistics.median(rates[name]) for name in ports)
    print(
        f"sequential GETs, {args.rounds} x {args.requests}: uvicorn httptools {base:.0f} req/s, "
        f"GatewayHttpProtocol {ours:.0f} req/s, ratio {ours / base:.2f}"
    )
    emit_rate("protocol", "GET rate, GatewayHttpProtocol / httptools", base, ours, "req/s")


if __name__ == "__main__":
    main()
