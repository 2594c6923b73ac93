"""Read-only access to the object store for the Spark reader: list and get, nothing else.

The gateway owns writing (gateway.storage); this side needs only listings with a delimiter
(to walk the topic tree without a full listing) and whole-object reads, and must not pull
the gateway's web dependencies onto Spark executors.
"""

from __future__ import annotations

import io
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeAlias

from ..core._exceptions import ConfigError, FetchError
from ._options import StorageLocation

ACCESS_KEY_ENV = "OFFLOAD_S3_ACCESS_KEY"
SECRET_KEY_ENV = "OFFLOAD_S3_SECRET_KEY"
# S3 error codes meaning "who you are" rather than "what you asked for" is wrong.
REFUSED_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AllAccessDisabled",
        "AuthorizationHeaderMalformed",
        "MissingSecurityHeader",
        "ExpiredToken",
        "InvalidToken",
    }
)


# A payload as read: bytes, or a read-only mapping of an immutable file (no copy).
Payload: TypeAlias = bytes | mmap.mmap
# Below this a file is read, not mapped: a mapping costs a few system calls of its own.
MAP_MIN_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Oversize:
    """An object larger than the reader would take, left unread.

    `size` is its size when the store said it (a file's, S3's Content-Length), else None.
    """

    size: int | None


@dataclass(frozen=True, slots=True)
class Listing:
    """One level of a delimiter listing: objects right under a prefix, and sub-prefixes."""

    objects: tuple[tuple[str, int], ...]
    prefixes: tuple[str, ...]


class ReadStore(Protocol):
    """What the reader needs from a store."""

    def list_level(self, prefix: str) -> Listing:
        """Objects and sub-prefixes (ending in `/`) one `/` below `prefix`."""

    def list_all(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object whose key starts with `prefix`, recursively."""

    def get(self, key: str, max_bytes: int) -> bytes | Oversize | None:
        """An object's bytes; Oversize, unread, beyond `max_bytes`; None when it does not exist."""

    def get_payload(self, key: str, max_bytes: int) -> Payload | Oversize | None:
        """Like `get`, but possibly mapped rather than copied (never copied twice)."""

    def put(self, key: str, data: bytes) -> None:
        """Store a small object whole (a stream's confirmations: `_confirm`)."""

    def delete(self, key: str) -> None:
        """Remove an object; no error when it is gone."""


class S3ReadStore:
    """One bucket through the MinIO SDK."""

    def __init__(self, location: StorageLocation) -> None:
        from minio import Minio

        self._location = location
        self._bucket = location.bucket
        self._client = Minio(
            location.endpoint,
            access_key=location.access_key,
            secret_key=location.secret_key,
            secure=location.secure,
            region=location.region,
        )

    def __repr__(self) -> str:
        return f"S3ReadStore({self._location.url!r})"

    def _fail(self, what: str, exc: Exception) -> FetchError | ConfigError:
        code = getattr(exc, "code", None)
        if code in REFUSED_CODES:
            return ConfigError(
                f"{self._location.url} refused the credentials ({code}) while {what}: set "
                f'option("accessKey", ...) and option("secretKey", ...), or '
                f"{ACCESS_KEY_ENV} and {SECRET_KEY_ENV} in the driver's environment before "
                "register(spark) (python -m client.spark: --access-key/--secret-key)"
            )
        return FetchError(self._location.url, f"{what}: {exc}")

    def list_level(self, prefix: str) -> Listing:
        objects: list[tuple[str, int]] = []
        prefixes: list[str] = []
        try:
            for obj in self._client.list_objects(self._bucket, prefix=prefix, recursive=False):
                name = obj.object_name
                if name is None:
                    continue
                if obj.is_dir:
                    prefixes.append(name)
                else:
                    objects.append((name, obj.size or 0))
        except Exception as exc:  # minio raises S3Error, urllib3 and OSError kinds alike
            raise self._fail(f"listing {prefix!r}", exc) from exc
        return Listing(tuple(objects), tuple(prefixes))

    def list_all(self, prefix: str) -> Iterator[tuple[str, int]]:
        try:
            for obj in self._client.list_objects(self._bucket, prefix=prefix, recursive=True):
                if obj.object_name is not None and not obj.is_dir:
                    yield obj.object_name, obj.size or 0
        except Exception as exc:
            raise self._fail(f"listing {prefix!r}", exc) from exc

    def get(self, key: str, max_bytes: int) -> bytes | Oversize | None:
        from minio.error import S3Error

        try:
            response = self._client.get_object(self._bucket, key)
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject"):
                return None
            raise self._fail(f"reading {key!r}", exc) from exc
        except Exception as exc:
            raise self._fail(f"reading {key!r}", exc) from exc
        try:
            length = response.headers.get("Content-Length", "")
            if length.isdigit() and int(length) > max_bytes:
                return Oversize(int(length))
            # urllib3 2 reads until `amt` bytes or the end; the rest is never fetched. The
            # bytes as stored (no Content-Encoding undone): those are what the checksums cover.
            data = bytes(response.read(max_bytes + 1, decode_content=False))
            return Oversize(None) if len(data) > max_bytes else data
        except Exception as exc:
            raise self._fail(f"reading {key!r}", exc) from exc
        finally:
            response.close()
            response.release_conn()

    def get_payload(self, key: str, max_bytes: int) -> Payload | Oversize | None:
        return self.get(key, max_bytes)

    def put(self, key: str, data: bytes) -> None:
        try:
            self._client.put_object(self._bucket, key, io.BytesIO(data), len(data))
        except Exception as exc:
            raise self._fail(f"writing {key!r}", exc) from exc

    def delete(self, key: str) -> None:
        try:
            self._client.remove_object(self._bucket, key)
        except Exception as exc:  # a missing object is no error to S3's DeleteObject
            raise self._fail(f"deleting {key!r}", exc) from exc


class FileReadStore:
    """The embedded store: objects are files below a directory, keys are relative paths."""

    def __init__(self, location: StorageLocation) -> None:
        self._root = Path(location.bucket)

    def __repr__(self) -> str:
        return f"FileReadStore({str(self._root)!r})"

    def _dir_and_stem(self, prefix: str) -> tuple[Path, str]:
        directory, _, stem = prefix.rpartition("/")
        path = self._root / directory if directory else self._root
        if ".." in Path(directory).parts:
            raise ConfigError(f"prefix {prefix!r} leaves the store")
        return path, stem

    @staticmethod
    def _visible(name: str) -> bool:
        # The gateway's FileStore writes `.<name>.<hex>.part` and renames it into place.
        return not name.startswith(".")

    def list_level(self, prefix: str) -> Listing:
        directory, stem = self._dir_and_stem(prefix)
        base = prefix[: len(prefix) - len(stem)]
        objects: list[tuple[str, int]] = []
        prefixes: list[str] = []
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except FileNotFoundError:
            return Listing((), ())
        for entry in entries:
            if not entry.name.startswith(stem) or not self._visible(entry.name):
                continue
            if entry.is_dir():
                prefixes.append(f"{base}{entry.name}/")
            elif entry.is_file():
                objects.append((base + entry.name, entry.stat().st_size))
        return Listing(tuple(objects), tuple(prefixes))

    def list_all(self, prefix: str) -> Iterator[tuple[str, int]]:
        level = self.list_level(prefix)
        yield from level.objects
        for sub in level.prefixes:
            yield from self.list_all(sub)

    def get(self, key: str, max_bytes: int) -> bytes | Oversize | None:
        directory, name = self._dir_and_stem(key)
        try:
            with open(directory / name, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                return Oversize(size) if size > max_bytes else f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise FetchError(f"file://{self._root}", f"reading {key!r}: {exc}") from exc

    def get_payload(self, key: str, max_bytes: int) -> Payload | Oversize | None:
        """The payload mapped read-only rather than read, when it is large.

        Arrow wraps the mapping as the batch's data buffer and hashlib hashes it in place,
        so the page cache is copied once, into the socket to the JVM, instead of first
        into a fresh 16 MiB `bytes` whose pages the kernel must also fault in and zero.
        The gateway's FileStore never rewrites a file in place (it writes a temporary file
        and renames it; expiry unlinks), so a mapping stays valid while it is in use.
        """
        directory, name = self._dir_and_stem(key)
        try:
            with open(directory / name, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > max_bytes:
                    return Oversize(size)
                if size < MAP_MIN_BYTES:
                    return f.read()
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                return mmap.mmap(f.fileno(), size, flags=flags, prot=mmap.PROT_READ)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise FetchError(f"file://{self._root}", f"reading {key!r}: {exc}") from exc

    def put(self, key: str, data: bytes) -> None:
        """Written beside, then renamed into place, as the gateway's file store does."""
        directory, name = self._dir_and_stem(key)
        temporary = directory / f".{name}.{os.getpid()}.part"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            temporary.write_bytes(data)
            os.replace(temporary, directory / name)
        except OSError as exc:
            raise FetchError(f"file://{self._root}", f"writing {key!r}: {exc}") from exc

    def delete(self, key: str) -> None:
        directory, name = self._dir_and_stem(key)
        try:
            (directory / name).unlink(missing_ok=True)
        except OSError as exc:
            raise FetchError(f"file://{self._root}", f"deleting {key!r}: {exc}") from exc


def open_read_store(location: StorageLocation) -> S3ReadStore | FileReadStore:
    """The store a location names; each executor task opens its own."""
    if location.scheme == "file":
        return FileReadStore(location)
    return S3ReadStore(location)
