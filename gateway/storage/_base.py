"""The object-store interface the gateway does its I/O with.

Synchronous on purpose: the MinIO SDK is, and the gateway calls stores from worker threads.
Implementations: `S3Store` (any S3 API through the MinIO SDK) and `FileStore` (local disk).

One id, one content: a message becomes visible by id when its index object is created, and
`create_bytes` creates it only where nothing exists yet, atomically in the store itself, so
of two uploads racing for one id exactly one wins and the other is told (409, or
`created: false` when its content is identical). Payload and manifest keys carry a random
token and never collide, so the index is the single commit point and the only write that
has to be conditional.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Protocol, runtime_checkable


class StoreError(Exception):
    """The store failed or cannot be reached (maps to 503)."""


@dataclass(frozen=True, slots=True)
class Versioned:
    """A small object's bytes and the version they were read at (`write_versioned`)."""

    data: bytes
    version: str


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int


class ObjectStore(Protocol):
    """What the gateway needs from object storage."""

    def ping(self) -> None:
        """Raise StoreError unless the store answers and the bucket exists."""

    def ensure_bucket(self) -> None:
        """Create the bucket (or directory) if it is missing."""

    def put_stream(
        self, key: str, reader: BinaryIO, length: int, content_type: str | None = None
    ) -> None:
        """Store `length` bytes read from `reader` (length -1: until EOF) atomically.

        Readers never see a partial object under `key`.
        """

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/json") -> None:
        """Store a small object."""

    def create_bytes(self, key: str, data: bytes, content_type: str = "application/json") -> bool:
        """Store a small object only if `key` does not exist yet; False when it does.

        Atomic against concurrent callers on any replica: exactly one of them gets True,
        and an existing object is never replaced. Readers never see a partial object.
        """

    def get_bytes(self, key: str) -> bytes | None:
        """A small object's bytes, or None when it does not exist."""

    def read_versioned(self, key: str) -> Versioned | None:
        """A small object's bytes and its version (`write_versioned`); None when absent."""

    def write_versioned(
        self, key: str, data: bytes, *, version: str | None, content_type: str = "application/json"
    ) -> str | None:
        """Create `key` (`version` None: only where nothing exists) or replace it only while
        it is still at `version`, atomically against every replica; the new version, None
        when the condition did not hold (gateway/storage/_versioned.py)."""

    def open_range(self, key: str, start: int = 0, length: int | None = None) -> Iterator[bytes]:
        """Stream an object (or a byte range of it) in pieces; close the iterator when done."""

    def delete(self, key: str) -> None:
        """Remove an object; no error when it is already gone."""

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix`, recursively."""

    def concat(
        self, key: str, sources: Sequence[ObjectInfo], content_type: str | None = None
    ) -> None:
        """Store the sources' bytes, in order, as one new object `key` (atomically).

        Server-side where the store can; the sources are left in place. Resumable uploads
        assemble their staged segments with it.
        """


class AsyncBody(Protocol):
    """An object's bytes as they arrive, as views of the buffers they were read into;
    `close` (idempotent, never blocking) ends the read."""

    def __aiter__(self) -> AsyncIterator[memoryview]: ...

    async def __anext__(self) -> memoryview: ...

    def close(self) -> None: ...

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the body is closed (at once if it is)."""

    def on_piece(self, callback: Callable[[], None]) -> None:
        """Call `callback` for each piece handed on."""


@runtime_checkable
class SupportsAsyncRead(Protocol):
    """A store whose objects the event loop reads itself (S3: presigned GETs); the file
    store's are read in a transfer thread (`ObjectStore.open_range`)."""

    def read_url(self, key: str) -> str:
        """A URL to read `key` from (blocking: run it in a store thread)."""

    def read_url_now(self, key: str) -> str | None:
        """`read_url` when it needs no network call (only signing: the event loop may call
        it, sparing a thread hop per download); None when it would."""

    async def read(self, url: str, start: int = 0, length: int | None = None) -> AsyncBody:
        """The object at `url`, or `length` bytes of it from `start`.

        Raises:
            FileNotFoundError: no such object.
            StoreError: the store is unreachable or failed.
        """


@runtime_checkable
class SupportsAsyncWrite(Protocol):
    """A store whose small objects the event loop writes itself (S3: presigned PUTs); the
    file store's are written in a store thread (`ObjectStore.put_bytes`, `create_bytes`)."""

    def writes_now(self) -> bool:
        """Whether `write` may run now: it needs no blocking call first and its body is
        protected (S3: the bucket's region known, and the store seen to verify a presigned
        PUT's CRC-32C)."""

    async def write(
        self, key: str, data: bytes, content_type: str = "application/json", *, only_new: bool
    ) -> bool:
        """Store `data` under `key`: `put_bytes`, or with `only_new` `create_bytes` (False:
        an object was there, and stays).

        Raises:
            StoreError: the store is unreachable, failed or refused.
        """


class DirectStore(Protocol):
    """Presigned store URLs and the multipart calls around them (direct transfers).

    Implemented by `S3Direct` (gateway/storage/_s3_direct.py); see gateway/direct/_transfers.py.
    """

    public_url: str

    def presign_put(
        self,
        key: str,
        *,
        sha256_b64: str,
        seconds: int,
        upload_id: str | None = None,
        part_number: int | None = None,
    ) -> str:
        """A PUT URL that only accepts bytes hashing to `sha256_b64` (no network call)."""

    def presign_get(
        self, key: str, *, seconds: int, response_headers: Mapping[str, str] | None = None
    ) -> str:
        """A GET URL for the object (no network call)."""

    def start_multipart(self, key: str, content_type: str) -> str:
        """Start a multipart upload; its id."""

    def complete_multipart(self, key: str, upload_id: str, etags: Sequence[str]) -> str | None:
        """Join the parts; None when done, else why the store refused them."""

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Drop an unfinished multipart upload."""

    def size(self, key: str) -> int | None:
        """The object's size, None when absent."""


@runtime_checkable
class SupportsDirect(Protocol):
    """A store that can hand clients presigned URLs (S3); the file store cannot."""

    def direct(self, public_url: str) -> DirectStore:
        """The presigner for clients that reach the store at `public_url`."""
