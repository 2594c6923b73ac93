"""Resumable uploads (tus 1.0 and its extensions): protocol, locks, stored state, uploads.

Everything a tus upload is, apart from HTTP: `_protocol` parses tus headers and checksums
(pure), `_locks` holds one request at a time per upload on this replica (tusd's upload
locks), `_state` is an upload's stored record, `_uploads` (`ResumableUploads`) creates,
appends, concatenates, finishes and expires uploads, in the object store only. The routes
are `gateway.http._routes_tus`; the retention sweep calls `cleanup_expired_uploads`.

Other folders use only the names below.
"""

from ._locks import Hold
from ._protocol import (
    CHECKSUM_ALGORITHMS,
    TUS_EXTENSIONS,
    TUS_VERSION,
    http_date,
    parse_checksum,
    parse_concat,
    parse_metadata,
)
from ._state import UploadState
from ._uploads import ResumableUploads, cleanup_expired_uploads

__all__ = [
    "CHECKSUM_ALGORITHMS",
    "TUS_EXTENSIONS",
    "TUS_VERSION",
    "Hold",
    "ResumableUploads",
    "UploadState",
    "cleanup_expired_uploads",
    "http_date",
    "parse_checksum",
    "parse_concat",
    "parse_metadata",
]
