"""Fetch helpers over httpx responses: counting, capping, lengths, redirect targets, hashing.

Split from :mod:`client.http._transport` (which keeps the statuses and errors); no network I/O
of its
own (:func:`_spool` writes the temporary file).

Payloads of 4 MiB or more are hashed on a second thread (:class:`_Hasher`) while the
reader goes on reading and copying or writing: hashlib releases the GIL for buffers over
2 KiB, so on two cores the SHA-256 (0.6 CPU-s per GiB with SHA-NI) leaves the reader's
path. With httpx's 64 KiB pieces the thread's hand-offs cost more than they saved in
memory; with the 1 MiB pieces of :mod:`client.http._urllib3` they do not. bench/RESULTS.md,
"Client fetch" and "Client reads over urllib3", has the figures.
"""

from __future__ import annotations

import hashlib
import io
import os
import queue
import tempfile
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path

import httpx

from ..core._exceptions import FetchError
from ..core._message import Payload
from ..protocol import Origin, http_origin
from ._urllib3 import READINTO


def _counted(
    pieces: Iterator[bytes], total: int | None, on_bytes: Callable[[int, int | None], None] | None
) -> Iterator[bytes]:
    if on_bytes is None:
        yield from pieces
        return
    done = 0
    for piece in pieces:
        done += len(piece)
        on_bytes(done, total)
        yield piece


def _capped(pieces: Iterator[bytes], limit: int | None, url: str) -> Iterator[bytes]:
    """The pieces, failing as soon as they would add up to more than `limit` bytes."""
    if limit is None:
        yield from pieces
        return
    done = 0
    for piece in pieces:
        done += len(piece)
        if done > limit:
            # Raised inside the response's `with`: httpx closes the connection unread.
            raise FetchError(url, f"body runs past the declared size of {limit} bytes: cut off")
        yield piece


def _content_length(url: str, response: httpx.Response) -> int | None:
    """The response's Content-Length as an int, None when absent; junk is refused."""
    values = response.headers.get_list("Content-Length")
    if not values:
        return None
    value = values[0]
    if len(set(values)) != 1 or len(value) > 20 or not (value.isascii() and value.isdigit()):
        raise FetchError(url, f"unusable Content-Length {value[:40]!r}")
    return int(value)


#: Redirect statuses `fetch` follows (GET stays GET for all of them).
REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: Most redirects one fetch follows.
MAX_REDIRECTS = 3


class _NoAuth(httpx.Auth):
    """Sends nothing: stands in for the client's default auth after a redirect."""

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers.pop("Authorization", None)
        yield request


_NO_AUTH = _NoAuth()


def _origin(url: str, target: httpx.URL) -> Origin:
    """The origin of a fetched URL; only absolute http(s) URLs are fetched."""
    try:
        return http_origin(str(target))
    except ValueError as exc:
        raise FetchError(url, f"only http and https URLs are fetched ({exc})") from exc


def _checked_length(
    url: str, response: httpx.Response, expected_size: int | None, limit: int | None
) -> int | None:
    """The size to expect, refusing a Content-Length that contradicts the declared size."""
    announced = _content_length(url, response)
    if announced is not None and expected_size is not None:
        if announced != expected_size:
            raise FetchError(
                url,
                f"Content-Length {announced} differs from the declared size "
                f"{expected_size}: refused before the body",
            )
    elif announced is not None and limit is not None and announced > limit:
        raise FetchError(url, f"Content-Length {announced} is more than {limit}")
    return expected_size if expected_size is not None else announced


#: A piece of a body: read as bytes, or a view of the payload's own buffer.
Piece = bytes | memoryview

#: Bytes handed to the hashing thread at once (one 1 MiB piece, or a batch of smaller ones).
HASH_BATCH = 1 << 20
#: Most pieces in one batch (a server that trickles bytes makes tiny pieces; os.writev takes
#: at most IOV_MAX = 1024 buffers).
BATCH_PIECES = 256
#: Batches the hashing thread may lag behind the reader before the reader waits: what a
#: fetch holds in memory besides an in-memory payload is at most (HASH_QUEUE + 2) batches.
HASH_QUEUE = 4
#: Payloads of at least this many bytes are hashed on a second thread; smaller ones
#: inline (starting a thread costs ~0.1 ms, hashing 4 MiB ~2.5 ms).
THREADED_HASH_FROM = 4 << 20


def read_body(
    response: httpx.Response,
    url: str,
    size: int | None,
    limit: int | None,
    *,
    hashed: bool,
    tap: Callable[[Sequence[bytes | memoryview]], None] | None,
    keep: bool,
    spool_threshold: int,
    spool_dir: str | os.PathLike[str] | None,
    on_bytes: Callable[[int, int | None], None] | None,
) -> tuple[Payload, str, int | None]:
    """An answer's body, held where its size says (nowhere, a spool file, memory), hashed as
    it comes; with its SHA-256 ("" when not `hashed`) and, when not kept, the bytes received
    (the arguments are :meth:`client.http._transport.HttpTransport.fetch`'s).

    A payload of 4 MiB or more is hashed on a second thread, fed as the body arrives;
    without `hashed` nothing is. Memory held: an in-memory payload once (its declared size,
    up to `spool_threshold`, allocated when the body starts; over urllib3 the socket reads
    land in it directly), plus, where the body comes as pieces (spooled, or through a
    proxy), at most (HASH_QUEUE + 2) pieces of up to 1 MiB waiting for the hasher.
    """
    # The SHA-256 on a second thread while the reader waits on the socket (or the disk):
    # hashlib and the socket read both release the GIL.
    threaded = size is None or size >= THREADED_HASH_FROM
    readinto = response.extensions.get(READINTO)
    # iter_raw() without a size: the transport's reads as they come, no re-chunking copy
    # (bench/RESULTS.md, "Client fetch"). A generator: nothing is read unless a branch below
    # iterates it.
    stream = _counted(_capped(response.iter_raw(), limit, url), size, on_bytes)
    with _Hasher(threaded=threaded, enabled=hashed, tap=tap) as hasher:
        received = None
        if not keep:
            payload = Payload(b"")
            received = _tapped_only(readinto, stream, hasher, size, url, on_bytes)
        elif size is None or size > spool_threshold:
            payload = _spool(stream, hasher, spool_dir)
        elif readinto is not None:  # straight into the payload's buffer
            payload = _read_into(readinto, hasher, size, url, on_bytes)
        else:
            payload = _in_memory(stream, hasher, size)
        return payload, hasher.hexdigest(), received


def _batches(pieces: Iterator[bytes]) -> Iterator[tuple[list[bytes], int]]:
    """The pieces in order, grouped into batches of about :data:`HASH_BATCH` bytes.

    A batch closes at :data:`HASH_BATCH` bytes or :data:`BATCH_PIECES` pieces (1 MiB
    pieces make one each); each comes with its size. The hashing thread takes a batch per
    hand-off and the spool one `os.writev` per batch, so both follow this one rule.
    """
    batch: list[bytes] = []
    batched = 0
    for piece in pieces:
        batch.append(piece)
        batched += len(piece)
        if batched >= HASH_BATCH or len(batch) >= BATCH_PIECES:
            yield batch, batched
            batch = []
            batched = 0
    if batch:
        yield batch, batched


class _Hasher:
    """SHA-256 of batches fed in order, on a worker thread for large payloads.

    A `tap` sees each batch after it is hashed, on the same thread (the receive path
    decrypts there while the body arrives: :class:`client.seal._unseal.Decoding`); it must not
    raise, and keeps no view of a batch beyond the call.

    The reader hands over batches (:func:`_batches`) through a queue bounded at
    :data:`HASH_QUEUE` batches, so a slow hasher slows the reader instead of growing
    memory. :meth:`hexdigest` waits until every batch fed is hashed; :meth:`close` (also on
    exit of a `with`) stops the thread whatever happened, so a failed fetch leaves none.
    """

    def __init__(
        self,
        *,
        threaded: bool,
        enabled: bool = True,
        tap: Callable[[Sequence[Piece]], None] | None = None,
    ) -> None:
        self._digest = hashlib.sha256() if enabled else None
        self._tap = tap
        self._queue: queue.Queue[Sequence[Piece] | None] = queue.Queue(HASH_QUEUE)
        self._thread: threading.Thread | None = None
        if threaded and (enabled or tap is not None):
            self._thread = threading.Thread(target=self._run, name="offload-sha256", daemon=True)
            self._thread.start()

    def __enter__(self) -> _Hasher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def feed(self, batch: Sequence[Piece]) -> None:
        """Hash `batch` after every batch fed before it (now, or on the worker)."""
        if self._thread is not None:
            self._queue.put(batch)
            return
        if self._digest is not None:
            for piece in batch:
                self._digest.update(piece)
        if self._tap is not None:
            self._tap(batch)

    def hexdigest(self) -> str:
        """The digest of everything fed, once the worker has caught up ("" when disabled)."""
        self.close()
        return "" if self._digest is None else self._digest.hexdigest()

    def close(self) -> None:
        """Stop the worker (it drains what is queued first); idempotent."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def _run(self) -> None:
        update = self._digest.update if self._digest is not None else None
        tap = self._tap
        while (batch := self._queue.get()) is not None:
            if update is not None:
                for piece in batch:
                    update(piece)  # hashlib drops the GIL: the reader runs meanwhile
            if tap is not None:
                tap(batch)


def _in_memory(stream: Iterator[bytes], hasher: _Hasher, size: int) -> Payload:
    """The pieces copied, as they arrive, into one buffer of the declared size, as bytes.

    `io.BytesIO(bytes(size))` makes a buffer of the final size up front (calloc: fresh
    memory is not touched until the first write copies it), so the pieces land in place
    with no growth and `getvalue()` hands the buffer over without a copy. Each batch (one
    1 MiB piece from urllib3) is dropped once copied, so the next read reuses its
    cache-warm memory. A body shorter
    than declared (a close-delimited one may end early without an error) is truncated to
    what arrived, never padded: the size check then refuses it. Measured against one join
    of the kept pieces (bench/RESULTS.md, "Client fetch"): 0.2 vs 0.7 CPU-s per GiB at
    20 MiB, 0.7 vs 1.4 at 32 MiB; a BytesIO grown by writes cost 1.3 at 20 MiB (realloc).
    """
    buffer = io.BytesIO(bytes(size))
    write = buffer.write
    for batch, _ in _batches(stream):
        hasher.feed(batch)
        for piece in batch:
            write(piece)
    if buffer.tell() != size:
        buffer.truncate()
    return Payload(buffer.getvalue())


def _filled(
    readinto: Callable[[memoryview], int],
    room: Callable[[int, int], memoryview],
    size: int,
    url: str,
    on_bytes: Callable[[int, int | None], None] | None,
) -> Iterator[memoryview]:
    """The body read by `readinto` into the views `room(bytes so far, reads so far)` gives,
    each filled part as it comes (a short body just ends). A body that goes on past `size`
    is refused: one more byte is asked for.
    """
    got = turn = 0
    while got < size:
        view = room(got, turn)
        n = readinto(view)
        if not n:
            break
        yield view[:n]
        got += n
        turn += 1
        if on_bytes is not None:
            on_bytes(got, size)
    if got == size and readinto(memoryview(bytearray(1))):
        raise FetchError(url, f"body runs past the declared size of {size} bytes: cut off")


def _fed(parts: Iterator[memoryview], hasher: _Hasher) -> int:
    """Hand each part to the hasher; the bytes handed. No view outlives the call (a
    buffer with live views cannot be resized or handed over without a copy)."""
    got = 0
    for part in parts:
        hasher.feed([part])
        got += len(part)
    return got


def _read_into(
    readinto: Callable[[memoryview], int],
    hasher: _Hasher,
    size: int,
    url: str,
    on_bytes: Callable[[int, int | None], None] | None,
) -> Payload:
    """The body read straight into one buffer of the declared size, as bytes: one copy.

    :func:`_in_memory` receives each piece as a fresh object and copies it into the
    buffer; here the transport's `readinto` (:data:`client.http._urllib3.READINTO`) fills the
    buffer itself, in steps of :data:`HASH_BATCH` handed to the hasher as views. Every
    view is gone once the hasher has finished, so `getvalue()` hands the buffer over
    without a copy. A body that goes on past `size` is refused (one more byte is asked
    for); a shorter one is truncated to what arrived, for the size check to refuse.
    """
    buffer = io.BytesIO(bytes(size))
    with buffer.getbuffer() as view:

        def room(got: int, turn: int) -> memoryview:
            return view[got : got + HASH_BATCH]

        got = _fed(_filled(readinto, room, size, url, on_bytes), hasher)
    hasher.close()  # its views of the buffer released: getvalue() need not copy
    if got != size:
        buffer.truncate(got)
    return Payload(buffer.getvalue())


def _tapped_only(
    readinto: Callable[[memoryview], int] | None,
    stream: Iterator[bytes],
    hasher: _Hasher,
    size: int | None,
    url: str,
    on_bytes: Callable[[int, int | None], None] | None,
) -> int:
    """The body hashed and handed to the hasher's tap, not kept: the number of bytes read.

    For a caller whose tap keeps what it needs (the receive path decrypts as the body
    arrives and holds only the plaintext): keeping the stored bytes as well cost a copy of
    every byte, or a spool file written and deleted, past `spool_threshold` (bench/RESULTS.md,
    "Issue 30"). Over the transport's `readinto` the reads land in a ring of
    :data:`HASH_QUEUE` + 2 buffers: the hasher's queue holds at most :data:`HASH_QUEUE`
    batches and it works on one more, so a buffer is filled again only after the hasher
    is done with the batch it held. A body that goes on past `size` is refused, as in
    :func:`_read_into`.
    """
    got = 0
    if readinto is None or size is None:
        for batch, batched in _batches(stream):  # fresh pieces: dropped once fed
            hasher.feed(batch)
            got += batched
        return got
    step = max(1, min(HASH_BATCH, size))
    ring = [memoryview(bytearray(step)) for _ in range(min(HASH_QUEUE + 2, size // step + 1))]

    def room(got: int, turn: int) -> memoryview:
        return ring[turn % len(ring)][: min(step, size - got)]

    return _fed(_filled(readinto, room, size, url, on_bytes), hasher)


def _spool(
    stream: Iterator[bytes], hasher: _Hasher, spool_dir: str | os.PathLike[str] | None
) -> Payload:
    """The pieces written to a new temporary file, which is removed on any failure.

    Written with one `os.writev` per batch (:func:`_batches`: no join, no Python-level
    buffer).
    """
    fd, name = tempfile.mkstemp(prefix="offload-", suffix=".payload", dir=spool_dir)
    path = Path(name)
    try:
        try:
            for batch, batched in _batches(stream):
                hasher.feed(batch)
                _write_all(fd, batch, batched)
        finally:
            os.close(fd)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return Payload(path=path)


def _write_all(fd: int, pieces: list[bytes], total: int) -> None:
    """Write every piece to `fd` in order; a short write (rare on a file) is finished."""
    if not pieces:
        return
    done = os.writev(fd, pieces)
    if done < total:
        rest = memoryview(b"".join(pieces))[done:]
        while rest:
            rest = rest[os.write(fd, rest) :]
