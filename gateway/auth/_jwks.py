"""Where JWT verification keys come from: a JWKS file, a JWKS URL, or an HS256 secret file.

Each source answers :meth:`KeySource.keys` at once from what it holds, never from the
network: a request never waits on an identity provider. A JWKS URL is fetched at start-up
and then on a background thread every ``refresh`` seconds (and soon after a token names a
key id it does not know, at most once per ``min_interval``), each fetch bounded in time and
size. A fetch that fails, hangs or brings anything but a usable JWKS leaves the last good
keys in force; :attr:`KeySource.problem` says so for ``/healthz`` and the log says it once.

Keys are PyJWT's (``jwt.PyJWK``): the algorithm each key verifies is fixed by the key (its
``alg``, else its type and curve: RSA RS256, P-256 ES256, Ed25519 EdDSA), so a token cannot
choose it. Symmetric (``oct``) keys are refused in a JWKS: a key set is a public document,
and an HMAC key in it would let anyone sign. HS256 takes a secret file of its own.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx
from jwt import PyJWK, PyJWTError

from ._exceptions import AuthConfigError
from ._files import WatchedFile

log = logging.getLogger("gateway.auth")

#: Most bytes of a JWKS document, and most keys used from it.
MAX_JWKS_BYTES = 1 << 20
MAX_KEYS = 64
#: Shortest HS256 secret (RFC 7518 3.2: at least the hash's size).
MIN_SECRET_BYTES = 32


@dataclass(frozen=True, slots=True)
class KeySet:
    """Verification keys: asymmetric ones from a JWKS, and an HS256 secret."""

    keys: tuple[PyJWK, ...] = ()
    secret: bytes | None = field(default=None, repr=False)
    problems: tuple[str, ...] = ()

    def candidates(self, alg: str, kid: str | None) -> tuple[PyJWK, ...]:
        """The keys that may have signed a token with this header ``alg`` and ``kid``."""
        return tuple(
            key
            for key in self.keys
            if key.algorithm_name == alg and (kid is None or key.key_id == kid)
        )

    def knows(self, kid: str) -> bool:
        return any(key.key_id == kid for key in self.keys)


class KeySource(Protocol):
    """Keys now, and why they may be stale (None when they are current)."""

    @property
    def problem(self) -> str | None: ...

    def keys(self) -> KeySet: ...

    def unknown_kid(self) -> None:
        """A token named a key id these keys lack: fetch soon, if the source can."""

    def reloading(self) -> Future[KeySet] | None:
        """A reload of changed keys to wait for before verifying, if any."""

    def close(self) -> None: ...


def parse_jwks(text: str | bytes) -> KeySet:
    """A JWKS document's usable asymmetric keys.

    Args:
        text: the document.

    Raises:
        ValueError: not JSON, not ``{"keys": [...]}``, or no usable key in it.
    """
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError("the JWKS is not valid JSON") from exc
    entries = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise ValueError('the JWKS is not {"keys": [...]}')
    keys: list[PyJWK] = []
    problems: list[str] = []
    for index, entry in enumerate(entries[:MAX_KEYS]):
        if not isinstance(entry, dict):
            problems.append(f"key {index}: not an object")
            continue
        if entry.get("kty") == "oct":
            problems.append(f"key {index}: a symmetric key in a JWKS is refused")
            continue
        if entry.get("use") not in (None, "sig"):
            continue
        try:
            keys.append(PyJWK.from_dict(entry))
        except (PyJWTError, ValueError, TypeError, KeyError) as exc:
            problems.append(f"key {index} ({entry.get('kid')!r}): {exc}")
    if len(entries) > MAX_KEYS:
        problems.append(f"only the first {MAX_KEYS} keys are used")
    if not keys:
        raise ValueError("the JWKS holds no usable signing key: " + "; ".join(problems))
    return KeySet(tuple(keys), problems=tuple(problems))


def parse_secret(text: str) -> KeySet:
    """An HS256 secret file: its content without the final line break, 32 bytes or more."""
    secret = text.removesuffix("\n").removesuffix("\r").encode("utf-8")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the HS256 secret must be at least {MIN_SECRET_BYTES} bytes")
    return KeySet(secret=secret)


class FileKeys:
    """A JWKS file or an HS256 secret file, re-read when it changes (last good kept)."""

    def __init__(self, path: Path, parse: Callable[[str], KeySet]) -> None:
        self._file = WatchedFile(path, parse, fallback=KeySet(), keep_last_good=True)

    @property
    def problem(self) -> str | None:
        return self._file.problem

    def keys(self) -> KeySet:
        return self._file.get()

    def unknown_kid(self) -> None:
        """The file is re-read on change anyway."""

    def reloading(self) -> Future[KeySet] | None:
        return self._file.reloading()

    def close(self) -> None:
        """Nothing to stop."""


class UrlKeys:
    """A JWKS URL, fetched on a thread of its own. Thread-safe."""

    def __init__(
        self,
        url: str,
        *,
        refresh: float = 300.0,
        min_interval: float = 30.0,
        timeout: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Fetch the keys once now (bounded by ``timeout``), then keep them fresh.

        Args:
            url: the JWKS URL (``https://``; ``http://`` is taken with a warning).
            refresh: seconds between fetches.
            min_interval: fewest seconds between two fetches, whatever asks for them.
            timeout: seconds a whole fetch may take.
            transport: httpx transport (tests); default, httpx's with the system's proxies.
            clock: monotonic seconds.
        """
        if not url.startswith(("https://", "http://")):
            raise AuthConfigError(f"the JWKS URL must be https:// (got {url[:40]!r})")
        if url.startswith("http://"):
            log.warning("JWKS URL %s is plain HTTP: anyone on the path can swap the keys", url)
        self.url = url
        self._refresh = refresh
        self._min_interval = min_interval
        self._timeout = timeout
        self._clock = clock
        self._client = httpx.Client(
            transport=transport, timeout=httpx.Timeout(timeout), follow_redirects=False
        )
        self._lock = threading.Lock()
        self._keys = KeySet()
        self.problem: str | None = None
        self._last_fetch = -float("inf")
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._fetch()
        self._thread = threading.Thread(target=self._run, name="jwks-refresh", daemon=True)
        self._thread.start()

    def keys(self) -> KeySet:
        with self._lock:
            return self._keys

    def unknown_kid(self) -> None:
        self._wake.set()

    def reloading(self) -> Future[KeySet] | None:
        """Never: a fetch is never waited for (the last good keys serve meanwhile)."""
        return None

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(self._timeout + 1)
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            # On failure try again sooner than the regular refresh, but never in a loop.
            wait = self._refresh if self.problem is None else min(self._refresh, 30.0)
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            # Asked too soon after the last fetch: fetch once the interval is over, so a
            # flood of unknown key ids costs the identity provider one fetch per interval.
            too_soon = self._last_fetch + self._min_interval - self._clock()
            if too_soon > 0 and self._stop.wait(too_soon):
                return
            self._fetch()

    def _fetch(self) -> None:
        self._last_fetch = self._clock()
        try:
            keys = parse_jwks(self._download())
        except (httpx.HTTPError, ValueError, OSError) as exc:
            why = f"JWKS {self.url}: {exc or type(exc).__name__}"
            if why != self.problem:
                log.error("%s; keeping the last good keys", why)
            self.problem = f"{why}; keeping the last good keys"
            return
        with self._lock:
            changed = {k.key_id for k in keys.keys} != {k.key_id for k in self._keys.keys}
            self._keys = keys
        if changed or self.problem is not None:
            log.info("JWKS %s: %d key(s) in force", self.url, len(keys.keys))
        for problem in keys.problems:
            log.warning("JWKS %s: %s", self.url, problem)
        self.problem = None

    def _download(self) -> bytes:
        deadline = self._clock() + self._timeout
        with self._client.stream("GET", self.url, headers={"Accept": "application/json"}) as r:
            if r.status_code != 200:
                raise ValueError(f"answered {r.status_code}")
            body = bytearray()
            for piece in r.iter_bytes():
                body += piece
                if len(body) > MAX_JWKS_BYTES:
                    raise ValueError(f"more than {MAX_JWKS_BYTES} bytes")
                if self._clock() > deadline:  # a server trickling bytes
                    raise ValueError(f"no whole answer within {self._timeout:g} s")
        return bytes(body)


def key_sources(
    *, jwks_file: Path | None, jwks_url: str | None, secret_file: Path | None, refresh: float
) -> tuple[KeySource, ...]:
    """The key sources the settings name (none when JWT is off).

    Raises:
        AuthConfigError: a file cannot be read or parsed, or the URL is not http(s).
    """
    sources: list[KeySource] = []
    if jwks_file is not None:
        sources.append(FileKeys(jwks_file, parse_jwks))
    if jwks_url:
        sources.append(UrlKeys(jwks_url, refresh=refresh))
    if secret_file is not None:
        sources.append(FileKeys(secret_file, parse_secret))
    return tuple(sources)


def merged(sources: tuple[KeySource, ...]) -> KeySet:
    """Every source's keys as one set."""
    keys: list[PyJWK] = []
    secret: bytes | None = None
    for source in sources:
        found = source.keys()
        keys.extend(found.keys)
        secret = found.secret if found.secret is not None else secret
    return KeySet(tuple(keys), secret)
