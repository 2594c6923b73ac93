"""`offload fetch URL --range START-END`: a byte range of the payload, reading only what it needs.

For a plain payload (or with `--raw`) it is one HTTP Range request for those stored bytes. For
an age file the range is of the plaintext: one request for the head of the object (the age
header, its nonce and the first chunk, which tells a compressed payload), then one for
exactly the 64 KiB chunks that hold the range (:func:`client.http._range.age_range`, as
`Client.fetch_range` reads them). A compressed payload has no plaintext offsets to seek to:
fetch it whole.

Redirects are followed like `curl -L` (the user named the URL) and no credentials are sent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import httpx

from ..core._exceptions import FetchError, PayloadDecodeError
from ..http._range import age_range
from ..protocol._age import NONCE, SEALED_CHUNK, Layout, OpenedHeader
from ..protocol._age_header import Header
from ..protocol._age_keys import Identity
from ..protocol._zstd import MARK, marked

HEAD = 128 * 1024  # the first request: an age header (usually < 1 KiB), nonce, chunk 0
_AGE_MAGIC = b"age-encryption.org/v1\n"
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


def parse_range(text: str) -> tuple[int, int]:
    """`START-END` (inclusive, as HTTP writes it) as a half-open `(start, end)`.

    Raises:
        ValueError: not two non-negative integers with START <= END.
    """
    start, sep, end = text.partition("-")
    if not sep or not start.isdigit() or not end.isdigit() or int(start) > int(end):
        raise ValueError(f"--range must be START-END (bytes, inclusive), got {text!r}")
    return int(start), int(end) + 1


def _get(http: httpx.Client, url: str, start: int, end: int) -> tuple[bytes, int]:
    """Stored bytes [start, end) and the object's total size."""
    try:
        response = http.get(url, headers={"Range": f"bytes={start}-{end - 1}"})
    except httpx.HTTPError as exc:
        raise FetchError(url, f"fetch failed: {exc!r}") from exc
    if response.status_code == 416:
        return b"", int(response.headers.get("content-range", "*/0").rsplit("/", 1)[-1] or 0)
    if response.status_code not in (200, 206):
        raise FetchError(url, f"HTTP {response.status_code}", response.status_code)
    if response.status_code == 200:  # no Range support: the whole object came
        return response.content[start:end], len(response.content)
    match = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", ""))
    if match is None or int(match[1]) != start:
        raise FetchError(url, "the server's Content-Range does not match the request")
    return response.content, int(match[3])


def fetch_range(
    url: str, start: int, end: int, identities: Sequence[Identity], *, raw: bool
) -> tuple[bytes, int]:
    """Payload bytes [start, end) and how many stored bytes were read for them.

    Raises:
        FetchError: the server failed or does not answer ranges consistently.
        PayloadDecodeError: no identity, a damaged object, or a compressed payload.
    """
    with httpx.Client(follow_redirects=True, timeout=60) as http:
        if raw:
            data, _ = _get(http, url, start, end)
            return data, len(data)
        head, total = _get(http, url, 0, HEAD)
        if marked(head):
            raise PayloadDecodeError("--range of a compressed payload: fetch it whole, or --raw")
        if not head.startswith(_AGE_MAGIC):
            data, _ = _get(http, url, start, end)
            return data, len(head) + len(data)
        header = Header.parse(head)
        if header is not None and len(head) >= header.length + NONCE:
            nonce = head[header.length : header.length + NONCE]
            layout = Layout.of(header.length, total)
            first_sealed = head[layout.payload_start : layout.payload_start + SEALED_CHUNK]
            if len(first_sealed) == min(SEALED_CHUNK, layout.body):
                opened = OpenedHeader(header, nonce, identities)
                chunk0 = opened.open_chunk(0, first_sealed, layout.chunks == 1)
                if marked(chunk0[: len(MARK)]):
                    raise PayloadDecodeError(
                        "--range of a compressed payload: fetch it whole, or --raw"
                    )
        plain, read = age_range(
            lambda a, b: _get(http, url, a, b)[0], total, start, end, identities, head=head
        )
        return plain, len(head) + read
