"""proxy/_http11.py, the gateway link's transport, against a real HTTP/1.1 server (a raw
asyncio one: its answers are written byte by byte, so framing and cut-off bodies are exact).
What the transport does with the real gateway is covered by tests/test_proxy*.py. Each test
runs on asyncio's loop and on uvloop (the proxy's default), whose transports differ."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import httpx
import pytest
import uvloop

from proxy._http11 import H11Transport

#: A request's head -> the answer's bytes, and whether the server then keeps the connection.
Answer = Callable[[bytes], tuple[bytes, bool]]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def _serve(answer: Answer, test: Callable[[str, list[bytes]], Awaitable[None]]) -> int:
    """Run `test(base_url, requests)` against a server answering each request with
    `answer(head)`; the connections it accepted."""
    accepted = 0
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                requests.append(head + await reader.readexactly(length))
                reply, keep = answer(head)
                writer.write(reply)
                await writer.drain()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        await test(f"http://127.0.0.1:{port}", requests)
    return accepted


Run = Callable[[Coroutine[Any, Any, int]], int]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    """Runs a test's coroutine on the loop named."""
    factory = uvloop.new_event_loop if request.param == "uvloop" else None

    def run_on(main: Coroutine[Any, Any, int]) -> int:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main)

    return run_on


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=5, transport=H11Transport())


def test_a_length_framed_body_arrives_whole_and_the_connection_is_reused(run: Run) -> None:
    body = bytes(range(256)) * 20_000  # 5 MB: several reads

    async def check(base: str, requests: list[bytes]) -> None:
        async with _client() as http:
            for _ in range(3):
                response = await http.get(f"{base}/payload?x=1")
                assert response.status_code == 200
                assert response.content == body
        assert all(r.startswith(b"GET /payload?x=1 HTTP/1.1\r\n") for r in requests)

    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    assert run(_serve(lambda _: (reply, True), check)) == 1


def test_a_body_cut_short_is_an_error_and_the_connection_is_not_reused(run: Run) -> None:
    async def check(base: str, _: list[bytes]) -> None:
        async with _client() as http:
            with pytest.raises(httpx.RemoteProtocolError, match="cut short"):
                await http.get(f"{base}/a")

    # Declares 1000 bytes, sends 10 and closes.
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10
    run(_serve(lambda _: (reply, False), check))


def test_chunked_and_connection_close_answers_are_read_through_h11(run: Run) -> None:
    async def check(base: str, _: list[bytes]) -> None:
        async with _client() as http:
            first = await http.get(f"{base}/chunked")
            second = await http.get(f"{base}/close")
            third = await http.get(f"{base}/again")
        assert (first.content, second.content, third.content) == (b"hello world", b"bye", b"ok")

    def answer(head: bytes) -> tuple[bytes, bool]:
        if head.startswith(b"GET /chunked"):
            chunks = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks, True
        if head.startswith(b"GET /close"):
            return b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbye", False
        return OK, True

    # The chunked answer's connection is kept; the one the server closes is not reused.
    assert run(_serve(answer, check)) == 2


def test_a_kept_connection_the_server_closed_does_not_fail_the_next_request(run: Run) -> None:
    async def check(base: str, _: list[bytes]) -> None:
        async with _client() as http:
            assert (await http.get(f"{base}/1")).content == b"ok"
            await asyncio.sleep(0.2)  # the server has closed the connection it said it kept
            assert (await http.get(f"{base}/2")).content == b"ok"

    # Says keep-alive, then closes after its answer (as a server whose idle timer ran out).
    assert run(_serve(lambda _: (OK, False), check)) == 2


def test_a_streamed_body_goes_as_declared_on_a_fresh_connection(run: Run) -> None:
    pieces = [b"a" * 300_000, b"b" * 300_000, b"c"]

    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    async def check(base: str, requests: list[bytes]) -> None:
        async with _client() as http:
            await http.get(f"{base}/probe")
            size = str(sum(map(len, pieces)))
            response = await http.put(
                f"{base}/msg", content=body(), headers={"Content-Length": size}
            )
            assert response.status_code == 201
            with pytest.raises(httpx.LocalProtocolError):  # more bytes than declared
                await http.put(f"{base}/msg", content=body(), headers={"Content-Length": "5"})
        assert requests[1].endswith(b"".join(pieces))

    reply = b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}"
    # The probe's connection, then one per streamed upload (never a kept one).
    assert run(_serve(lambda _: (reply, True), check)) == 3
