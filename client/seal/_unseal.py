"""The receive side of end-to-end encryption and compression: stored bytes back to a payload.

A placeholder's `enc` / `cmp` members (:mod:`client.protocol._encoding`) say what was done;
the stored bytes are fetched and checked against the placeholder's SHA-256 as for any
payload, then decrypted with the configured identities and decompressed, in one streaming
pass into memory (up to `spool_threshold`) or a spool file. The plaintext is never larger
than `max_fetch_bytes` (a decompression bomb stops there).

`offload fetch URL` has no placeholder: :class:`Decoder` with `sniff=True` recognises an age
file by its version line and our zstd frames by their leading skippable frame.

Every failure is a :class:`PayloadDecodeError` (no identity matches, naming the key ids;
truncated or tampered; a bomb), which the receive path hands out as a MessageError.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ..config._keys import load_identities
from ..config._settings import ClientSettings
from ..core._exceptions import NoMatchingIdentity
from ..core._message import Payload
from ..protocol import PublishProperties
from ..protocol._encoding import Encoding
from ..protocol._zstd import MARK, FrameDecompressor, marked

if TYPE_CHECKING:
    from ..protocol._age import Decryptor
    from ..protocol._age_keys import Identity

PIECE = 1 << 20
_AGE_MAGIC = b"age-encryption.org/v1\n"
_SNIFF = max(len(_AGE_MAGIC), len(MARK))


class Decoder:
    """Stored bytes in, plaintext pieces out (decrypt, then decompress), bounded.

    Args:
        encoding: what was done (from the placeholder); ignored with `sniff`.
        identities: tried on an encrypted payload.
        limit: the most plaintext bytes (`max_fetch_bytes`).
        sniff: tell age files and our zstd frames by their first bytes (no placeholder).
    """

    def __init__(
        self,
        encoding: Encoding,
        identities: Sequence[Identity],
        limit: int,
        *,
        sniff: bool = False,
    ) -> None:
        self._identities = identities
        self._key_ids = encoding.key_ids
        self._limit = limit
        self._sniff = sniff
        self._head = b""
        self._decryptor: Decryptor | None = None
        self._decompressor: FrameDecompressor | None = None
        self._inner_head = b""
        self._compressed = encoding.compressed
        self.size = 0
        if not sniff:
            self._start(encoding.encrypted)

    def plain_size(self, stored_size: int) -> int | None:
        """The plaintext's exact size, once the age header has been read, for a payload
        that is only encrypted (a `stored_size`-byte age file); None otherwise.

        Raises:
            DecryptionFailed: `stored_size` cannot be an age file behind that header.
        """
        decryptor = self._decryptor
        if decryptor is None or self._compressed or self._sniff:
            return None
        if decryptor.header_length is None:
            return None
        from ..protocol._age import Layout

        return Layout.of(decryptor.header_length, stored_size).plain_size

    def feed_into(self, data: bytes | memoryview, out: memoryview) -> int | None:
        """As :meth:`feed`, the plaintext written straight into `out` (room for all of it):
        its length; None (nothing done) unless the payload is only encrypted and its
        header has been read."""
        decryptor = self._decryptor
        if decryptor is None or self._compressed or self._sniff or decryptor.header_length is None:
            return None
        n = decryptor.feed_into(data, out)
        self.size += n
        return n

    def _start(self, encrypted: bool) -> None:
        if encrypted:
            from ..protocol._age import Decryptor

            if not self._identities and not self._sniff:  # before a byte is fetched
                raise NoMatchingIdentity(self._key_ids, ())
            # Sniffed (no placeholder): the header names how many recipients it has, and
            # the decryptor says so when none of ours (none at all, here) opens it.
            self._decryptor = Decryptor(self._identities, self._key_ids)
        if self._compressed and not self._sniff:
            self._decompressor = FrameDecompressor(self._limit)

    def feed(self, data: bytes | memoryview) -> Iterator[bytes]:
        """The plaintext `data` completes (no view of `data` is kept or yielded)."""
        if self._sniff and self._head is not None:
            self._head += data
            if len(self._head) < _SNIFF:
                return
            data, self._head = self._head, None  # type: ignore[assignment]
            self._start(data.startswith(_AGE_MAGIC))
        yield from self._plain(data)

    def _plain(self, data: bytes | memoryview) -> Iterator[bytes]:
        """Through the decryptor, one 64 KiB chunk at a time, when there is one."""
        if self._decryptor is None:
            yield from self._inner(data)
            return
        for chunk in self._decryptor.feed_pieces(data):
            yield from self._inner(chunk)

    def _inner(self, plain: bytes | memoryview) -> Iterator[bytes]:
        if self._sniff and self._inner_head is not None:
            self._inner_head += plain
            if len(self._inner_head) < len(MARK):
                return
            plain, self._inner_head = self._inner_head, None  # type: ignore[assignment]
            if marked(plain):
                self._decompressor = FrameDecompressor(self._limit)
        if self._decompressor is not None:
            for piece in self._decompressor.feed(plain):
                self.size += len(piece)
                yield piece
        elif plain:
            self.size += len(plain)
            yield plain if isinstance(plain, bytes) else bytes(plain)

    def finish(self) -> Iterator[bytes]:
        """The rest; the stream must be complete (else DecryptionFailed / DecompressionFailed)."""
        if self._sniff and self._head is not None:  # shorter than the sniff
            head, self._head = self._head, None  # type: ignore[assignment]
            self._start(head.startswith(_AGE_MAGIC))
            yield from self._plain(head)
        if self._decryptor is not None:
            yield from self._inner(self._decryptor.finish())
        if self._sniff and self._inner_head is not None:
            rest, self._inner_head = self._inner_head, None  # type: ignore[assignment]
            if rest:
                self.size += len(rest)
                yield rest
        if self._decompressor is not None:
            self._decompressor.finish()


def recognised(head: bytes) -> bool:
    """Whether stored bytes starting with `head` are an age file or our zstd frames."""
    return head.startswith(_AGE_MAGIC) or marked(head)


def decode_stream(source: BinaryIO, decoder: Decoder) -> Iterator[bytes]:
    """Every plaintext piece of `source` through `decoder`."""
    while piece := source.read(PIECE):
        yield from decoder.feed(piece)
    yield from decoder.finish()


def chunk_encoding(properties: PublishProperties) -> Encoding | None:
    """The encoding an ADR-23 message's tags name (client/seal/_seal.py), None when untagged.

    Raises:
        MalformedPlaceholder: a tag this client does not know.
    """
    from ._seal import CMP_PROPERTY, ENC_PROPERTY

    enc, cmp = properties.user_property(ENC_PROPERTY), properties.user_property(CMP_PROPERTY)
    if enc is None and cmp is None:
        return None
    return Encoding.from_members({"enc": enc, "cmp": cmp})


def untagged(properties: PublishProperties) -> PublishProperties:
    """The properties the producer set, without the encoding's tags."""
    from ._seal import CMP_PROPERTY, ENC_PROPERTY

    return properties.without_user_properties(ENC_PROPERTY, CMP_PROPERTY)


class _Plain:
    """Plaintext pieces kept in memory up to `spool_threshold`, past it in a spool file.

    Args:
        settings: `spool_threshold`, `spool_dir`.
        spool: straight to a file (the stored bytes were spooled: so is their plaintext).
        size: the plaintext's exact size, when known ahead: up to `spool_threshold` the
            pieces are copied into one buffer of that size, handed over without the copy
            a join of the pieces makes (and with no list of pieces meanwhile); past it,
            straight to a file.
    """

    def __init__(
        self, settings: ClientSettings, *, spool: bool = False, size: int | None = None
    ) -> None:
        self._settings = settings
        self._memory: list[bytes] | None = []
        self._held = 0
        self._file: BinaryIO | None = None
        self._path: Path | None = None
        self._buffer: io.BytesIO | None = None
        if spool or (size is not None and size > settings.spool_threshold):
            self._spill()
        elif size is not None:
            # calloc'd: untouched until written; getvalue() then hands it over as is.
            self._buffer = io.BytesIO(bytes(size))
            self._memory = None
        self._size = size

    def _spill(self) -> None:
        fd, name = tempfile.mkstemp(prefix="offload-", dir=self._settings.spool_dir)
        self._path, self._file = Path(name), os.fdopen(fd, "wb")
        if self._memory:
            self._file.writelines(self._memory)
        self._memory = None

    def fill(self, fill: Callable[[memoryview], int | None]) -> bool:
        """Let `fill` write into the buffer at the end of what is written (it returns how
        much it wrote); False when there is no buffer or `fill` returns None."""
        if self._buffer is None:
            return False
        at = self._buffer.tell()
        with self._buffer.getbuffer() as view:
            n = fill(view[at:])
        if n is None:
            return False
        self._buffer.seek(at + n)
        return True

    def write(self, piece: bytes) -> None:
        if self._buffer is not None:
            self._buffer.write(piece)
            return
        if self._memory is not None and self._held + len(piece) > self._settings.spool_threshold:
            self._spill()
        if self._memory is not None:
            self._memory.append(piece)
            self._held += len(piece)
        else:
            assert self._file is not None
            self._file.write(piece)

    def payload(self) -> Payload:
        """What was written, as a Payload (the spool file handed over)."""
        if self._buffer is not None:
            if self._buffer.tell() != self._size:
                self._buffer.truncate()  # fewer bytes than announced: only what was written
            return Payload(self._buffer.getvalue())
        if self._memory is not None:
            return Payload(b"".join(self._memory))
        assert self._file is not None
        self._file.close()
        return Payload(path=self._path)

    def discard(self) -> None:
        self._memory = self._buffer = None
        if self._file is not None:
            self._file.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)


def _detached(exc: Exception) -> Exception:
    """`exc` without tracebacks down its chain: their frames may hold views of a buffer
    that must be released before it is handed over (client/http/_fetching.py, `_read_into`)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return exc


class Decoding:
    """Stored bytes decoded as a fetch receives them (:meth:`HttpTransport.fetch`'s `tap`).

    :meth:`feed` runs on the fetch's hashing thread and never raises: a failure is kept
    and raised by :meth:`result`, which the caller calls only after the fetch has checked
    the stored bytes' SHA-256, so nothing decoded from unverified bytes is handed out.

    Only an encrypted payload is decoded on the way. A payload that is only compressed is
    decoded from the verified stored bytes in :meth:`result`, as before: its few stored
    bytes arrive quickly and inflate 4-8 times, and decompressing beside the reader made
    the 64 MiB JSON round trip slower in 7 of 8 paired runs (bench/RESULTS.md, issue 30).

    The stored bytes of an encrypted payload are not kept (:attr:`keeps_stored` is False:
    the fetch only hashes and taps them), and an encrypted payload that is not compressed
    has a plaintext size known from its header: up to `spool_threshold` it is decrypted
    into one buffer of that size, past it straight into a spool file. Keeping the stored
    bytes too, and deciding by their size, had spooled both to disk for a payload of
    exactly `spool_threshold` (bench/RESULTS.md, "Issue 30").

    Args:
        settings: `spool_threshold`, `spool_dir`.
        decoder: the payload's decoder.
        deferred: decode in :meth:`result`, from the stored bytes (`feed` does nothing).
        size: the stored bytes' size (the placeholder's).
    """

    def __init__(
        self, settings: ClientSettings, decoder: Decoder, *, deferred: bool, size: int
    ) -> None:
        self._settings = settings
        self._decoder = decoder
        self._deferred = deferred
        self._size = size
        self._digest = hashlib.sha256()
        self._plain: _Plain | None = None  # made with the first plaintext
        self._error: Exception | None = None

    @property
    def keeps_stored(self) -> bool:
        """Whether :meth:`result` needs the stored bytes (else the fetch need not keep them)."""
        return self._deferred

    def _sink(self) -> _Plain:
        if self._plain is None:
            # A compressed payload's plaintext size is unknown: in memory until it passes
            # `spool_threshold`, or on disk from the start when the stored bytes alone do.
            exact = self._decoder.plain_size(self._size)
            spool = exact is None and self._size > self._settings.spool_threshold
            self._plain = _Plain(self._settings, spool=spool, size=exact)
        return self._plain

    def feed(self, batch: Sequence[bytes | memoryview]) -> None:
        """Decode `batch` (no view of it is kept)."""
        if self._deferred or self._error is not None:
            return
        try:
            for piece in batch:
                if self._plain is not None and self._plain.fill(partial(self._into, piece)):
                    continue  # decrypted in place (the header was read: the buffer exists)
                for plain in self._decoder.feed(piece):
                    self._digest.update(plain)
                    self._sink().write(plain)
        except Exception as exc:  # raised by result(), on the caller's thread
            self._error = _detached(exc)

    def _into(self, piece: bytes | memoryview, out: memoryview) -> int | None:
        n = self._decoder.feed_into(piece, out)
        if n:
            self._digest.update(out[:n])
        return n

    def result(self, stored: Payload) -> tuple[Payload, str]:
        """The plaintext and its SHA-256; `stored` (verified by the fetch) is discarded.

        Raises:
            PayloadDecodeError: see the module's docstring.
        """
        if self._deferred:
            return _decoded(self._settings, self._decoder, stored)
        stored.discard()
        try:
            if self._error is not None:
                raise self._error
            for plain in self._decoder.finish():
                self._digest.update(plain)
                self._sink().write(plain)
            plain_payload = self._sink().payload()
        except BaseException:
            self.discard()
            raise
        return plain_payload, self._digest.hexdigest()

    def discard(self) -> None:
        """Drop what was decoded (the fetch failed)."""
        if self._plain is not None:
            self._plain.discard()


def _decoded(settings: ClientSettings, decoder: Decoder, stored: Payload) -> tuple[Payload, str]:
    """`stored` through `decoder` in one pass into memory or a spool file; discarded after."""
    try:
        digest = hashlib.sha256()
        # Spooled stored bytes: the plaintext goes to disk too.
        plain = _Plain(settings, spool=stored.path is not None)
        try:
            with stored.open() as f:
                for piece in decode_stream(f, decoder):
                    digest.update(piece)
                    plain.write(piece)
        except BaseException:
            plain.discard()
            raise
    finally:
        stored.discard()
    return plain.payload(), digest.hexdigest()


class Unsealer:
    """Decodes the payloads of encrypted or compressed placeholders for a client.

    Args:
        settings: `identity_files` (read once, here), `max_fetch_bytes`, `spool_threshold`,
            `spool_dir`.

    Raises:
        ConfigError: an identity file that cannot be read or holds no identity.
    """

    def __init__(self, settings: ClientSettings) -> None:
        self._settings = settings
        self.identities = load_identities(settings.identity_files)

    def decoding(self, encoding: Encoding, size: int) -> Decoding:
        """A decoder to tap a fetch of `encoding`'s stored bytes with.

        Args:
            encoding: from the placeholder.
            size: the stored bytes' size (the placeholder's): with the header, the
                plaintext's size, which decides between memory and a spool file.

        Raises:
            NoMatchingIdentity: an encrypted payload and no identity (before any fetch).
        """
        s = self._settings
        decoder = Decoder(encoding, self.identities, s.max_fetch_bytes)
        return Decoding(s, decoder, deferred=not encoding.encrypted, size=size)

    def decode(
        self, encoding: Encoding, stored: Payload, *, sniff: bool = False
    ) -> tuple[Payload, str]:
        """The plaintext payload and its SHA-256 (the stored one is checked already).

        Args:
            encoding: from the placeholder (ignored with `sniff`).
            stored: the stored bytes; discarded once decoded.
            sniff: tell the encoding by the first bytes (no placeholder).

        Raises:
            PayloadDecodeError: see the module's docstring.
        """
        s = self._settings
        try:
            decoder = Decoder(encoding, self.identities, s.max_fetch_bytes, sniff=sniff)
        except BaseException:
            stored.discard()
            raise
        return _decoded(s, decoder, stored)
