"""zstd in independent frames, streaming both ways, with the output bounded. Pure.

The standard library's `compression.zstd` (Python 3.14), `backports.zstd` before it. A
payload is cut into frames of :data:`FRAME` plaintext bytes, each a complete zstd frame: the
concatenation is an ordinary zstd stream (`zstd -d` reads it), and a reader that knows where
a frame starts can begin there. Compression comes before encryption and is never an HTTP
`Content-Encoding` (that breaks Range and several S3 readers).

Decompression is hostile input: :class:`FrameDecompressor` yields pieces of at most
:data:`PIECE` bytes, stops with :class:`DecompressionBomb` once the output passes its limit
(a few bytes may inflate to gigabytes), limits the window a frame may ask for, and turns
every zstd error into :class:`DecompressionFailed`.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator

from ._errors import DecompressionBomb, DecompressionFailed

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

FRAME = 4 * 1024 * 1024  # plaintext bytes per independent frame
PIECE = 1024 * 1024  # the most one decompress call returns
LEVEL = 3
SAMPLE = 256 * 1024  # the sample that decides whether compression pays
#: A sample must shrink below this fraction of its size for the payload to be compressed.
PAYS_BELOW = 0.9
#: The largest window a frame may ask of the reader (2**25: 32 MiB); ours need 4 MiB.
WINDOW_LOG_MAX = 25
#: The stream opens with a zstd skippable frame naming it, which every zstd reader skips:
#: `offload fetch URL`, which has no placeholder to read, tells our frames by it.
_MARK_TEXT = b"mqtt-offload/zstd"
MARK = struct.pack("<II", 0x184D2A5E, len(_MARK_TEXT)) + _MARK_TEXT


def marked(prefix: bytes) -> bool:
    """Whether a stream starting with `prefix` (at least len(MARK) bytes) is ours."""
    return prefix[: len(MARK)] == MARK


def pays(sample: bytes, level: int = LEVEL) -> bool:
    """Whether compressing a payload that starts with `sample` is worth it."""
    if not sample:
        return False
    return len(zstd.compress(sample, level)) < PAYS_BELOW * len(sample)


class FrameCompressor:
    """Plaintext in, zstd frames of :data:`FRAME` input bytes each out.

    Args:
        level: zstd level (3, zstd's default: fast, most of the gain on text).
        frame: plaintext bytes per frame.
    """

    def __init__(self, level: int = LEVEL, frame: int = FRAME) -> None:
        self._frame = frame
        # A content checksum per frame: damage is found by zstd itself, not only by SHA-256.
        options = {
            int(zstd.CompressionParameter.compression_level): level,
            int(zstd.CompressionParameter.checksum_flag): 1,
        }
        self._compressor = zstd.ZstdCompressor(options=options)
        self._in_frame = 0
        self._mark = MARK

    def feed(self, data: bytes | memoryview) -> bytes:
        out = [self._mark]
        self._mark = b""
        view = memoryview(data)
        while len(view):
            take = min(len(view), self._frame - self._in_frame)
            out.append(self._compressor.compress(view[:take]))
            self._in_frame += take
            view = view[take:]
            if self._in_frame == self._frame:
                out.append(self._compressor.flush(zstd.ZstdCompressor.FLUSH_FRAME))
                self._in_frame = 0
        return b"".join(out)

    def finish(self) -> bytes:
        """The last frame (an empty payload is one empty frame)."""
        mark, self._mark = self._mark, b""
        if self._in_frame == 0 and self._compressor.last_mode == zstd.ZstdCompressor.FLUSH_FRAME:
            return mark
        self._in_frame = 0
        return mark + self._compressor.flush(zstd.ZstdCompressor.FLUSH_FRAME)


def compress(data: bytes, level: int = LEVEL) -> bytes:
    c = FrameCompressor(level)
    return c.feed(data) + c.finish()


class FrameDecompressor:
    """zstd frames in, plaintext pieces out, at most `limit` bytes in all.

    Args:
        limit: the most plaintext the stream may inflate to (`max_fetch_bytes`).
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self.size = 0
        self._new()

    def _new(self) -> None:
        options = {int(zstd.DecompressionParameter.window_log_max): WINDOW_LOG_MAX}
        self._d = zstd.ZstdDecompressor(options=options)
        self._mid = False  # input went into the current frame and it has not ended

    def feed(self, data: bytes | memoryview) -> Iterator[bytes]:
        """The plaintext `data` completes, in pieces of at most :data:`PIECE` bytes.

        Raises:
            DecompressionFailed: not zstd, or a damaged frame.
            DecompressionBomb: the output passed the limit.
        """
        pending = bytes(data)
        while True:
            if pending:
                self._mid = True
            try:
                out = self._d.decompress(pending, max_length=PIECE)
            except (zstd.ZstdError, EOFError) as exc:
                raise DecompressionFailed(f"zstd: {exc}") from None
            pending = b""
            if out:
                self.size += len(out)
                if self.size > self._limit:
                    raise DecompressionBomb(self._limit)
                yield out
            if self._d.eof:
                pending = self._d.unused_data
                self._new()
                if not pending:
                    return
            elif self._d.needs_input:
                return

    def finish(self) -> None:
        """The stream must end at a frame's end.

        Raises:
            DecompressionFailed: it stopped inside a frame (truncated).
        """
        if self._mid:
            raise DecompressionFailed("zstd: truncated inside a frame")


def decompress(data: bytes, limit: int) -> bytes:
    d = FrameDecompressor(limit)
    out = b"".join(d.feed(data))
    d.finish()
    return out
