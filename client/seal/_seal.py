"""The publish side of end-to-end encryption and compression: a payload as it is stored.

An offloaded payload whose topic matches `encrypt_to` is encrypted to those recipients (age
v1, :mod:`client.protocol._age`) before it leaves the process; one that compresses well is
zstd-compressed first (:mod:`client.protocol._zstd`). Both happen in one streaming pass over
the payload into memory (a payload up to `spool_threshold`) or a file in `spool_dir`, which
then goes out on whichever path the upload takes (the gateway, a direct transfer). The
placeholder's `size` and `sha256` describe those stored bytes; the plaintext's SHA-256 is
computed in the same pass for the :class:`PublishResult` and never published.

Compression is decided per payload: on (`compress`), not excluded (`no_compress`), and
a sample of its first :data:`~client.protocol._zstd.SAMPLE` bytes shrinks. It is off for
encrypted payloads unless `compress_encrypted` (docs/security.md: sizes leak secrets).
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace

from ..config._keys import recipients_for
from ..config._settings import ClientSettings
from ..core._source import PayloadSource
from ..protocol import PublishProperties, TopicFilter
from ..protocol._encoding import PLAIN, Encoding
from ..protocol._zstd import SAMPLE, FrameCompressor, pays

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


@dataclass(frozen=True, slots=True)
class Stored:
    """A payload as it is stored, with how it was encoded and the plaintext's digest."""

    source: PayloadSource
    encoding: Encoding
    plain_sha256: str
    plain_size: int


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
    def seal(self, topic: str, source: PayloadSource) -> Iterator[Stored]:
        """The payload as it will be stored (the source itself when nothing applies)."""
        recipients = recipients_for(self._settings.encrypt_to, topic)
        compress = self._compresses(topic, source, bool(recipients))
        if not recipients and not compress:
            yield Stored(source, PLAIN, source.sha256, source.size)
            return
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
            encoding = Encoding(
                compressed=compress,
                encrypted=bool(recipients),
                key_ids=tuple(r.key_id for r in recipients),
            )
            if spool is not None:
                spool.seek(0)
            body = b"".join(pieces) if spool is None else spool
            with PayloadSource(body, sha256=stored.hexdigest()) as sealed:
                yield Stored(sealed, encoding, plain.hexdigest(), source.size)
