"""The publish side of end-to-end encryption and compression: a payload as it is stored.

An offloaded payload whose topic matches `encrypt_to` is encrypted to those recipients (age
v1, :mod:`client.protocol._age`) before it leaves the process; one that compresses well is
zstd-compressed first (:mod:`client.protocol._zstd`). Both happen in one streaming pass over
the payload into memory (a payload up to `spool_threshold`) or a file in `spool_dir`, which
then goes out on whichever path the upload takes (a direct transfer, ADR-23 chunks). The
placeholder's `size` and `sha256` describe those stored bytes; the plaintext's SHA-256 is
computed in the same pass for the :class:`PublishResult` and never published.

An upload through the gateway needs no random access, so there an encrypted payload is
sealed while it is sent (:class:`SealedStream`): the age file's size follows from the
plaintext's (:func:`~client.protocol._age.sealed_size`), its SHA-256 is taken on the way
and is known when the upload ends, before the placeholder is published. Compression's
output size is not known in advance: a compressed payload is compressed into the spool
first (its smaller bytes), then encrypted while sent.

Compression is decided per payload: on (`compress`), not excluded (`no_compress`), and
a sample of its first :data:`~client.protocol._zstd.SAMPLE` bytes shrinks. It is off for
encrypted payloads unless `compress_encrypted` (docs/security.md: sizes leak secrets).
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ..config._keys import recipients_for
from ..config._settings import ClientSettings
from ..core._source import PIECE, PayloadSource
from ..protocol import PublishProperties, TopicFilter
from ..protocol._encoding import PLAIN, Encoding
from ..protocol._zstd import SAMPLE, FrameCompressor, pays

if TYPE_CHECKING:
    from ..protocol._age_keys import Recipient

#: ADR-23 chunks of an encrypted or compressed payload carry these user properties (the
#: placeholder's `enc` / `cmp` values), so the reassembling client knows to decode it.
ENC_PROPERTY = "_enc"
CMP_PROPERTY = "_cmp"


def tagged(properties: PublishProperties | None, encoding: Encoding) -> PublishProperties:
    """`properties` with the encoding's user properties added (for ADR-23 chunks)."""
    props = (properties or PublishProperties()).without_user_properties(ENC_PROPERTY, CMP_PROPERTY)
    tags = tuple((ENC_PROPERTY if k == "enc" else CMP_PROPERTY, v)
                 for k, v in encoding.members().items() if k in ("enc", "cmp"))  # fmt: skip
    return replace(props, user_properties=props.user_properties + tags)


#: Pieces a :class:`SealedStream` seals ahead of the upload reading them.
SEAL_AHEAD = 4


class _End:
    """The worker's last item: the stream ended, or `error` stopped it."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: BaseException | None = None


class SealedStream:
    """An encrypted payload, sealed piece by piece as an upload reads it.

    Each pass of :meth:`pieces` encrypts under a fresh file key (a retried upload never
    reuses a key stream, whatever the source does meanwhile); every pass has the same size.
    Memory: about :data:`SEAL_AHEAD` + 2 pieces.

    Args:
        source: the plaintext (or the spooled compressed bytes).
        recipients: at least one.
    """

    def __init__(self, source: PayloadSource, recipients: Sequence[Recipient]) -> None:
        from ..protocol._age import Encryptor, sealed_size

        self._source = source
        self._recipients = tuple(recipients)
        self._first: Encryptor | None = Encryptor(self._recipients)
        # Every X25519 header for these recipients has this length (fixed-size stanzas).
        self.size = sealed_size(self._first.header_length, source.size)
        self._sha256: str | None = None
        self._plain_sha256: str | None = None

    @property
    def sha256(self) -> str:
        """The stored bytes' SHA-256: known once a pass of :meth:`pieces` has ended."""
        if self._sha256 is None:
            raise ValueError("the sealed stream has not been read to its end")
        return self._sha256

    @property
    def plain_sha256(self) -> str:
        """The SHA-256 of what was sealed, known as :attr:`sha256` is."""
        if self._plain_sha256 is None:
            raise ValueError("the sealed stream has not been read to its end")
        return self._plain_sha256

    def pieces(self, piece: int = PIECE) -> Iterator[bytes]:
        """The age file from the start, about one piece of plaintext at a time.

        Sealed on a worker thread up to :data:`SEAL_AHEAD` pieces ahead of the caller (the
        upload's socket writes): SHA-256 and ChaCha20-Poly1305 release the GIL, so the
        sealing overlaps the sending instead of adding to it (bench/RESULTS.md,
        "Encryption"). Closing the iterator early stops the worker.
        """
        ahead: queue.Queue[bytes | _End] = queue.Queue(SEAL_AHEAD)
        stop = threading.Event()

        def work() -> None:
            end = _End()
            try:
                for out in self._sealed(piece):
                    ahead.put(out)
                    if stop.is_set():
                        return
            except BaseException as exc:  # handed to the caller's thread
                end.error = exc
            finally:
                ahead.put(end)  # the caller drains until it: this put never blocks for good

        worker = threading.Thread(target=work, name="offload-seal", daemon=True)
        worker.start()
        item: bytes | _End = b""
        try:
            while not isinstance(item := ahead.get(), _End):
                yield item
            if item.error is not None:
                raise item.error
        finally:
            stop.set()
            while not isinstance(item, _End):  # closed early: unblock the worker's put
                item = ahead.get()
            worker.join()

    def _sealed(self, piece: int) -> Iterator[bytes]:
        from ..protocol._age import Encryptor

        encryptor, self._first = self._first or Encryptor(self._recipients), None
        plain, stored = hashlib.sha256(), hashlib.sha256()
        sent = 0
        for data in self._source.pieces(piece):
            plain.update(data)
            out = encryptor.feed(data)
            stored.update(out)
            sent += len(out)
            yield out
        out = encryptor.finish()
        stored.update(out)
        sent += len(out)
        if sent != self.size:  # a header of another length: the size sent was wrong
            raise OSError(f"sealed {sent} bytes where {self.size} were announced")
        self._sha256, self._plain_sha256 = stored.hexdigest(), plain.hexdigest()
        yield out


class Stored:
    """A payload as it is stored, with how it was encoded and the plaintext's digest.

    Args:
        source: the stored bytes (random access), or sealed as they are read.
        encoding: what was done to the payload.
        plain_size: the payload's own size.
        plain_sha256: the payload's own SHA-256; None: the stream's, once it is read (a
            payload stored as it is: the source's, hashed when first asked).
    """

    __slots__ = ("_plain_sha256", "encoding", "plain_size", "source")

    def __init__(
        self,
        source: PayloadSource | SealedStream,
        encoding: Encoding,
        plain_size: int,
        plain_sha256: str | None = None,
    ) -> None:
        self.source = source
        self.encoding = encoding
        self.plain_size = plain_size
        self._plain_sha256 = plain_sha256

    @property
    def plain_sha256(self) -> str:
        if self._plain_sha256 is not None:
            return self._plain_sha256
        if isinstance(self.source, PayloadSource):  # stored as it is: its own, once read
            return self.source.sha256
        return self.source.plain_sha256


class Sealer:
    """Decides, per topic and payload, what is done to it before it is stored.

    Args:
        settings: `encrypt_to`, `compress`, `no_compress`, `compress_encrypted`,
            `spool_threshold`, `spool_dir`.
    """

    def __init__(self, settings: ClientSettings) -> None:
        self._settings = settings
        self._no_compress = tuple(TopicFilter(f) for f in settings.no_compress)

    def encrypts(self, topic: str) -> bool:
        """Whether `topic`'s payloads are encrypted (and so only ever offloaded)."""
        return any(TopicFilter(f).matches(topic) for f, _ in self._settings.encrypt_to)

    def _compresses(self, topic: str, source: PayloadSource, encrypted: bool) -> bool:
        s = self._settings
        if not s.compress or (encrypted and not s.compress_encrypted):
            return False
        if any(f.matches(topic) for f in self._no_compress):
            return False
        return pays(source.read_at(0, SAMPLE))

    @contextlib.contextmanager
    def seal(self, topic: str, source: PayloadSource, *, stream: bool = False) -> Iterator[Stored]:
        """The payload as it will be stored (the source itself when nothing applies).

        Args:
            topic: decides the recipients and compression.
            source: the payload.
            stream: the stored bytes are read once from the start (an upload through the
                gateway): an encrypted payload is then a :class:`SealedStream`, sealed as it
                is read, its SHA-256 known at the end. Otherwise a :class:`PayloadSource`.
        """
        recipients = recipients_for(self._settings.encrypt_to, topic)
        compress = self._compresses(topic, source, bool(recipients))
        encoding = Encoding(
            compressed=compress,
            encrypted=bool(recipients),
            key_ids=tuple(r.key_id for r in recipients),
        )
        if not recipients and not compress:
            # Its SHA-256 when asked: a direct upload hashes it with its parts, in one read.
            yield Stored(source, PLAIN, source.size)
            return
        if stream and recipients:
            if not compress:
                yield Stored(SealedStream(source, recipients), encoding, source.size)
                return
            # zstd's output size is unknown ahead: compress into the spool, encrypt as sent.
            with self._spooled(source, (), compress=True) as (squeezed, plain_sha256):
                yield Stored(
                    SealedStream(squeezed, recipients), encoding, source.size, plain_sha256
                )
            return
        with self._spooled(source, recipients, compress=compress) as (sealed, plain_sha256):
            yield Stored(sealed, encoding, source.size, plain_sha256)

    @contextlib.contextmanager
    def _spooled(
        self, source: PayloadSource, recipients: Sequence[Recipient], *, compress: bool
    ) -> Iterator[tuple[PayloadSource, str]]:
        """`source` compressed and/or encrypted in one pass into memory or a spool file; the
        result and the plaintext's SHA-256."""
        from ..protocol._age import Encryptor

        s = self._settings
        compressor = FrameCompressor() if compress else None
        encryptor = Encryptor(recipients) if recipients else None
        plain, stored = hashlib.sha256(), hashlib.sha256()
        # Stored bytes are at most the payload's size plus age's 16 bytes per 64 KiB and its
        # header: a payload kept in memory is sealed into memory, a larger one into a file.
        pieces: list[bytes] = []
        with contextlib.ExitStack() as stack:
            spool = None
            if source.size > s.spool_threshold:
                spool = stack.enter_context(tempfile.TemporaryFile(dir=s.spool_dir))

            def emit(data: bytes) -> None:
                stored.update(data)
                if spool is None:
                    pieces.append(data)
                else:
                    spool.write(data)

            def write(data: bytes) -> None:
                if encryptor is None:
                    emit(data)
                    return
                for piece in encryptor.feed_pieces(data):
                    emit(piece)

            for piece in source.pieces():
                plain.update(piece)
                write(compressor.feed(piece) if compressor is not None else piece)
            write(compressor.finish() if compressor is not None else b"")
            if encryptor is not None:
                emit(encryptor.finish())
            if spool is not None:
                spool.seek(0)
            body = b"".join(pieces) if spool is None else spool
            with PayloadSource(body, sha256=stored.hexdigest()) as sealed:
                yield sealed, plain.hexdigest()
