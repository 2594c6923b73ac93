"""A payload to publish, from bytes, text, a file object or a path, read in pieces.

Large payloads are never loaded whole: the size comes from the file, the SHA-256 from one
streaming pass, and the upload and the chunker read ranges on demand.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

PIECE = 1 << 20  # 1 MiB: the unit streamed to the gateway and hashed

PayloadLike = bytes | bytearray | memoryview | str | BinaryIO | os.PathLike[str]


class PayloadSource:
    """Random-access view of a payload with its size and SHA-256.

    Args:
        payload: bytes, text, a binary file object or a path.
        spool_dir: where a non-seekable stream (a pipe) is spooled first (default: the
            system's temporary directory).
        sha256: the payload's SHA-256 when already known (hashed while it was written).
    """

    __slots__ = ("_data", "_file", "_owned", "_sha256", "_start", "size")

    def __init__(
        self, payload: PayloadLike, *, spool_dir: str | None = None, sha256: str | None = None
    ) -> None:
        self._data: bytes | None = None
        self._file: BinaryIO | None = None
        self._owned = False
        self._start = 0
        self._sha256: str | None = sha256
        if isinstance(payload, str):
            self._data = payload.encode("utf-8")
        elif isinstance(payload, bytes | bytearray | memoryview):
            self._data = bytes(payload)
        elif isinstance(payload, os.PathLike):
            self._file = open(payload, "rb")  # noqa: SIM115 - closed by close()
            self._owned = True
        elif hasattr(payload, "read"):
            if payload.seekable():
                self._file = payload
                self._start = payload.tell()
            else:
                # A pipe cannot be re-read for the hash pass and the upload: spool it once.
                spool = tempfile.TemporaryFile(dir=spool_dir)  # noqa: SIM115 - closed by close()
                shutil.copyfileobj(payload, spool, PIECE)
                self._file = spool
                self._owned = True
        else:
            raise TypeError(f"payload must be bytes, str, a binary file or a path, not {payload!r}")
        if self._data is not None:
            self.size = len(self._data)
        else:
            assert self._file is not None
            self._file.seek(0, io.SEEK_END)
            self.size = self._file.tell() - self._start

    @property
    def sha256(self) -> str:
        """SHA-256 of the payload, lowercase hex (one streaming pass, then cached)."""
        if self._sha256 is None:
            digest = hashlib.sha256()
            for piece in self.pieces():
                digest.update(piece)
            self._sha256 = digest.hexdigest()
        return self._sha256

    def read_at(self, offset: int, length: int) -> bytes:
        """`length` bytes from `offset` (fewer at the end)."""
        if self._data is not None:
            return self._data[offset : offset + length]
        assert self._file is not None
        self._file.seek(self._start + offset)
        return self._file.read(min(length, max(self.size - offset, 0)))

    def pieces(self, piece: int = PIECE) -> Iterator[bytes]:
        """The payload from the start, in pieces of at most `piece` bytes."""
        offset = 0
        while offset < self.size:
            data = self.read_at(offset, piece)
            if not data:
                raise OSError(f"payload shrank while reading: {offset} of {self.size} bytes")
            offset += len(data)
            yield data

    def read_all(self) -> bytes:
        """The whole payload in memory (only for payloads that go out as one packet)."""
        if self._data is not None:
            return self._data
        return self.read_at(0, self.size)

    def close(self) -> None:
        if self._owned and self._file is not None:
            self._file.close()
        self._file = None if self._owned else self._file

    def __enter__(self) -> PayloadSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
