"""HTTP Range header parsing (RFC 9110 §14): one byte range, or the whole object."""

from __future__ import annotations

from dataclasses import dataclass

from ..core import RangeNotSatisfiable


@dataclass(frozen=True, slots=True)
class ByteRange:
    start: int
    end: int  # inclusive

    @property
    def length(self) -> int:
        return self.end - self.start + 1


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The single range asked for, None for the whole object.

    Multiple ranges and malformed headers are answered with the whole object, which
    RFC 9110 allows; an unsatisfiable single range raises 416.
    """
    if not header:
        return None
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if first == "":
            suffix = int(last)
            if suffix <= 0:
                raise RangeNotSatisfiable(
                    "empty suffix range", {"Content-Range": f"bytes */{size}"}
                )
            start, end = max(0, size - suffix), size - 1
        else:
            start = int(first)
            end = int(last) if last else size - 1
            if start >= size:
                raise RangeNotSatisfiable(
                    f"range starts at {start} but the payload has {size} bytes",
                    {"Content-Range": f"bytes */{size}"},
                )
            if start < 0 or end < start:
                return None
            end = min(end, size - 1)
    except ValueError:
        return None
    return ByteRange(start, end)
