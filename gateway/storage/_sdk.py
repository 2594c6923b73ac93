"""The MinIO SDK as `S3Store` uses it: without its MD5 of every request body over TLS."""

from __future__ import annotations

import datetime

from minio import Minio
from minio.credentials.credentials import Credentials
from minio.helpers import DictType

from ._checksums import HEADER as CHECKSUM_HEADER


class _Minio(Minio):
    """The MinIO SDK without its MD5 of every request body over TLS.

    Over https the SDK signs `UNSIGNED-PAYLOAD` and then hashes each body with MD5 for a
    `Content-MD5` header: 1.5 CPU-s per GiB here, 2.5 times the SHA-256 it signs with over
    plain http (bench/RESULTS.md, "Request signing"). TLS already protects the bytes in
    transit and the manifest's SHA-256 (checked by every consumer) covers them end to end;
    S3 asks for Content-MD5 only on calls this store never makes (DeleteObjects, bucket
    configuration) and on buckets with Object Lock retention, which cannot hold offloaded
    messages anyway (their expiry deletes them). Plain http keeps the signed SHA-256.
    """

    def _build_headers(
        self,
        host: str,
        headers: DictType | None = None,
        body: bytes | None = None,
        creds: Credentials | None = None,
    ) -> tuple[DictType, datetime.datetime]:
        if body and creds is not None and (headers or {}).get(CHECKSUM_HEADER):
            # The store verifies the body's CRC-32C (gateway.storage._checksums): sign
            # UNSIGNED-PAYLOAD rather than hash the body with SHA-256 (or MD5) again.
            built, date = super()._build_headers(host, headers, None, creds)
            built["Content-Length"] = str(len(body))
            built["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
            return built, date
        skip = bool(body) and creds is not None and self._base_url.is_https
        if not skip or (headers or {}).get("Content-MD5"):
            return super()._build_headers(host, headers, body, creds)
        marked: DictType = {**(headers or {}), "Content-MD5": "-"}  # "already there"
        built, date = super()._build_headers(host, marked, body, creds)
        del built["Content-MD5"]  # removed before signing: never sent
        return built, date
