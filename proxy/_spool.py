"""Where a payload fetched once for several devices waits while each of them takes it at
its own pace (:mod:`proxy._flights`), and what all such payloads may hold together.

A :class:`Spool` is written once, front to back, by the fetch, and read by any number of
readers at their own offsets: in memory (one buffer, read without a copy) while the
payloads held in memory stay under their bound, else in a temporary file in `spool_dir`,
read with `pread` (no offset shared between readers). Never a copy per device.

A :class:`SpoolBudget` bounds what the spools hold: bytes in total (memory and disk), bytes
in memory, how many at once (each may hold a file descriptor), and a share per account and
per device address. A payload is charged to each account and each address that reads it
once, however many of its devices read it: a broadcast to a thousand devices of one account
costs that account the payload's size, and one account's slow readers keeping payloads
alive hold at most its share. What does not fit is fetched for its device alone, as before
there was sharing.
"""

from __future__ import annotations

import collections
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ._shares import Holder, Limits


class Spool:
    """One payload's bytes as they arrive; `size` is what the payload will have in the end.

    Args:
        size: the payload's size (the file or the buffer is never larger).
        directory: where the temporary file goes (None: the system's); unused in memory.
        in_memory: keep the bytes in memory instead of a file.
    """

    def __init__(self, size: int, directory: Path | None, *, in_memory: bool) -> None:
        self.size = size
        self.length = 0  # bytes written so far
        self._buffer: bytearray | None = bytearray(size) if in_memory else None
        self._fd: int | None = None
        if not in_memory:
            fd, name = tempfile.mkstemp(prefix="offload-proxy-shared-", dir=directory)
            os.unlink(name)  # gone from the directory at once; the bytes go with the fd
            self._fd = fd

    @property
    def in_memory(self) -> bool:
        return self._buffer is not None

    def append(self, piece: bytes) -> None:
        """Write the next `piece` (never past `size`: the fetch stops there)."""
        end = self.length + len(piece)
        assert end <= self.size, "a fetch never hands more than the placeholder's size"
        if self._buffer is not None:
            self._buffer[self.length : end] = piece
        elif self._fd is not None:
            view, at = memoryview(piece), self.length
            while view:
                written = os.pwrite(self._fd, view, at)
                at += written
                view = view[written:]
        self.length = end

    def read(self, offset: int, limit: int) -> bytes | memoryview:
        """Up to `limit` bytes from `offset` (at most what has been written)."""
        end = min(offset + limit, self.length)
        if self._buffer is not None:
            return memoryview(self._buffer)[offset:end]
        assert self._fd is not None, "read after close"
        return os.pread(self._fd, end - offset, offset)

    def close(self) -> None:
        self._buffer = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True, slots=True)
class SpoolLimits:
    """What the spools may hold together."""

    shares: Limits  # bytes: in total, per account, per address
    memory: int  # bytes held in memory (the rest in files)
    count: int  # spools at once (each a file descriptor at most)


class SpoolBudget:
    """Bytes the spools hold in total, in memory, per account and per address.

    Args:
        limits: the bounds.
        on_change: told the bytes held after each change (a gauge).
    """

    def __init__(self, limits: SpoolLimits, on_change: Callable[[int], None]) -> None:
        self.limits = limits
        self.used = 0
        self.memory = 0
        self.count = 0
        self._users: collections.Counter[str] = collections.Counter()
        self._addresses: collections.Counter[str] = collections.Counter()
        self._on_change = on_change

    def reserve(self, size: int) -> bool | None:
        """Room for one more spool of `size` bytes: True in memory, False in a file, None
        when there is none (the total or the count would be passed)."""
        limits = self.limits
        if self.count >= limits.count or self.used + size > limits.shares.total:
            return None
        in_memory = self.memory + size <= limits.memory
        self.count += 1
        self.used += size
        self.memory += size if in_memory else 0
        self._on_change(self.used)
        return in_memory

    def release(self, size: int, *, in_memory: bool) -> None:
        self.count -= 1
        self.used -= size
        self.memory -= size if in_memory else 0
        self._on_change(self.used)

    def fits(self, who: Holder, size: int, *, user: bool, address: bool) -> bool:
        """Whether `who`'s account (`user`: not charged for this spool yet) and address
        (`address`: likewise) have room for `size` more."""
        shares = self.limits.shares
        if user and who.user is not None and self._users[who.user] + size > shares.per_user:
            return False
        return not address or self._addresses[who.address] + size <= shares.per_address

    def charge(self, who: Holder, size: int, *, user: bool, address: bool) -> None:
        if user and who.user is not None:
            self._users[who.user] += size
        if address:
            self._addresses[who.address] += size

    def discharge(self, who: Holder, size: int, *, user: bool, address: bool) -> None:
        if user and who.user is not None:
            self._users[who.user] -= size
            if not self._users[who.user]:
                del self._users[who.user]
        if address:
            self._addresses[who.address] -= size
            if not self._addresses[who.address]:
                del self._addresses[who.address]

    def held_by(self, *, user: str | None = None, address: str | None = None) -> int:
        """What an account or an address is charged now (tests)."""
        if user is not None:
            return self._users[user]
        return self._addresses[address] if address is not None else self.used
