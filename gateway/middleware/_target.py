"""Refuse a request whose target is not UTF-8 once percent-decoded.

uvicorn decodes the path with `urllib.parse.unquote` and Starlette the query string the
same way, both replacing what is not UTF-8 with U+FFFD: `/publish/a%FFb` was published to
the topic `a\ufffdb`, and `%FF` and `%FE` to the same one. Topics, message ids and options
are UTF-8 text (MQTT requires topic names to be), so such a target is the client's
mistake: 400, with the reason, before routing: nothing is stored.
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Receive, Scope, Send

from ..core import JSONAnswer


def target_problem(raw_path: bytes, query: bytes) -> str | None:
    """Why the path or query does not percent-decode to UTF-8; None when both do."""
    for part, raw in (("path", raw_path), ("query string", query)):
        if b"%" not in raw and raw.isascii():
            continue
        try:
            unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            return (
                f"the request {part} is not UTF-8 once percent-decoded ({exc.reason} at byte "
                f"{exc.start}): topics, ids and options are UTF-8 text"
            )
    return None


class Utf8Target:
    """ASGI middleware: 400 for a target that is not UTF-8 once percent-decoded."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = target_problem(scope.get("raw_path") or b"", scope.get("query_string", b""))
            if problem is not None:
                await JSONAnswer({"detail": problem}, status_code=400)(scope, receive, send)
                return
        await self.app(scope, receive, send)
