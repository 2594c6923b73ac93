"""The age v1 file format (age-encryption.org/v1), X25519 recipients only. Pure, streaming.

A published format rather than one of our own (docs/security.md says why): a fresh 16-byte
file key per message, wrapped for each recipient (X25519, HKDF-SHA256, ChaCha20-Poly1305), a
header MAC under the file key, then the payload as 64 KiB ChaCha20-Poly1305 STREAM chunks
(11-byte counter, a last-chunk flag). Debian's `age` and the `pyrage` package read and write
the same bytes::

    age-encryption.org/v1
    -> X25519 <ephemeral share, base64>
    <wrapped file key, base64>
    --- <header MAC, base64>
    <16-byte nonce><chunk 0: 64 KiB + 16-byte tag>...<last chunk: 0..64 KiB + tag>

:class:`Encryptor` and :class:`Decryptor` take bytes and give bytes, holding at most one
chunk: any size flows through in bounded memory. Every chunk has a fixed place, so
:class:`OpenedHeader` decrypts any run of chunks on its own (HTTP Range reads).

The header (its parser, bounds, MAC and writer) is :mod:`client.protocol._age_header`.
Everything read is hostile: every failure is a :class:`DecryptionFailed` or
:class:`NoMatchingIdentity`, never another exception.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from ._age_header import Header, encode_header
from ._age_keys import Identity, Recipient, hkdf
from ._errors import DecryptionFailed

CHUNK = 64 * 1024  # plaintext bytes per STREAM chunk
TAG = 16
SEALED_CHUNK = CHUNK + TAG
NONCE = 16  # the payload nonce after the header


def _payload_cipher(file_key: bytes, nonce: bytes) -> ChaCha20Poly1305:
    return ChaCha20Poly1305(hkdf(file_key, nonce, b"payload"))


def _chunk_nonce(index: int, last: bool) -> bytes:
    if index >= 1 << 88:
        raise DecryptionFailed("age payload: chunk counter overflow")
    return index.to_bytes(11, "big") + (b"\x01" if last else b"\x00")


def sealed_size(header_length: int, plain_size: int) -> int:
    """The size of an age file of `plain_size` plaintext bytes behind a `header_length`
    header: the nonce, then a tag per 64 KiB chunk (one chunk at least, a full last
    chunk never followed by an empty one). The inverse of :meth:`Layout.of`."""
    chunks = max(1, -(-plain_size // CHUNK))
    return header_length + NONCE + plain_size + chunks * TAG


class Encryptor:
    """Encrypts a stream to recipients: bytes in, age bytes out, one chunk held at most.

    Args:
        recipients: at least one.
        file_key, nonce: for test vectors only; fresh random ones otherwise.
    """

    def __init__(
        self,
        recipients: Sequence[Recipient],
        *,
        file_key: bytes | None = None,
        nonce: bytes | None = None,
    ) -> None:
        file_key = file_key or os.urandom(16)
        nonce = nonce or os.urandom(NONCE)
        header = encode_header(file_key, recipients)
        self.header_length = len(header)
        self._pending = header + nonce
        self._cipher = _payload_cipher(file_key, nonce)
        self._buffer = bytearray()
        self._index = 0
        self._finished = False

    def feed(self, data: bytes | bytearray | memoryview) -> bytes:
        """The age bytes ready after `data` (the header first), as one object.

        Each chunk is sealed straight into it (no object per chunk, no join): for a piece
        of about 1 MiB, the size a :class:`~client.seal._seal.SealedStream` feeds; a
        larger one allocates (and page-faults) its whole output at once, which
        :meth:`feed_pieces` avoids.
        """
        pending, self._pending = self._pending, b""
        view = memoryview(data)
        chunks = max(0, (len(self._buffer) + len(view) - 1) // CHUNK)
        out = io.BytesIO(bytes(len(pending) + chunks * SEALED_CHUNK))
        with out.getbuffer() as target:
            target[: len(pending)] = pending
            at = len(pending)
            for chunk in self._chunks(view):
                self._cipher.encrypt_into(
                    _chunk_nonce(self._index, False), chunk, None, target[at : at + SEALED_CHUNK]
                )
                self._index += 1
                at += SEALED_CHUNK
        return out.getvalue()

    def feed_pieces(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """As :meth:`feed`, one piece per chunk: no large buffer is allocated (and page-
        faulted) per call, which cost streams four times the cipher's own work."""
        out = [self._pending] if self._pending else []
        self._pending = b""
        out.extend(self._seal(chunk, False) for chunk in self._chunks(memoryview(data)))
        return out

    def _chunks(self, view: memoryview) -> Iterator[bytes | bytearray | memoryview]:
        """The whole chunks of plaintext that `view` completes, the buffered bytes first;
        the rest is buffered. A full chunk waits until a byte follows it, since the last
        chunk carries a flag: every chunk yielded is not the last."""
        if self._buffer:
            need = CHUNK - len(self._buffer)
            if len(view) <= need:
                self._buffer += view
                return
            self._buffer += view[:need]
            view = view[need:]
            yield self._buffer
            self._buffer = bytearray()
        start = 0  # sealed straight from the caller's bytes
        while len(view) - start > CHUNK:
            yield view[start : start + CHUNK]
            start += CHUNK
        self._buffer += view[start:]

    def finish(self) -> bytes:
        """The last chunk (the header too, for an empty payload)."""
        if self._finished:
            return b""
        self._finished = True
        out = self._pending + self._seal(bytes(self._buffer), True)
        self._pending = b""
        self._buffer.clear()
        return out

    def _seal(self, chunk: bytes | bytearray | memoryview, last: bool) -> bytes:
        sealed = self._cipher.encrypt(_chunk_nonce(self._index, last), chunk, None)
        self._index += 1
        return sealed


def encrypt(data: bytes, recipients: Sequence[Recipient]) -> bytes:
    """`data` as one age file (small payloads and tests)."""
    enc = Encryptor(recipients)
    return enc.feed(data) + enc.finish()


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the chunks of an age file of a known size are."""

    payload_start: int  # header + nonce
    chunks: int
    plain_size: int

    @classmethod
    def of(cls, header_length: int, stored_size: int) -> Layout:
        """The layout of a `stored_size`-byte file whose header is `header_length` bytes.

        Raises:
            DecryptionFailed: the sizes cannot be an age file.
        """
        body = stored_size - header_length - NONCE
        if body < TAG:
            raise DecryptionFailed("age file truncated: no payload chunk")
        chunks = -(-body // SEALED_CHUNK)
        if body - (chunks - 1) * SEALED_CHUNK < TAG + (1 if chunks > 1 else 0):
            raise DecryptionFailed("age file truncated inside a chunk tag")
        return cls(header_length + NONCE, chunks, body - chunks * TAG)

    def span(self, start: int, end: int) -> tuple[int, int, int]:
        """The stored byte range `[a, b)` and first chunk index that hold plaintext
        bytes `[start, end)`."""
        end = min(end, self.plain_size)
        first = start // CHUNK
        last = max(first, (max(end, start + 1) - 1) // CHUNK)
        last = min(last, self.chunks - 1)
        a = self.payload_start + first * SEALED_CHUNK
        b = min(self.payload_start + (last + 1) * SEALED_CHUNK, self.payload_start + self.body)
        return a, b, first

    @property
    def body(self) -> int:
        return self.plain_size + self.chunks * TAG


class OpenedHeader:
    """A header opened with an identity: decrypts any chunk on its own (Range reads).

    Args:
        header: the parsed header.
        nonce: the 16 bytes after it.
        identities: tried in order.
        key_ids: the recipients' ids the placeholder names, for the error.
    """

    def __init__(
        self,
        header: Header,
        nonce: bytes,
        identities: Sequence[Identity],
        key_ids: tuple[str, ...] = (),
    ) -> None:
        self.header = header
        self._cipher = _payload_cipher(header.open(identities, key_ids), nonce)

    def open_chunk(self, index: int, sealed: bytes | bytearray | memoryview, last: bool) -> bytes:
        """Chunk `index`'s plaintext.

        Raises:
            DecryptionFailed: tampered, truncated, or not the last chunk when `last`.
        """
        self._check(index, sealed, last)
        try:
            return self._cipher.decrypt(_chunk_nonce(index, last), sealed, None)
        except InvalidTag:
            raise self._failed(index) from None

    def open_chunk_into(
        self,
        index: int,
        sealed: bytes | bytearray | memoryview,
        last: bool,
        out: memoryview,
    ) -> int:
        """As :meth:`open_chunk`, the plaintext written to the start of `out`: its length.

        On a failure `out` may hold unauthenticated bytes: the caller drops it.
        """
        self._check(index, sealed, last)
        n = len(sealed) - TAG
        if len(out) < n:
            raise DecryptionFailed("age payload: more chunks than its size holds")
        try:
            self._cipher.decrypt_into(_chunk_nonce(index, last), sealed, None, out[:n])
        except InvalidTag:
            raise self._failed(index) from None
        return n

    @staticmethod
    def _check(index: int, sealed: bytes | bytearray | memoryview, last: bool) -> None:
        if not TAG <= len(sealed) <= SEALED_CHUNK or (not last and len(sealed) != SEALED_CHUNK):
            raise DecryptionFailed(f"age payload: chunk {index} truncated")
        if last and len(sealed) == TAG and index > 0:
            raise DecryptionFailed("age payload: empty last chunk after data")

    @staticmethod
    def _failed(index: int) -> DecryptionFailed:
        return DecryptionFailed(
            f"age payload: chunk {index} fails authentication (tampered or truncated)"
        )

    def open_run(self, first: int, sealed: bytes, layout: Layout) -> bytes:
        """Plaintext of the consecutive chunks from `first` held in `sealed`."""
        out = []
        for n, offset in enumerate(range(0, len(sealed), SEALED_CHUNK)):
            index = first + n
            out.append(
                self.open_chunk(
                    index, sealed[offset : offset + SEALED_CHUNK], index == layout.chunks - 1
                )
            )
        return b"".join(out)


class Decryptor:
    """Decrypts an age stream: bytes in, plaintext out, one chunk held at most.

    Args:
        identities: tried in order on each X25519 stanza.
        key_ids: the recipients' ids the placeholder names, for the error.
    """

    def __init__(self, identities: Sequence[Identity], key_ids: tuple[str, ...] = ()) -> None:
        self._identities = identities
        self._key_ids = key_ids
        self._buffer = bytearray()
        self._opened: OpenedHeader | None = None
        self._index = 0
        self._finished = False
        self.header_length: int | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> bytes:
        """The plaintext ready after `data`.

        Raises:
            DecryptionFailed, NoMatchingIdentity: as soon as the bytes tell.
        """
        return b"".join(self.feed_pieces(data))

    def feed_pieces(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """As :meth:`feed`, one piece per chunk (see :meth:`Encryptor.feed_pieces`)."""
        if self._opened is None:
            self._buffer += data
            if not self._open():
                return []
            data, self._buffer = bytes(self._buffer), bytearray()
        opened = self._opened
        assert opened is not None
        out: list[bytes] = []
        for sealed in self._chunks(data):
            out.append(opened.open_chunk(self._index, sealed, False))
            self._index += 1
        return out

    def feed_into(self, data: bytes | bytearray | memoryview, out: memoryview) -> int:
        """As :meth:`feed_pieces` once the header is read (:attr:`header_length` is set),
        the plaintext decrypted straight into `out`: the bytes written. `out` has room
        for every whole chunk the buffered and new bytes hold (64 KiB each).

        Saves a fresh object per 64 KiB and a copy of it into the payload's buffer.
        """
        opened = self._opened
        if opened is None:
            raise ValueError("feed_into before the header was read")
        written = 0
        for sealed in self._chunks(data):
            written += opened.open_chunk_into(self._index, sealed, False, out[written:])
            self._index += 1
        return written

    def _chunks(self, data: bytes | bytearray | memoryview) -> Iterator[bytearray | memoryview]:
        """The whole chunks that `data` completes, each followed by more (so not the last);
        the rest is buffered. A chunk is valid only until the next is asked for."""
        view = memoryview(data)
        if self._buffer:
            need = SEALED_CHUNK - len(self._buffer)
            if len(view) <= need:
                self._buffer += view
                return
            self._buffer += view[:need]
            view = view[need:]
            yield self._buffer
            self._buffer = bytearray()
        start = 0
        while len(view) - start > SEALED_CHUNK:  # a chunk followed by more is not the last
            yield view[start : start + SEALED_CHUNK]
            start += SEALED_CHUNK
        self._buffer += view[start:]

    def _open(self) -> bool:
        header = Header.parse(self._buffer)
        if header is None or len(self._buffer) < header.length + NONCE:
            return False
        nonce = bytes(self._buffer[header.length : header.length + NONCE])
        self._opened = OpenedHeader(header, nonce, self._identities, self._key_ids)
        self.header_length = header.length
        del self._buffer[: header.length + NONCE]
        return True

    def finish(self) -> bytes:
        """The last chunk's plaintext; the stream must end here.

        Raises:
            DecryptionFailed: the file was truncated (no last chunk, or a partial one).
        """
        if self._finished:
            return b""
        if self._opened is None and not self._open():
            raise DecryptionFailed("age file truncated inside its header")
        assert self._opened is not None
        self._finished = True
        last = self._opened.open_chunk(self._index, self._buffer, True)
        self._buffer.clear()
        return last


def decrypt(data: bytes, identities: Sequence[Identity]) -> bytes:
    """A whole age file's plaintext (small payloads and tests)."""
    dec = Decryptor(identities)
    return dec.feed(data) + dec.finish()
