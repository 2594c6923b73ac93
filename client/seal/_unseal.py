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
import os
import tempfile
from collections.abc import Iterator, Sequence
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

    def _start(self, encrypted: bool) -> None:
        if encrypted:
            from ..protocol._age import Decryptor

            if not self._identities:
                raise NoMatchingIdentity(self._key_ids, (), 0)
            self._decryptor = Decryptor(self._identities, self._key_ids)
        if self._compressed and not self._sniff:
            self._decompressor = FrameDecompressor(self._limit)

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The plaintext `data` completes."""
        if self._sniff and self._head is not None:
            self._head += data
            if len(self._head) < _SNIFF:
                return
            data, self._head = self._head, None  # type: ignore[assignment]
            self._start(data.startswith(_AGE_MAGIC))
        yield from self._plain(data)

    def _plain(self, data: bytes) -> Iterator[bytes]:
        """Through the decryptor, one 64 KiB chunk at a time, when there is one."""
        if self._decryptor is None:
            yield from self._inner(data)
            return
        for chunk in self._decryptor.feed_pieces(data):
            yield from self._inner(chunk)

    def _inner(self, plain: bytes) -> Iterator[bytes]:
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
            yield plain

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
        decoder = Decoder(encoding, self.identities, s.max_fetch_bytes, sniff=sniff)
        digest = hashlib.sha256()
        memory: list[bytes] | None = []
        held = 0
        spool: BinaryIO | None = None
        path: Path | None = None
        try:
            if stored.path is not None:  # spooled stored bytes: the plaintext goes to disk too
                fd, name = tempfile.mkstemp(prefix="offload-", dir=s.spool_dir)
                path, spool, memory = Path(name), os.fdopen(fd, "wb"), None
            with stored.open() as f:
                for piece in decode_stream(f, decoder):
                    digest.update(piece)
                    if memory is not None and held + len(piece) > s.spool_threshold:
                        fd, name = tempfile.mkstemp(prefix="offload-", dir=s.spool_dir)
                        path, spool = Path(name), os.fdopen(fd, "wb")
                        spool.writelines(memory)
                        memory = None
                    if memory is not None:
                        memory.append(piece)
                        held += len(piece)
                    else:
                        assert spool is not None
                        spool.write(piece)
            if spool is not None:
                spool.close()
        except BaseException:
            if spool is not None:
                spool.close()
            if path is not None:
                path.unlink(missing_ok=True)
            raise
        finally:
            stored.discard()
        payload = Payload(b"".join(memory)) if memory is not None else Payload(path=path)
        return payload, digest.hexdigest()
