"""Encrypted or compressed payloads (a placeholder's `enc` / `cmp`, or the `_enc` / `_cmp`
tags of a chunked message's chunks) decoded for a client that does not resolve placeholders
itself.

The placeholder's `size` and `sha256` describe the stored bytes; the plaintext's size is
in no placeholder (the library publishes no digest or size of the plaintext). A PUBLISH
declares its Remaining Length before its first byte, so the payload is decoded whole first:
fetched, decrypted with the proxy's `identity_files` and decompressed by the library's own
streaming decoder (:class:`client.Decoder`: age in 64 KiB chunks, zstd frames), on a worker
thread one MiB at a time, into memory up to :data:`IN_MEMORY` and a temporary file beyond.
It never grows past `max_decoded_bytes` nor past what the client's Maximum Packet Size
leaves for the payload (a decompression bomb stops there). Only once the stored bytes match
the placeholder's SHA-256 and the decoding ended cleanly does the PUBLISH go out, with the
plaintext's size, so a client never gets part of a payload.

Whenever that cannot be done the client gets the placeholder as the broker sent it (small,
what the library, `offload fetch` or an HTTP GET can resolve), as for every other payload
the proxy cannot deliver whole; the reason is counted in
`offload_proxy_placeholders_passed{why}`: `no-identity` (an encrypted payload and no
identity of the proxy's opens it), `too-large` (it decodes past `max_decoded_bytes`),
`client-limit` (past the client's Maximum Packet Size), `undecodable` (damaged or tampered),
`fetch-failed`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from client import Decoder, chunk_encoding
from client.protocol import (
    DecompressionBomb,
    NoMatchingIdentity,
    PayloadDecodeError,
    Placeholder,
    PublishProperties,
    TraceContext,
)

from ._exceptions import TransferFailed
from ._state import Conn, Services
from ._stream import drain_within, write_piece
from ._tracing import start_fetch
from .protocol import Head, PublishHeader, resolved_head, resolved_size

log = logging.getLogger("proxy")

#: Decoded bytes kept in memory; beyond, the rest waits in a temporary file.
IN_MEMORY = 1 << 20
#: Stored bytes handed to the worker thread at once, and the pieces the plaintext goes out in.
BATCH = 1 << 20


class TooLarge(PayloadDecodeError):
    """The plaintext passed its bound."""


class Plaintext:
    """A decoded payload: in memory up to :data:`IN_MEMORY`, then in a temporary file."""

    def __init__(self, limit: int, spool_dir: Path | None) -> None:
        self._limit = limit
        self._spool_dir = spool_dir
        self._memory: list[bytes] = []
        self._file: BinaryIO | None = None
        self._path: Path | None = None
        self.size = 0

    def write(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.size > self._limit:
            raise TooLarge(f"the payload decodes past {self._limit} bytes")
        if self._file is None and self.size > IN_MEMORY:
            fd, name = tempfile.mkstemp(prefix="offload-proxy-", dir=self._spool_dir)
            self._path, self._file = Path(name), os.fdopen(fd, "w+b")
            self._file.writelines(self._memory)
            self._memory = []
        if self._file is not None:
            self._file.write(piece)
        else:
            self._memory.append(piece)

    def pieces(self) -> Iterator[bytes]:
        if self._file is None:
            yield from self._memory
            return
        self._file.flush()
        self._file.seek(0)
        while piece := self._file.read(BATCH):
            yield piece

    def close(self) -> None:
        self._memory = []
        if self._file is not None:
            self._file.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)


async def _decode(
    conn: Conn, services: Services, ref: Placeholder, limit: int, trace: TraceContext | None
) -> Plaintext:
    """The checked, decoded payload of `ref` (the caller closes it); `trace` goes with
    the GET.

    Raises:
        TransferFailed: the fetch failed, or the stored bytes do not match the placeholder.
        PayloadDecodeError: no identity opens it, it is damaged, or it passes `limit`.
    """
    decoder = Decoder(ref.encoding, services.identities, limit)
    plain = Plaintext(limit, services.settings.spool_dir)

    def step(batch: list[bytes], last: bool) -> None:
        for piece in batch:
            for out in decoder.feed(piece):
                plain.write(out)
        if last:
            for out in decoder.finish():
                plain.write(out)

    try:
        async with services.gateway.fetch(ref, conn.auth, conn.peer, trace) as fetched:
            batch: list[bytes] = []
            held = 0
            async for piece in fetched:
                services.metrics.bytes_down.inc(len(piece))
                batch.append(piece)
                held += len(piece)
                if held >= BATCH:
                    await asyncio.to_thread(step, batch, False)
                    batch, held = [], 0
            if fetched.size != ref.size or fetched.sha256 != ref.sha256:
                services.poisoned.add(ref)
                raise TransferFailed(f"{ref.payload_url} does not match its placeholder")
            await asyncio.to_thread(step, batch, True)
    except BaseException:
        plain.close()
        raise
    return plain


async def decode_chunked(
    services: Services, properties: PublishProperties, payload: bytes, limit: int
) -> Plaintext | None:
    """A reassembled chunked message decoded on a worker thread when its chunks' `_enc` /
    `_cmp` tags say it was sealed (the caller closes the result); None when untagged.

    Raises:
        MalformedPlaceholder: a tag the library does not know.
        PayloadDecodeError: no identity opens it, it is damaged, or it passes `limit`.
    """
    encoding = chunk_encoding(properties)
    if encoding is None:
        return None
    plain = Plaintext(limit, services.settings.spool_dir)

    def run() -> None:
        decoder = Decoder(encoding, services.identities, limit)
        for start in range(0, len(payload), BATCH):
            for out in decoder.feed(payload[start : start + BATCH]):
                plain.write(out)
        for out in decoder.finish():
            plain.write(out)

    try:
        await asyncio.to_thread(run)
    except BaseException:
        plain.close()
        raise
    return plain


def why_not_decoded(exc: BaseException, client_bound: bool) -> str:
    if isinstance(exc, NoMatchingIdentity):
        return "no-identity"
    if isinstance(exc, TooLarge | DecompressionBomb):
        return "client-limit" if client_bound else "too-large"
    if isinstance(exc, TransferFailed):
        return "fetch-failed"
    return "undecodable"


async def resolve_encoded(
    conn: Conn, services: Services, head: Head, header: PublishHeader, ref: Placeholder
) -> bool:
    """Write the PUBLISH with the decoded payload; False when the placeholder should go as
    it is (the reason counted and logged).

    The fetch is a `fetch {topic}` span as a plain payload's is (proxy/_tracing.py), from
    the wait for a fetch slot to the last byte written.
    """
    v5 = conn.connect.v5
    room = conn.client_limit - resolved_size(header, 0, v5=v5) - 3  # varint may grow 3 bytes
    limit = min(services.settings.max_decoded_bytes, room)
    if ref.encoding.encrypted and not services.identities:
        services.metrics.passed.labels(why="no-identity").inc()
        log.info("encrypted payload, no identity_files: placeholder delivered")
        return False
    span = start_fetch(
        services.tracing, services.metrics.fetch_seconds,
        header=header, ref=ref, topic=header.topic_text,
    )  # fmt: skip
    conn.transfers += 1  # until the last byte is written: shutdown waits for it
    try:
        async with services.fetches.held(conn.holder, wait=True):  # the device's share
            try:
                plain = await _decode(conn, services, ref, limit, span.context)
            except (TransferFailed, PayloadDecodeError) as exc:
                span.fail(exc)
                why = why_not_decoded(exc, client_bound=room < services.settings.max_decoded_bytes)
                services.metrics.passed.labels(why=why).inc()
                log.warning("payload not decoded; placeholder delivered", extra={"why": str(exc)})
                return False
        try:
            if resolved_size(header, plain.size, v5=v5) > conn.client_limit:
                services.metrics.passed.labels(why="client-limit").inc()
                return False
            writer = conn.client_writer
            writer.write(resolved_head(head.first, header, plain.size, v5=v5))
            for piece in plain.pieces():
                await write_piece(writer, piece, conn.client.idle)
            await drain_within(writer, conn.client.idle)
        finally:
            plain.close()
    finally:
        conn.transfers -= 1
        span.end()
    services.metrics.resolved.inc()
    if services.lifecycle is not None:  # delivered whole, verified: its group's (_lifecycle)
        services.lifecycle.confirm_soon(ref, conn.auth)
    return True
