"""A binary reader over several stored objects in turn: server-side concat's fallback.

`ObjectStore.concat` composes objects on the server where the store can (S3
UploadPartCopy: every part but the last >= 5 MiB); otherwise the bytes pass once through the
gateway, one piece at a time, so memory stays bounded whatever the total size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO, cast

from ._base import ObjectInfo, ObjectStore, StoreError


class ChainReader:
    """`read(n)` over the objects `open_piece(key)` streams, in order."""

    def __init__(self, keys: Sequence[str], open_pieces: Callable[[str], Iterator[bytes]]) -> None:
        self._keys = list(keys)
        self._open = open_pieces
        self._current: Iterator[bytes] | None = None
        self._pending = memoryview(b"")

    def _next_piece(self) -> bytes:
        while True:
            if self._current is None:
                if not self._keys:
                    return b""
                self._current = self._open(self._keys.pop(0))
            piece = next(self._current, b"")
            if piece:
                return piece
            self.close_current()

    def close_current(self) -> None:
        close = getattr(self._current, "close", None)
        if close is not None:
            close()
        self._current = None

    def read(self, n: int = -1) -> bytes:
        out = bytearray()
        while n < 0 or len(out) < n:
            if not self._pending:
                piece = self._next_piece()
                if not piece:
                    break
                self._pending = memoryview(piece)
            take = len(self._pending) if n < 0 else min(n - len(out), len(self._pending))
            out += self._pending[:take]
            self._pending = self._pending[take:]
        return bytes(out)

    def close(self) -> None:
        self.close_current()
        self._keys.clear()


def concat_by_streaming(
    store: ObjectStore, key: str, sources: Sequence[ObjectInfo], content_type: str | None
) -> None:
    """Write `sources` one after another into `key`, the bytes passing through once."""
    reader = ChainReader([s.key for s in sources], store.open_range)
    try:
        store.put_stream(key, cast(BinaryIO, reader), sum(s.size for s in sources), content_type)
    except FileNotFoundError as exc:
        raise StoreError(f"concat into {key!r}: a source is gone: {exc}") from exc
    finally:
        reader.close()
