"""CORS for browser uploads (tus-js-client, Uppy): only for the origins named in settings.

Starlette's `CORSMiddleware` answers preflights for tus's methods and headers and exposes
the answer headers a tus client and an offload client read. On its own it would still add
`Access-Control-Expose-Headers` (and, on a refused preflight, `Access-Control-Allow-Methods`)
to requests from origins it refuses; an origin not listed should learn nothing, so requests
from it bypass CORS altogether: no CORS header at all, and the browser refuses the answer.

Preflights are answered before authentication (browsers send no credentials with them);
every other answer, 401 and 429 included, carries the CORS headers, so a page can read why.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
REQUEST_HEADERS = (
    "Authorization",
    "Content-Type",
    "Content-Disposition",
    "If-None-Match",
    "Range",
    "Tus-Resumable",
    "Upload-Checksum",
    "Upload-Concat",
    "Upload-Length",
    "Upload-Metadata",
    "Upload-Offset",
    "X-HTTP-Method-Override",
    "X-Offload-Expiry",
    "X-Offload-Property",
    "X-Offload-Qos",
    "X-Offload-Retain",
    "X-Requested-With",
)
EXPOSED_HEADERS = (
    "Content-Disposition",
    "ETag",
    "Location",
    "Retry-After",
    "Tus-Checksum-Algorithm",
    "Tus-Extension",
    "Tus-Max-Size",
    "Tus-Resumable",
    "Tus-Version",
    "Upload-Concat",
    "Upload-Expires",
    "Upload-Length",
    "Upload-Offset",
    "WWW-Authenticate",
    "X-Offload-Id",
    "X-Offload-Sha256",
    "X-Offload-Topic",
    "X-Offload-Url",
)
MAX_AGE = 600  # seconds a browser may reuse a preflight answer


def parse_origins(raw: str) -> tuple[str, ...]:
    """`OFFLOAD_CORS_ORIGINS`: comma-separated `scheme://host[:port]`, or `*` for any.

    Raises:
        ValueError: an entry that is not an origin (a path, no scheme, ...).
    """
    origins: list[str] = []
    for item in raw.split(","):
        origin = item.strip().rstrip("/")
        if not origin:
            continue
        if origin != "*":
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
                raise ValueError(f"CORS origin {origin!r} is not scheme://host[:port]")
            if parts.query or parts.fragment or "@" in parts.netloc:
                raise ValueError(f"CORS origin {origin!r} is not scheme://host[:port]")
        origins.append(origin)
    return tuple(origins)


class BrowserUploads:
    """CORS for the listed origins; requests from any other origin pass through untouched.

    Args:
        app: the application to wrap.
        origins: the allowed origins, as :func:`parse_origins` returns them.
    """

    def __init__(self, app: ASGIApp, *, origins: Iterable[str]) -> None:
        self.app = app
        self.origins = frozenset(origins)
        self.cors = CORSMiddleware(
            app,
            allow_origins=sorted(self.origins),
            allow_methods=METHODS,
            allow_headers=REQUEST_HEADERS,
            expose_headers=EXPOSED_HEADERS,
            max_age=MAX_AGE,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            origin = Headers(scope=scope).get("origin")
            if origin is not None and ("*" in self.origins or origin in self.origins):
                await self.cors(scope, receive, send)
                return
        await self.app(scope, receive, send)
