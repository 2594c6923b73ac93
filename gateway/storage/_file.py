"""`FileStore`: the embedded store on local disk, same key layout, no server needed."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from ._base import ObjectInfo, StoreError, Versioned
from ._chain import concat_by_streaming
from ._versioned import content_version

_PIECE = 1024 * 1024
# Reads: under the gateway's 1 MiB mmap threshold (reused heap memory, no page faults per
# piece) and no larger than the send slice of gateway/middleware/_limits.py, so never re-sliced.
_READ_PIECE = 256 * 1024


class FileStore:
    """Objects as files below `root`; keys are relative paths.

    Writes go to a temporary file in the same directory and are renamed into place, so a
    reader never sees a partial object.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()

    def __repr__(self) -> str:
        return f"FileStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        # Keys come from our own layout, but never let one escape the root.
        if self.root not in path.parents:
            raise StoreError(f"key {key!r} escapes the store root")
        return path

    def ping(self) -> None:
        if not self.root.is_dir() or not os.access(self.root, os.W_OK):
            raise StoreError(f"{self.root} is not a writable directory")

    def ensure_bucket(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create {self.root}: {exc}") from exc

    def put_stream(
        self, key: str, reader: BinaryIO, length: int, content_type: str | None = None
    ) -> None:
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            remaining = length
            with tmp.open("wb") as out:
                while remaining != 0:
                    piece = reader.read(_PIECE if remaining < 0 else min(_PIECE, remaining))
                    if not piece:
                        break
                    out.write(piece)
                    if remaining > 0:
                        remaining -= len(piece)
            if remaining > 0:
                raise StoreError(f"{key!r}: stream ended {remaining} bytes early")
            os.replace(tmp, path)
        except OSError as exc:
            raise StoreError(f"write of {key!r} failed: {exc}") from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/json") -> None:
        self.put_stream(key, io.BytesIO(data), len(data))

    def create_bytes(self, key: str, data: bytes, content_type: str = "application/json") -> bool:
        """Write a temporary file, then hard-link it into place.

        `link(2)` fails with EEXIST when the name exists, atomically, and the name appears
        with its whole content (an `O_EXCL` create would expose a half-written file to
        readers); the same holds across processes sharing the directory (NFS included).
        """
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("wb") as out:
                out.write(data)
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            raise StoreError(f"write of {key!r} failed: {exc}") from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return True

    def read_versioned(self, key: str) -> Versioned | None:
        data = self.get_bytes(key)
        return None if data is None else Versioned(data, content_version(data))

    def write_versioned(
        self, key: str, data: bytes, *, version: str | None, content_type: str = "application/json"
    ) -> str | None:
        """Under an exclusive `flock` of the object's lock file, so the compare and the
        replace are one step for every process sharing the directory."""
        path = self._path(key)
        lock = path.with_name(f".{path.name}.lock")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with lock.open("a+b") as held:
                fcntl.flock(held.fileno(), fcntl.LOCK_EX)
                current = self.read_versioned(key)
                if (current is None) != (version is None):
                    return None
                if current is not None and current.version != version:
                    return None
                self.put_bytes(key, data, content_type)
        except OSError as exc:
            raise StoreError(f"write of {key!r} failed: {exc}") from exc
        return content_version(data)

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"read of {key!r} failed: {exc}") from exc

    def open_range(self, key: str, start: int = 0, length: int | None = None) -> Iterator[bytes]:
        path = self._path(key)
        handle = path.open("rb")  # FileNotFoundError propagates: the caller maps it to 404
        return self._iterate(handle, start, length)

    @staticmethod
    def _iterate(handle: BinaryIO, start: int, length: int | None) -> Iterator[bytes]:
        with handle:
            handle.seek(start)
            remaining = length
            while remaining is None or remaining > 0:
                piece = handle.read(
                    _READ_PIECE if remaining is None else min(_READ_PIECE, remaining)
                )
                if not piece:
                    return
                if remaining is not None:
                    remaining -= len(piece)
                yield piece

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        # Walk only below the deepest directory the prefix names.
        base_dir = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self.root / base_dir
        if not start.is_dir():
            return
        for dirpath, _dirs, files in os.walk(start):
            for name in files:
                if name.startswith("."):  # the store's own: temporary files, locks
                    continue
                full = Path(dirpath) / name
                key = full.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    yield ObjectInfo(key, full.stat().st_size)

    def concat(
        self, key: str, sources: Sequence[ObjectInfo], content_type: str | None = None
    ) -> None:
        concat_by_streaming(self, key, sources, content_type)
