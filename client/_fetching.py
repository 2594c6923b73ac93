"""Fetch helpers over httpx responses: counting, capping, lengths, redirect targets.

Split from :mod:`client._http` (which keeps the statuses and errors); no I/O of its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Generator, Iterator

import httpx

from ._exceptions import FetchError
from ._message import Payload
from .protocol import Origin, http_origin


def _counted(
    pieces: Iterator[bytes], total: int | None, on_bytes: Callable[[int, int | None], None] | None
) -> Iterator[bytes]:
    if on_bytes is None:
        yield from pieces
        return
    done = 0
    for piece in pieces:
        done += len(piece)
        on_bytes(done, total)
        yield piece


def _capped(pieces: Iterator[bytes], limit: int | None, url: str) -> Iterator[bytes]:
    """The pieces, failing as soon as they would add up to more than `limit` bytes."""
    if limit is None:
        yield from pieces
        return
    done = 0
    for piece in pieces:
        done += len(piece)
        if done > limit:
            # Raised inside the response's `with`: httpx closes the connection unread.
            raise FetchError(url, f"body runs past the declared size of {limit} bytes: cut off")
        yield piece


def _content_length(url: str, response: httpx.Response) -> int | None:
    """The response's Content-Length as an int, None when absent; junk is refused."""
    values = response.headers.get_list("Content-Length")
    if not values:
        return None
    value = values[0]
    if len(set(values)) != 1 or len(value) > 20 or not (value.isascii() and value.isdigit()):
        raise FetchError(url, f"unusable Content-Length {value[:40]!r}")
    return int(value)


#: Redirect statuses `fetch` follows (GET stays GET for all of them).
REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: Most redirects one fetch follows.
MAX_REDIRECTS = 3


class _NoAuth(httpx.Auth):
    """Sends nothing: stands in for the client's default auth after a redirect."""

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers.pop("Authorization", None)
        yield request


_NO_AUTH = _NoAuth()


def _origin(url: str, target: httpx.URL) -> Origin:
    """The origin of a fetched URL; only absolute http(s) URLs are fetched."""
    try:
        return http_origin(str(target))
    except ValueError as exc:
        raise FetchError(url, f"only http and https URLs are fetched ({exc})") from exc


def _checked_length(
    url: str, response: httpx.Response, expected_size: int | None, limit: int | None
) -> int | None:
    """The size to expect, refusing a Content-Length that contradicts the declared size."""
    announced = _content_length(url, response)
    if announced is not None and expected_size is not None:
        if announced != expected_size:
            raise FetchError(
                url,
                f"Content-Length {announced} differs from the declared size "
                f"{expected_size}: refused before the body",
            )
    elif announced is not None and limit is not None and announced > limit:
        raise FetchError(url, f"Content-Length {announced} is more than {limit}")
    return expected_size if expected_size is not None else announced


def _in_memory(stream: Iterator[bytes], digest: hashlib._Hash) -> Payload:
    # httpx's own read size, no re-chunking, one join: a single copy.
    pieces = []
    for piece in stream:
        digest.update(piece)
        pieces.append(piece)
    return Payload(b"".join(pieces))
