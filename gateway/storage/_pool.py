"""HTTP/1.1 connections kept between requests, per origin, and what an answer's head says
of its framing, for the store's requests on the event loop (_async_http.py).

Sans-I/O: the connections are the callers' own (each reads its socket its own way and raises
its own errors); this module only keeps them and hands them back. It imports neither asyncio
nor h11, so importing it costs nothing; the heads it reads are h11's.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    import h11


class Kept(Protocol):
    """A connection a pool can keep."""

    @property
    def usable(self) -> bool:
        """Neither closed nor closing, nor at the end of what the peer sends."""
        ...

    def close(self) -> None: ...


K = TypeVar("K", bound=Hashable)
C = TypeVar("C", bound=Kept)


class KeptConnections(Generic[K, C]):
    """Idle connections per origin: at most `size` each, none older than `keep_alive`
    seconds (keep it under the servers' keep-alive timeouts). The newest is taken first.
    """

    def __init__(self, *, size: int, keep_alive: float) -> None:
        self._size = size
        self._keep_alive = keep_alive
        self._idle: dict[K, list[tuple[C, float]]] = {}

    def release(self, origin: K, conn: C) -> None:
        """Keep `conn`, idle from now; closed instead when it is not usable or the origin
        has `size` already."""
        idle = self._idle.setdefault(origin, [])
        if len(idle) >= self._size or not conn.usable:
            conn.close()
            return
        idle.append((conn, time.monotonic()))

    def take(self, origin: K) -> C | None:
        """An idle connection to `origin` still usable; those expired or unusable are
        closed on the way."""
        idle = self._idle.get(origin, [])
        while idle:
            conn, since = idle.pop()
            if conn.usable and time.monotonic() - since < self._keep_alive:
                return conn
            conn.close()
        return None

    def close(self) -> None:
        """Closes every idle connection."""
        for idle in self._idle.values():
            for conn, _ in idle:
                conn.close()
        self._idle.clear()


def content_length(response: h11.Response) -> int | None:
    """The body's length when Content-Length alone frames it (h11 has validated the header);
    None when it is chunked or has no length."""
    length = None
    for name, value in response.headers:
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            length = int(value)
    return length


def keeps_alive(response: h11.Response) -> bool:
    """Whether the server keeps the connection open after this answer."""
    return response.http_version == b"1.1" and not any(
        name == b"connection" and b"close" in value.lower() for name, value in response.headers
    )
