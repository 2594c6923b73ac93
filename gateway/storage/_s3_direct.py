"""Presigned store URLs for direct transfers: clients move the bytes, the gateway signs.

Two MinIO clients: the store's own (`S3Store.client`, the endpoint the gateway reaches) for
the few calls the gateway makes itself (start, complete or abort a multipart upload, stat,
delete), and one built for `OFFLOAD_S3_PUBLIC_URL` that only signs. SigV4 signs the Host
header, so a URL must be signed for the host the client will send it to.

Signing makes no network call: the region is the configured one, else asked of the store
once (the SDK would otherwise look it up per URL) and kept.

Content is bound into each URL: the part's SHA-256 (base64) travels as the signed query
parameter `x-amz-checksum-sha256`, and the store refuses a body that does not hash to it
(400 BadDigest). Checked against SeaweedFS 4.48 (tests/test_direct.py); the same value as
an unsigned header is refused there with 403 SignatureDoesNotMatch, which is why it rides
in the query.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from minio import Minio
from minio.datatypes import Part
from minio.error import S3Error

from ._base import StoreError

_GONE = ("NoSuchKey", "NoSuchObject", "NoSuchUpload")


class S3Direct:
    """Multipart uploads and presigned URLs on one bucket, for clients at `public_url`.

    Args:
        client: the store's own client (network calls).
        bucket: the bucket.
        public_url: `scheme://host[:port]` of the store as clients reach it.
        access_key: the same credentials the store client uses (signing only).
        secret_key: as above.
        region: the bucket's region; None: asked of the store once, on first use.
    """

    def __init__(
        self,
        client: Minio,
        bucket: str,
        *,
        public_url: str,
        access_key: str | None,
        secret_key: str | None,
        region: str | None,
    ) -> None:
        self._client = client
        self.bucket = bucket
        self.public_url = public_url
        self._access_key = access_key
        self._secret_key = secret_key
        self._region = region
        self._signer: Minio | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"S3Direct(bucket={self.bucket!r}, public_url={self.public_url!r})"

    def _public(self) -> Minio:
        """The signing client, made once the region is known (one store call at most)."""
        with self._lock:
            if self._signer is None:
                try:
                    region = self._region or self._client._get_region(self.bucket)
                except Exception as exc:  # the SDK raises several kinds; all mean "not now"
                    raise StoreError(f"cannot learn the bucket's region: {exc}") from exc
                parts = urlsplit(self.public_url)
                self._signer = Minio(
                    parts.netloc,
                    access_key=self._access_key,
                    secret_key=self._secret_key,
                    secure=parts.scheme == "https",
                    region=region,
                )
            return self._signer

    def presign_put(
        self,
        key: str,
        *,
        sha256_b64: str,
        seconds: int,
        upload_id: str | None = None,
        part_number: int | None = None,
    ) -> str:
        """A PUT URL for the object (or one part of a multipart upload) and only that content."""
        query: dict[str, str | list[str] | tuple[str]] = {"x-amz-checksum-sha256": sha256_b64}
        if upload_id is not None:
            query |= {"uploadId": upload_id, "partNumber": str(part_number)}
        return self._public().get_presigned_url(
            "PUT",
            self.bucket,
            key,
            expires=datetime.timedelta(seconds=seconds),
            extra_query_params=query,
        )

    def presign_get(
        self, key: str, *, seconds: int, response_headers: Mapping[str, str] | None = None
    ) -> str:
        """A GET URL for the object; `response_headers` become `response-*` overrides."""
        return self._public().get_presigned_url(
            "GET",
            self.bucket,
            key,
            expires=datetime.timedelta(seconds=seconds),
            response_headers={k: v for k, v in (response_headers or {}).items()},
        )

    def start_multipart(self, key: str, content_type: str) -> str:
        """A new multipart upload's id."""
        try:
            return self._client._create_multipart_upload(
                self.bucket, key, {"Content-Type": content_type}
            )
        except Exception as exc:
            raise StoreError(f"cannot start a multipart upload of {key!r}: {exc}") from exc

    def complete_multipart(self, key: str, upload_id: str, etags: Sequence[str]) -> str | None:
        """Join the parts; None when done, else the store's reason for refusing them.

        A refusal (a missing part, an ETag that names other bytes, a part under 5 MiB) is
        the uploader's fault and comes back as text; an unreachable store raises.
        """
        parts = [Part(number, etag) for number, etag in enumerate(etags, 1)]
        try:
            self._client._complete_multipart_upload(self.bucket, key, upload_id, parts)
        except S3Error as exc:
            return f"{exc.code}: {exc.message}"
        except Exception as exc:
            raise StoreError(f"cannot complete the upload of {key!r}: {exc}") from exc
        return None

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Drop an unfinished upload and its parts; no error when it is already gone."""
        try:
            self._client._abort_multipart_upload(self.bucket, key, upload_id)
        except S3Error as exc:
            if exc.code not in _GONE:
                raise StoreError(f"cannot abort the upload of {key!r}: {exc}") from exc
        except Exception as exc:
            raise StoreError(f"cannot abort the upload of {key!r}: {exc}") from exc

    def size(self, key: str) -> int | None:
        """The object's size, None when it does not exist."""
        try:
            return self._client.stat_object(self.bucket, key).size
        except S3Error as exc:
            if exc.code in _GONE:
                return None
            raise StoreError(f"cannot stat {key!r}: {exc}") from exc
        except Exception as exc:
            raise StoreError(f"cannot stat {key!r}: {exc}") from exc
