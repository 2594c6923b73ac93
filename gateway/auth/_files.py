"""A file parsed once and parsed again whenever it changes on disk.

The check is one ``os.stat`` (mtime, size, inode) per use: cheap enough per request, and it
notices both in-place edits and the rename that ``mosquitto_passwd`` does.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from ._exceptions import AuthConfigError

T = TypeVar("T")
log = logging.getLogger("gateway.auth")


class WatchedFile(Generic[T]):
    """The parsed value of a file, kept current. Thread-safe.

    At construction an unreadable or invalid file raises, so a gateway does not start with
    it (as mosquitto does not). Later, when it turns unreadable or invalid, the error is
    logged once and ``fallback`` is used until the file is fixed: fail closed, never on
    an older copy that an administrator meant to replace. With ``keep_last_good`` the last
    version that parsed stays in force instead (for a file a program rewrites, where a bad
    version is a mishap, not an administrator's intent); :attr:`problem` then says why.
    """

    def __init__(
        self,
        path: Path,
        parse: Callable[[str], T],
        *,
        fallback: T,
        on_load: Callable[[T], None] | None = None,
        keep_last_good: bool = False,
    ) -> None:
        """Read and parse the file now.

        Args:
            path: the file.
            parse: text to value; raises AuthConfigError or ValueError when invalid.
            fallback: the value while the file is broken (deny everything).
            on_load: called with every freshly parsed value (to log about it).
            keep_last_good: when the file turns bad, keep serving the last good value.

        Raises:
            AuthConfigError: the file cannot be read or parsed.
        """
        self.path = path
        self._parse = parse
        self._fallback = fallback
        self._on_load = on_load
        self._keep_last_good = keep_last_good
        self.problem: str | None = None  # why the file in force is not the file on disk
        self._lock = threading.Lock()
        self._broken: tuple[int, int, int] | None = None
        self._logged_at = -float("inf")
        signature = self._stat()
        if signature is None:
            raise AuthConfigError("cannot read file", path=path)
        # One attribute for both, replaced whole: a reader without the lock never pairs a
        # new signature with an old value.
        self._current: tuple[tuple[int, int, int] | None, T] = (signature, self._load())

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _load(self) -> T:
        try:
            text = self.path.read_text(encoding="utf-8")
            value = self._parse(text)
        except AuthConfigError:
            raise
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise AuthConfigError(str(exc), path=self.path) from exc
        if self._on_load is not None:
            self._on_load(value)
        return value

    def get(self) -> T:
        """The current value, re-read first if the file changed."""
        signature = self._stat()
        current = self._current
        if signature is not None and signature == current[0]:
            return current[1]
        with self._lock:
            known, value = self._current
            if signature is not None and signature == known:
                return value
            if signature is None:
                value = self._failed(f"{self.path}: cannot read the file any more", (0, 0, 0))
            else:
                try:
                    value = self._load()
                    self._broken = None
                    self.problem = None
                except AuthConfigError as exc:
                    value = self._failed(str(exc), signature)
            self._current = (signature, value)
            return value

    def _failed(self, why: str, signature: tuple[int, int, int]) -> T:
        """Log a bad version (once, and at most once a minute while versions keep going
        bad), and answer the fallback or the last good value."""
        then = "keeping the last good version" if self._keep_last_good else "refusing all"
        now = time.monotonic()
        if self._broken is None or (self._broken != signature and now - self._logged_at > 60):
            log.error("%s; %s until fixed", why, then)
            self._logged_at = now
        self._broken = signature
        self.problem = f"{why}; {then} until fixed"
        return self._current[1] if self._keep_last_good else self._fallback
