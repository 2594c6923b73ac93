"""`S3Store`: any S3 API (MinIO, SeaweedFS, Ceph, AWS) through the MinIO SDK."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import BinaryIO

import urllib3
from minio import Minio
from minio.commonconfig import ComposeSource
from minio.error import S3Error
from minio.helpers import MAX_MULTIPART_COUNT, MAX_PART_SIZE, MIN_PART_SIZE

from ._async_http import AsyncStoreHttp, Body
from ._base import ObjectInfo, StoreError, Versioned
from ._buffers import Load, PartBuffers, Plan, part_size_under_load, plan
from ._chain import concat_by_streaming
from ._checksums import crc32c_header
from ._checksums import probe as probe_checksums
from ._http import pool_manager
from ._multipart import put_parallel
from ._probes import conditional_create, conditional_replace
from ._s3_direct import S3Direct
from ._sdk import _Minio
from ._versioned import UNAVAILABLE, s3_read, s3_write

log = logging.getLogger("gateway.storage")

# Under the gateway's 1 MiB mmap threshold, so a download's pieces reuse heap memory; the
# gateway reads several per thread hop (gateway/ingest/_payload_stream.py, bench/RESULTS.md).
_READ_PIECE = 256 * 1024

# Failures that mean "the store is not usable right now" rather than a bug of ours.


class S3Store:
    """Objects in one bucket of an S3-compatible service.

    `create_bytes` (the id index, the commit point) is a PUT with `If-None-Match: *`: the
    store refuses it with 412 when the key exists, atomically. Support: AWS S3 (PutObject and
    CompleteMultipartUpload, since August 2024; 409 ConditionalRequestConflict while a
    racing write is in flight, retried here), MinIO (PutObject, 2024 releases on), Ceph RGW
    (PutObject), SeaweedFS (PutObject and CompleteMultipartUpload: 4.48 tested, 30 races of
    8 writers each left exactly one winner with its bytes, and `tests/test_ingest_ids.py`).
    A store that ignores the header would let the last writer win, so `ensure_bucket`
    probes for it and logs an error when the store does not refuse a second create.

    Args:
        endpoint: `host:port` of the S3 API.
        bucket: the bucket all objects live in.
        access_key: S3 access key (None for anonymous).
        secret_key: S3 secret key.
        secure: use HTTPS.
        region: the bucket's region, when the service needs one.
        part_size: multipart part size for large payloads (>= 5 MiB) while the load allows.
        parallel_uploads: parts uploaded at once for one large payload, load allowing.
        part_memory: the part buffers all uploads share (`gateway.storage._buffers`): one
            alone gets `part_size * (parallel_uploads + 1)`, N in flight this over N each,
            never less than one 5 MiB part.
        checksums: send part bodies unsigned with a CRC-32C the store verifies, when
            `ensure_bucket` finds that the store does (`gateway.storage._checksums`).
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
        part_memory: int = 128 * 1024 * 1024,
        checksums: bool = True,
        timeout: float = 10.0,
        pool_size: int = 32,
    ) -> None:
        http = pool_manager(
            connect=min(timeout, 3.0),
            read=timeout,  # and sending: a busy store may read a part's body slowly
            maxsize=pool_size,
            # A store that is down must fail fast (503), one that hiccups (SeaweedFS and
            # MinIO answer 500 "please try again" under load) gets a retry.
            retries=urllib3.Retry(
                total=2, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]
            ),
        )
        self._http = http
        # Downloads and small writes on the event loop: presigned GETs (`read_url`, `read`)
        # and PUTs (`write`).
        self._on_loop = AsyncStoreHttp(connect_timeout=min(timeout, 3.0), read_timeout=timeout)
        self._client = _Minio(
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
        self._part_memory = part_memory
        # Unsigned payloads with a CRC-32C the store verifies: on when `ensure_bucket`'s
        # probe saw the store verify one (False: off; None: not probed, or asked off).
        self._checksums: bool | None = None if checksums else False
        # The same check of a presigned PUT's CRC-32C (a signed query parameter): the
        # event loop's own writes (`write`) rely on it.
        self._query_checksums = False
        self._load = Load()  # uploads and downloads in flight through this store
        # Idle buffers kept: what one upload alone uses, so sequential uploads reuse them.
        self._buffers = PartBuffers(keep_bytes=part_size * (parallel_uploads + 1))

    def __repr__(self) -> str:
        return f"S3Store(bucket={self.bucket!r})"

    @property
    def checksums(self) -> bool:
        """Whether upload bodies go unsigned with a CRC-32C the store verifies."""
        return bool(self._checksums)

    @property
    def client(self) -> Minio:
        return self._client

    def ping(self) -> None:
        try:
            exists = self._client.bucket_exists(self.bucket)
        except UNAVAILABLE as exc:
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
        except UNAVAILABLE as exc:
            raise StoreError(f"object store unreachable: {exc}") from exc
        conditional_create(self, self.bucket)
        conditional_replace(self, self.bucket)
        if self._checksums is None:
            why_not = probe_checksums(self._client, self.bucket)
            self._checksums = why_not is None
            if why_not is None:
                log.info("upload bodies go unsigned with a CRC-32C the store verifies")
            else:
                log.info("upload bodies signed with their SHA-256 (%s)", why_not)
        if self._checksums and not self._query_checksums:
            self._query_checksums = self._probe_query_checksum()

    def _probe_query_checksum(self) -> bool:
        """Whether the store refuses a presigned PUT whose signed `x-amz-checksum-crc32c`
        query parameter does not match its body (what `write` relies on), and takes one
        that does."""
        key = f"probes/query-checksum-{uuid.uuid4().hex}"
        data = b"query checksum probe"
        try:
            answers = []
            for crc_of in (b"something else", data):
                url = self._client.get_presigned_url(
                    "PUT", self.bucket, key, expires=datetime.timedelta(minutes=5),
                    extra_query_params=crc32c_header(crc_of),
                )  # fmt: skip
                answers.append(self._http.request("PUT", url, body=data, retries=False).status)
        except UNAVAILABLE as exc:
            log.warning("could not probe checksums on presigned writes: %s", exc)
            return False
        finally:
            with contextlib.suppress(StoreError):
                self.delete(key)
        verified = answers[0] >= 400 and answers[1] == 200
        if not verified:
            log.info("small writes go through the SDK: a presigned PUT's checksum answers %s",
                     answers)  # fmt: skip
        return verified

    def put_stream(
        self, key: str, reader: BinaryIO, length: int, content_type: str | None = None
    ) -> None:
        try:
            # Not the SDK's parallel upload: it leaks its threads when a part fails. Nor its
            # upload of unknown length: its fixed part size would stop at part 10,000.
            with self._load.one():
                put_parallel(
                    self._client,
                    self.bucket,
                    key,
                    reader,
                    length,
                    content_type=content_type or "application/octet-stream",
                    part_size=part_size_under_load(
                        self._part_size, budget=self._part_memory, transfers=self._load.count
                    ),
                    parallel=self._parallel,
                    buffers=self._buffers,
                    share=self._share,
                    checksums=bool(self._checksums),
                )
        except UNAVAILABLE as exc:
            raise StoreError(f"upload of {key!r} failed: {exc}") from exc

    def _share(self) -> Plan:
        return plan(
            part_size=self._part_size,
            parallel=self._parallel,
            budget=self._part_memory,
            transfers=self._load.count,
        )

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/json") -> None:
        self.put_stream(key, io.BytesIO(data), len(data), content_type)

    def create_bytes(self, key: str, data: bytes, content_type: str = "application/json") -> bool:
        # The SDK turns unknown headers into x-amz-meta-*: send the PUT through a presigned
        # URL (only `host` is signed) with the conditional header beside it.
        for _attempt in range(5):
            try:
                url = self._client.presigned_put_object(
                    self.bucket, key, expires=datetime.timedelta(minutes=5)
                )
                response = self._http.request(
                    "PUT",
                    url,
                    body=data,
                    headers={"If-None-Match": "*", "Content-Type": content_type},
                    retries=False,  # a retried create that had succeeded would look lost
                )
            except UNAVAILABLE as exc:
                raise StoreError(f"create of {key!r} failed: {exc}") from exc
            if response.status == 200:
                return True
            if response.status == 412:
                return False
            if response.status == 409:  # AWS: a racing conditional write is in flight
                time.sleep(0.05)
                continue
            detail = response.data[:300].decode("utf-8", "replace")
            raise StoreError(f"create of {key!r} failed: HTTP {response.status} {detail}")
        raise StoreError(f"create of {key!r} kept conflicting with concurrent writes")

    def read_versioned(self, key: str) -> Versioned | None:
        return s3_read(self._client, self.bucket, key)

    def write_versioned(
        self, key: str, data: bytes, *, version: str | None, content_type: str = "application/json"
    ) -> str | None:
        return s3_write(
            self._client, self._http, self.bucket, key, data,
            version=version, content_type=content_type,
        )  # fmt: skip

    def get_bytes(self, key: str) -> bytes | None:
        got = s3_read(self._client, self.bucket, key)
        return None if got is None else got.data

    def open_range(self, key: str, start: int = 0, length: int | None = None) -> Iterator[bytes]:
        try:
            response = self._client.get_object(self.bucket, key, offset=start, length=length or 0)
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject"):
                raise FileNotFoundError(key) from exc
            raise StoreError(f"read of {key!r} failed: {exc}") from exc
        except UNAVAILABLE as exc:
            raise StoreError(f"read of {key!r} failed: {exc}") from exc
        return self._iterate(response, key)

    def _iterate(self, response: urllib3.BaseHTTPResponse, key: str) -> Iterator[bytes]:
        try:
            # The stored bytes as they are (the manifest's SHA-256 covers them), and no
            # decoded-bytes buffer between the socket and us.
            with self._load.one():  # a download in flight counts against the part budget
                yield from response.stream(_READ_PIECE, decode_content=False)
        except UNAVAILABLE as exc:
            raise StoreError(f"read of {key!r} failed: {exc}") from exc
        finally:
            response.close()
            response.release_conn()

    def read_url(self, key: str) -> str:
        """A presigned GET of `key` at the store's own endpoint, for `read` (no network call
        once the bucket's region is known: from start-up's `ensure_bucket` or `ping` on)."""
        try:
            return self._client.presigned_get_object(
                self.bucket, key, expires=datetime.timedelta(minutes=5)
            )
        except UNAVAILABLE as exc:
            raise StoreError(f"cannot sign a read of {key!r}: {exc}") from exc

    def _signs_now(self) -> bool:
        """Whether signing needs no store call first: the bucket's region is known (from
        start-up's `ensure_bucket`, or the first call after it that reached the store)."""
        client = self._client
        return bool(client._base_url.region or client._region_map.get(self.bucket))

    def writes_now(self) -> bool:
        """Whether `write` may run: signing needs no store call, and start-up's probe saw
        the store verify the CRC-32C that protects a presigned PUT's body (the SDK's own
        requests sign the body's SHA-256 where it does not)."""
        return self._signs_now() and self._query_checksums

    async def write(
        self, key: str, data: bytes, content_type: str = "application/json", *, only_new: bool
    ) -> bool:
        """`put_bytes` or `create_bytes` on the event loop, through a presigned PUT.

        Signed on the caller's thread (no store call once `writes_now`). The CRC-32C the
        store verifies travels as a signed query parameter (an unsigned `x-amz-*` header
        is refused, `gateway.storage._s3_direct`); `If-None-Match` and the content type are
        plain headers, which a presigned PUT may add. A create is not retried on 5xx (as
        `create_bytes`): the commit that calls it tells its own lost answer from a rival.
        """
        query = crc32c_header(data)  # `writes_now`: the store verifies it
        headers = [("Content-Type", content_type)]
        if only_new:
            headers.append(("If-None-Match", "*"))
        for _attempt in range(5):
            try:
                url = self._client.get_presigned_url(
                    "PUT",
                    self.bucket,
                    key,
                    expires=datetime.timedelta(minutes=5),
                    extra_query_params=query,
                )
            except UNAVAILABLE as exc:
                raise StoreError(f"cannot sign a write of {key!r}: {exc}") from exc
            status, answer = await self._on_loop.put(url, data, headers, retry=not only_new)
            if 200 <= status < 300:
                return True
            if only_new and status == 412:
                return False
            if only_new and status == 409:  # AWS: a racing conditional write is in flight
                await asyncio.sleep(0.05)
                continue
            detail = answer[:300].decode("utf-8", "replace")
            raise StoreError(f"write of {key!r} failed: HTTP {status} {detail}")
        raise StoreError(f"create of {key!r} kept conflicting with concurrent writes")

    def read_url_now(self, key: str) -> str | None:
        """`read_url` once the bucket's region is known (signing alone, on the caller's
        thread); None before that, when signing would first ask the store."""
        return self.read_url(key) if self._signs_now() else None

    async def read(self, url: str, start: int = 0, length: int | None = None) -> Body:
        """The object at `url` (from `read_url`), or a range of it, read on the event loop.

        Raises:
            FileNotFoundError: no such object.
            StoreError: the store is unreachable or failed.
        """
        body = await self._on_loop.get(url, start=start, length=length)
        counted = contextlib.ExitStack()  # a download in flight counts against the part budget
        counted.enter_context(self._load.one())
        body.on_close(counted.close)
        return body

    def delete(self, key: str) -> None:
        try:
            self._client.remove_object(self.bucket, key)
        except S3Error as exc:
            if exc.code not in ("NoSuchKey", "NoSuchObject"):
                raise StoreError(f"delete of {key!r} failed: {exc}") from exc
        except UNAVAILABLE as exc:
            raise StoreError(f"delete of {key!r} failed: {exc}") from exc

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        try:
            for obj in self._client.list_objects(self.bucket, prefix=prefix, recursive=True):
                if obj.object_name is not None and not obj.is_dir:
                    yield ObjectInfo(obj.object_name, obj.size or 0)
        except UNAVAILABLE as exc:
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
            except UNAVAILABLE as exc:
                raise StoreError(f"compose of {key!r} failed: {exc}") from exc
            return
        # Parts below S3's 5 MiB minimum cannot be copied server-side: stream them through.
        concat_by_streaming(self, key, sources, content_type)

    # -- direct transfers (gateway/direct/_transfers.py): added, the methods above are untouched

    def direct(self, public_url: str) -> S3Direct:
        """Presigned URLs for clients that reach this store at `public_url`.

        Signed with this store's own credentials and region (read back from the SDK client,
        so nothing is kept twice).
        """
        provider = self._client._provider
        creds = provider.retrieve() if provider is not None else None
        return S3Direct(
            self._client,
            self.bucket,
            public_url=public_url,
            access_key=creds.access_key if creds else None,
            secret_key=creds.secret_key if creds else None,
            region=self._client._base_url.region,
        )
