"""`S3Store`: any S3 API (MinIO, SeaweedFS, Ceph, AWS) through the MinIO SDK."""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from typing import BinaryIO

import urllib3
from minio import Minio
from minio.commonconfig import ComposeSource
from minio.error import MinioException, S3Error
from minio.helpers import MAX_MULTIPART_COUNT, MAX_PART_SIZE, MIN_PART_SIZE

from ._base import ObjectInfo, StoreError
from ._chain import concat_by_streaming
from ._multipart import put_parallel

# Large pieces: each one costs a thread hop in the gateway (bench/RESULTS.md).
_READ_PIECE = 4 * 1024 * 1024

# Failures that mean "the store is not usable right now" rather than a bug of ours.
_UNAVAILABLE = (MinioException, urllib3.exceptions.HTTPError, OSError, ValueError)


class S3Store:
    """Objects in one bucket of an S3-compatible service.

    Args:
        endpoint: `host:port` of the S3 API.
        bucket: the bucket all objects live in.
        access_key: S3 access key (None for anonymous).
        secret_key: S3 secret key.
        secure: use HTTPS.
        region: the bucket's region, when the service needs one.
        part_size: multipart part size for large payloads (>= 5 MiB); memory per upload is
            about part_size * parallel_uploads.
        parallel_uploads: parts uploaded at once for one large payload.
        timeout: seconds to connect and between bytes; a store that is down fails fast.
    """

    def __init__(
        self,
        endpoint: str,
        bucket: str,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        secure: bool = False,
        region: str | None = None,
        part_size: int = 8 * 1024 * 1024,
        parallel_uploads: int = 2,
        timeout: float = 10.0,
        pool_size: int = 32,
    ) -> None:
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=min(timeout, 3.0), read=timeout),
            maxsize=pool_size,
            # A store that is down must fail fast (503), one that hiccups (SeaweedFS and
            # MinIO answer 500 "please try again" under load) gets a retry.
            retries=urllib3.Retry(
                total=2, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]
            ),
        )
        self._client = Minio(
            endpoint,
            access_key=access_key,
            secret_key=secret_key,
            secure=secure,
            region=region,
            http_client=http,
        )
        self.bucket = bucket
        self._part_size = part_size
        self._parallel = parallel_uploads

    def __repr__(self) -> str:
        return f"S3Store(bucket={self.bucket!r})"

    @property
    def client(self) -> Minio:
        return self._client

    def ping(self) -> None:
        try:
            exists = self._client.bucket_exists(self.bucket)
        except _UNAVAILABLE as exc:
            raise StoreError(f"object store unreachable: {exc}") from exc
        if not exists:
            raise StoreError(f"bucket {self.bucket!r} does not exist")

    def ensure_bucket(self) -> None:
        try:
            if not self._client.bucket_exists(self.bucket):
                self._client.make_bucket(self.bucket)
        except S3Error as exc:
            if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise StoreError(f"cannot create bucket {self.bucket!r}: {exc}") from exc
        except _UNAVAILABLE as exc:
            raise StoreError(f"object store unreachable: {exc}") from exc

    def put_stream(
        self, key: str, reader: BinaryIO, length: int, content_type: str | None = None
    ) -> None:
        try:
            if self._parallel > 1:  # not the SDK's: it leaks its threads when a part fails
                put_parallel(
                    self._client,
                    self.bucket,
                    key,
                    reader,
                    length,
                    content_type=content_type or "application/octet-stream",
                    part_size=self._part_size,
                    parallel=self._parallel,
                )
                return
            self._client.put_object(
                self.bucket,
                key,
                reader,
                length,
                content_type=content_type or "application/octet-stream",
                part_size=self._part_size,
                num_parallel_uploads=1,
            )
        except _UNAVAILABLE as exc:
            raise StoreError(f"upload of {key!r} failed: {exc}") from exc

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/json") -> None:
        self.put_stream(key, io.BytesIO(data), len(data), content_type)

    def get_bytes(self, key: str) -> bytes | None:
        try:
            response = self._client.get_object(self.bucket, key)
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject"):
                return None
            raise StoreError(f"read of {key!r} failed: {exc}") from exc
        except _UNAVAILABLE as exc:
            raise StoreError(f"read of {key!r} failed: {exc}") from exc
        try:
            return bytes(response.read())
        except _UNAVAILABLE as exc:
            raise StoreError(f"read of {key!r} failed: {exc}") from exc
        finally:
            response.close()
            response.release_conn()

    def open_range(self, key: str, start: int = 0, length: int | None = None) -> Iterator[bytes]:
        try:
            response = self._client.get_object(self.bucket, key, offset=start, length=length or 0)
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject"):
                raise FileNotFoundError(key) from exc
            raise StoreError(f"read of {key!r} failed: {exc}") from exc
        except _UNAVAILABLE as exc:
            raise StoreError(f"read of {key!r} failed: {exc}") from exc
        return self._iterate(response, key)

    @staticmethod
    def _iterate(response: urllib3.BaseHTTPResponse, key: str) -> Iterator[bytes]:
        try:
            yield from response.stream(_READ_PIECE)
        except _UNAVAILABLE as exc:
            raise StoreError(f"read of {key!r} failed: {exc}") from exc
        finally:
            response.close()
            response.release_conn()

    def delete(self, key: str) -> None:
        try:
            self._client.remove_object(self.bucket, key)
        except S3Error as exc:
            if exc.code not in ("NoSuchKey", "NoSuchObject"):
                raise StoreError(f"delete of {key!r} failed: {exc}") from exc
        except _UNAVAILABLE as exc:
            raise StoreError(f"delete of {key!r} failed: {exc}") from exc

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        try:
            for obj in self._client.list_objects(self.bucket, prefix=prefix, recursive=True):
                if obj.object_name is not None and not obj.is_dir:
                    yield ObjectInfo(obj.object_name, obj.size or 0)
        except _UNAVAILABLE as exc:
            raise StoreError(f"listing {prefix!r} failed: {exc}") from exc

    def concat(
        self, key: str, sources: Sequence[ObjectInfo], content_type: str | None = None
    ) -> None:
        composable = (
            0 < len(sources) <= MAX_MULTIPART_COUNT
            and all(s.size >= MIN_PART_SIZE for s in sources[:-1])
            and all(s.size <= MAX_PART_SIZE for s in sources)
        )
        if composable:
            # UploadPartCopy: the bytes never leave the store.
            try:
                self._client.compose_object(
                    self.bucket,
                    key,
                    [ComposeSource(self.bucket, s.key) for s in sources],
                    metadata={"Content-Type": content_type or "application/octet-stream"},
                )
            except _UNAVAILABLE as exc:
                raise StoreError(f"compose of {key!r} failed: {exc}") from exc
            return
        # Parts below S3's 5 MiB minimum cannot be copied server-side: stream them through.
        concat_by_streaming(self, key, sources, content_type)
