"""A one-line progress bar (bytes, rate, ETA) on a terminal's stderr; silent otherwise.

Small on purpose (no dependency): the CLI draws it for uploads, fetches and large
publishes/subscriptions. Redraws at most ten times a second; `enabled` defaults to whether
the stream is a TTY, so piped or logged output stays clean.
"""

from __future__ import annotations

import sys
import time
from typing import BinaryIO, Protocol, TextIO

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n: float) -> str:
    """`1536` -> `1.5 KiB`."""
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class Progress:
    """Draw `label  done / total  rate  ETA` on one line.

    Args:
        total: bytes expected, None when unknown (no ETA then).
        label: a short prefix (`upload`, `fetch`, ...).
        stream: where to draw (default stderr).
        enabled: draw at all; default: only when `stream` is a terminal.
        start: bytes already done (a resumed upload).
    """

    def __init__(
        self,
        total: int | None,
        *,
        label: str = "",
        stream: TextIO | None = None,
        enabled: bool | None = None,
        start: int = 0,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total = total
        self.label = label
        self.done = start
        self._base = start
        self._t0 = time.monotonic()
        self._last = 0.0

    def line(self, now: float | None = None) -> str:
        """The text of the bar at `now` (monotonic seconds)."""
        elapsed = max((time.monotonic() if now is None else now) - self._t0, 1e-6)
        rate = (self.done - self._base) / elapsed
        parts = [self.label] if self.label else []
        if self.total:
            pct = 100.0 * self.done / self.total
            parts.append(f"{human_bytes(self.done)} / {human_bytes(self.total)} ({pct:.0f}%)")
        else:
            parts.append(human_bytes(self.done))
        parts.append(f"{human_bytes(rate)}/s")
        if self.total and rate > 0:
            parts.append(f"ETA {human_duration((self.total - self.done) / rate)}")
        return "  ".join(parts)

    def restart_from(self, done: int) -> None:
        """Bytes already done before this run (a resumed upload): excluded from the rate."""
        self.done = self._base = done
        self._t0 = time.monotonic()

    def update(self, n: int) -> None:
        """`n` more bytes done."""
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last >= 0.1:
            self._last = now
            self.stream.write("\r\x1b[2K" + self.line(now))
            self.stream.flush()

    def close(self) -> None:
        """Draw the final state and end the line."""
        if self.enabled:
            self.stream.write("\r\x1b[2K" + self.line() + "\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PassReader:
    """A binary file read in passes from its start; the bar shows the current pass.

    A publish reads its file twice (the SHA-256, then the upload or the chunks; the other
    way round for a message that fits one packet), and a retried upload reads part of it
    again. Counting every byte read would end the bar at twice the file. Here the bar shows
    the furthest offset read in the current pass, against the file's size: a read from the
    start after a pass has reached the end begins the next pass (`label 2/2`); a read from
    the start before that (a retry) counts nothing until it passes the furthest offset.

    Args:
        raw: the file, positioned where the payload starts.
        progress: the bar; its total is `size`.
        size: the payload's size.
        passes: how many full passes are expected (for the label).
    """

    def __init__(self, raw: BinaryIO, progress: Progress, size: int, *, passes: int = 2) -> None:
        self._raw = raw
        self._progress = progress
        self._size = size
        self._origin = raw.tell()
        self._furthest = 0  # offset reached in this pass
        self._pass = 1
        self._passes = passes
        self._label = progress.label
        self._relabel()

    def _relabel(self) -> None:
        of = max(self._pass, self._passes)
        self._progress.label = f"{self._label} {self._pass}/{of}" if of > 1 else self._label

    def read(self, n: int = -1) -> bytes:
        start = self._raw.tell() - self._origin
        data = self._raw.read(n)
        if start == 0 and data and self._furthest >= self._size > 0:
            self._pass += 1
            self._furthest = 0
            self._relabel()
            self._progress.restart_from(0)
        end = start + len(data)
        if end > self._furthest:
            self._progress.update(end - self._furthest)
            self._furthest = end
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def seekable(self) -> bool:
        return self._raw.seekable()


class _Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


class CountingWriter:
    """A binary file that reports the bytes written through it to a Progress.

    Args:
        raw: the file written to.
        progress: the bar.
        digest: a hash (`hashlib.sha256()`) fed every byte written, when given.
    """

    def __init__(self, raw: BinaryIO, progress: Progress, digest: _Digest | None = None) -> None:
        self._raw = raw
        self._progress = progress
        self._digest = digest

    def write(self, data: bytes) -> int:
        written = self._raw.write(data)
        if self._digest is not None:
            self._digest.update(data)
        self._progress.update(len(data))
        return written

    def flush(self) -> None:
        self._raw.flush()
