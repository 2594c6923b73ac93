"""A file parsed once and parsed again, on a thread of its own, whenever it changes on disk.

The check is one ``os.stat`` (mtime, size, inode) per use: cheap enough per request, and it
notices both in-place edits and the rename that ``mosquitto_passwd`` does.

The parse never runs on the caller's thread (after the first, at start-up): the gateway
asks from its event loop, and a dynamic security file of 100,000 clients (30 MB, rewritten
by mosquitto at every ``mosquitto_ctrl`` change) takes seconds to parse, during which every
request, ``/healthz`` too, used to wait. A change starts a reload thread (one at a time per
file) that swaps the new value in when done; meanwhile callers get the last value. For a
file of at most `WAIT_BYTES` (every ordinary password, ACL, tokens or JWKS file, a dynamic
security file of some hundred clients) callers wait for the reload instead, so a change is
in force for the very next request, as an administrator expects: a gateway awaits
:meth:`WatchedFile.reloading` off its event loop first, and :meth:`WatchedFile.get` then
finds the reload done.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Generic, TypeVar

from ._exceptions import AuthConfigError

T = TypeVar("T")
Signature = tuple[int, int, int]
log = logging.getLogger("gateway.auth")

#: Files up to this size are waited for when they change (a parse of some milliseconds);
#: larger ones are parsed while callers go on with the last version.
WAIT_BYTES = 256 * 1024
#: The longest a caller waits for such a reload (a read stuck on a network file system).
WAIT_SECONDS = 5.0
#: Reloads a caller waits through before it takes what is there (a file rewritten again
#: while it was being read).
_WAIT_ROUNDS = 3


class _CollectorPause:
    """Python's cyclic garbage collector kept off a large file's parse and its result.

    A parse builds millions of containers that live until it ends, and each full collection
    the allocations trigger walks all of them holding the GIL: a 45 MB dynamic security
    file took four times as long to parse on its thread, and the event loop stood still for
    up to 1.5 s at a time (bench/auth_reload.py). So collection is off while large files
    are parsed (reference counting still frees all but cycles), and the result, long-lived
    and free of cycles, is then frozen (`gc.freeze`) with everything else alive, so that no
    later collection walks its hundreds of thousands of objects again (one such collection
    stopped the loop for 0.4 s). The next parse unfreezes first: whatever cyclic garbage was
    frozen with it is collected then. The collector is one per process, so parses hold it
    together; a collector the process had switched off stays off.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holds = 0
        self._resume = False

    def __enter__(self) -> None:
        with self._lock:
            if self._holds == 0:
                self._resume = gc.isenabled()
                gc.disable()
                gc.unfreeze()
            self._holds += 1

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self._holds -= 1
            if self._holds == 0:
                gc.freeze()
                if self._resume:
                    gc.enable()


_PAUSE = _CollectorPause()


class WatchedFile(Generic[T]):
    """The parsed value of a file, kept current by reloads on a thread. Thread-safe.

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
            on_load: called with every freshly parsed value (to log about it), on the
                thread that parsed it.
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
        self._broken: Signature | None = None
        self._logged_at = -float("inf")
        self._reload: Future[T] | None = None  # the reload under way, if any
        signature = self._stat()
        if signature is None:
            raise AuthConfigError("cannot read file", path=path)
        # One attribute for both, replaced whole: a reader never pairs a new signature with
        # an old value.
        self._current: tuple[Signature | None, T] = (signature, self._load())

    def _stat(self) -> Signature | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _load(self) -> T:
        try:
            text = self.path.read_text(encoding="utf-8")
            with _PAUSE if len(text) > WAIT_BYTES else contextlib.nullcontext():
                value = self._parse(text)
        except AuthConfigError:
            raise
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise AuthConfigError(str(exc), path=self.path) from exc
        if self._on_load is not None:
            self._on_load(value)
        return value

    def get(self) -> T:
        """The value in force: the last parsed one while a larger file is being reloaded;
        for a file of at most `WAIT_BYTES`, the changed file's (waiting for its reload)."""
        for _ in range(_WAIT_ROUNDS):
            waiting = self._notice()
            if waiting is None:
                break
            try:
                waiting.result(WAIT_SECONDS)
            except FutureTimeout:
                break
        return self._current[1]

    def reloading(self) -> Future[T] | None:
        """The reload to wait for before asking: started now if the file changed. None when
        the value in force is current, or when the file is too large to wait for (it is
        being reloaded, and the last value serves meanwhile)."""
        return self._notice()

    @property
    def busy(self) -> bool:
        """Whether a reload is under way."""
        reload = self._reload
        return reload is not None and not reload.done()

    def _notice(self) -> Future[T] | None:
        """Compare the file with the value in force; start a reload when it changed. The
        reload's future when callers should wait for it, else None."""
        signature = self._stat()
        known = self._current[0]
        if signature is not None and signature == known:
            return None
        if signature is None:
            if known is not None:  # gone: nothing to parse, so no thread
                with self._lock:
                    why = f"{self.path}: cannot read the file any more"
                    self._current = (None, self._failed(why, (0, 0, 0)))
            return None
        reload = self._start()
        return reload if signature[1] <= WAIT_BYTES else None

    def _start(self) -> Future[T]:
        """The reload under way, or a new one on a thread of its own."""
        with self._lock:
            if self._reload is not None and not self._reload.done():
                return self._reload
            reload: Future[T] = Future()
            self._reload = reload
        name = f"reload-{self.path.name}"
        threading.Thread(target=self._run, args=(reload,), name=name, daemon=True).start()
        return reload

    def _run(self, reload: Future[T]) -> None:
        """Read and parse the file, and swap the result in (the reload thread)."""
        try:
            signature = self._stat()
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
        except BaseException as exc:  # a bug: the waiters must not wait for ever
            log.exception("reloading %s failed", self.path)
            reload.set_exception(exc)
            return
        reload.set_result(value)

    def _failed(self, why: str, signature: Signature) -> T:
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
