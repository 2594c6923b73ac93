"""`offload fetch URL --range START-END`: a byte range of the payload, reading only what it needs.

For a plain payload (or with `--raw`) it is one HTTP Range request for those stored bytes. For
an age file the range is of the plaintext: one request for the head of the object (the age
header, its nonce and the first chunk, which tells a compressed payload), then one for
exactly the 64 KiB chunks that hold the range (:func:`client.http._range.age_range`, as
`Client.fetch_range` reads them). A compressed payload has no plaintext offsets to seek to:
fetch it whole.

The requests are those of every other fetch (:class:`client.http._range.RangeReader` on the
command's :class:`client.http._transport.HttpTransport`): its CA file and client certificate,
its login sent to the URL named (as `curl -u`), redirects followed like `curl -L` without it,
and an answer that is not exactly the range asked for refused, never read whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core._exceptions import PayloadDecodeError
from ..http._range import RangeReader, age_range
from ..protocol._age import NONCE, SEALED_CHUNK, Layout, OpenedHeader
from ..protocol._age_header import Header
from ..protocol._age_keys import Identity
from ..protocol._zstd import MARK, marked

HEAD = 128 * 1024  # the first request: an age header (usually < 1 KiB), nonce, chunk 0
_AGE_MAGIC = b"age-encryption.org/v1\n"
_COMPRESSED = "--range of a compressed payload: fetch it whole, or --raw"


def fetch_range(
    reader: RangeReader, start: int, end: int, identities: Sequence[Identity], *, raw: bool
) -> tuple[bytes, int]:
    """Payload bytes [start, end) and how many stored bytes were read for them.

    Args:
        reader: the payload URL's reader, its size not known yet.
        start: the first byte.
        end: one past the last; past the payload's end reads up to it.
        identities: for an age file.
        raw: the stored bytes, not decoded.

    Raises:
        FetchError: the server failed or does not answer ranges exactly.
        PayloadDecodeError: no identity, a damaged object, or a compressed payload.
    """
    if raw:
        data = reader.first(start, end)
        return data, len(data)
    head = reader.first(0, HEAD)
    total = reader.size
    assert total is not None  # the first answer told it
    if marked(head):
        raise PayloadDecodeError(_COMPRESSED)
    if not head.startswith(_AGE_MAGIC):
        stop = min(end, total)
        if stop <= len(head):  # read already
            return head[start:stop], len(head)
        data = reader.get(start, stop) if start < stop else b""
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
                raise PayloadDecodeError(_COMPRESSED)
    plain, read = age_range(reader.get, total, start, end, identities, head=head)
    return plain, len(head) + read
