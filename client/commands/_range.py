"""`offload fetch URL --range START-END`: a byte range of the payload, reading only what it needs.

With `--raw` it is one HTTP Range request for those stored bytes. Otherwise the first request
reads the object's first few bytes (:data:`PROBE`), which tell a plain payload (then one
request for exactly the range), a compressed one (refused) and an age file, whose range is of
the plaintext: one request for its head (the age header, its nonce and the first chunk, which
tells a compressed payload), then one for exactly the 64 KiB chunks that hold the range
(:func:`client.http._range.age_range`, as `Client.fetch_range` reads them). A compressed
payload has no plaintext offsets to seek to: fetch it whole.

The requests are those of every other fetch (:class:`client.http._range.RangeReader` on the
command's :class:`client.http._transport.HttpTransport`): its CA file and client certificate,
its login sent to the URL named (as `curl -u`), redirects followed like `curl -L` without it,
and an answer that is not exactly the range asked for refused, never read whole. A range
that starts past the payload's end is an error (the store's 416), never an empty file.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core._exceptions import FetchError, PayloadDecodeError
from ..http._range import RangeReader, age_range
from ..protocol._age import NONCE, SEALED_CHUNK, Layout, OpenedHeader
from ..protocol._age_header import Header
from ..protocol._age_keys import Identity
from ..protocol._zstd import MARK, marked

HEAD = 128 * 1024  # an age file's head: its header (usually < 1 KiB), nonce, chunk 0
_AGE_MAGIC = b"age-encryption.org/v1\n"
#: The first read of a payload of unknown kind: enough to tell an age file or a compressed
#: payload from a plain one, which then costs the range and these few bytes, not a head.
PROBE = max(len(_AGE_MAGIC), len(MARK))
_COMPRESSED = "--range of a compressed payload: fetch it whole, or --raw"


def fetch_range(
    reader: RangeReader,
    start: int,
    end: int,
    identities: Sequence[Identity],
    *,
    raw: bool,
    url: str,
) -> tuple[bytes, int]:
    """Payload bytes [start, end) and how many stored bytes were read for them.

    Args:
        reader: the payload URL's reader, its size not known yet.
        start: the first byte.
        end: one past the last; past the payload's end reads up to it.
        identities: for an age file.
        raw: the stored bytes, not decoded.
        url: the payload's URL, for the errors.

    Raises:
        FetchError: the range starts past the payload's end (as a 416), the server failed,
            or it does not answer ranges exactly.
        PayloadDecodeError: no identity, a damaged object, or a compressed payload.
    """
    if raw:
        data = reader.first(start, end)
        return _within(data, start, reader.size, url), len(data)
    probe = reader.first(0, PROBE)
    total = reader.size
    assert total is not None  # the first answer told it
    if marked(probe):
        raise PayloadDecodeError(_COMPRESSED)
    if not probe.startswith(_AGE_MAGIC):
        stop = min(end, total)
        if stop <= len(probe):  # read already
            return _within(probe[start:stop], start, total, url), len(probe)
        data = reader.get(start, stop) if start < stop else b""
        return _within(data, start, total, url), len(probe) + len(data)
    head = probe + reader.get(len(probe), min(HEAD, total)) if total > len(probe) else probe
    plain_size = _check_uncompressed(head, total, identities)
    plain, read = age_range(reader.get, total, start, end, identities, head=head)
    return _within(plain, start, plain_size, url), len(head) + read


def _check_uncompressed(head: bytes, total: int, identities: Sequence[Identity]) -> int | None:
    """An age file's plaintext size, when its head holds its header (None otherwise).

    Raises:
        PayloadDecodeError: chunk 0 says the plaintext is compressed.
    """
    header = Header.parse(head)
    if header is None or len(head) < header.length + NONCE:
        return None  # a long header: age_range reads the rest
    nonce = head[header.length : header.length + NONCE]
    layout = Layout.of(header.length, total)
    first_sealed = head[layout.payload_start : layout.payload_start + SEALED_CHUNK]
    if len(first_sealed) == min(SEALED_CHUNK, layout.body):
        opened = OpenedHeader(header, nonce, identities)
        chunk0 = opened.open_chunk(0, first_sealed, layout.chunks == 1)
        if marked(chunk0[: len(MARK)]):
            raise PayloadDecodeError(_COMPRESSED)
    return layout.plain_size


def _within(data: bytes, start: int, size: int | None, url: str) -> bytes:
    """`data`, the range's bytes; none (the range [start, end) is never empty) means it
    starts past the payload's end: refused as the store's 416 is, never an empty file.

    Raises:
        FetchError: status 416.
    """
    if data:
        return data
    of = f" of {size} bytes" if size is not None else ""
    raise FetchError(
        url, f"HTTP 416: the range starts at byte {start}, past the payload's end{of}", 416
    )
