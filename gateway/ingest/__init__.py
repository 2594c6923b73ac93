"""The offload service: payloads streamed into the store, their manifests, and back out.

`OffloadService` (`_service`) stores a payload, then its manifest, then the id index, and
serves them back; `_pipe` hands a request body from the event loop to the store's upload
thread (`_small` takes a small one whole on the loop), `_payload_stream` a stored payload
back to a response, `_manifests` keeps the index and sidecars, `_cache` the manifests read
lately. Beside them the values every upload route parses the same way: topics from a URL,
checked against the object keys they name (`_topics`), publish options (`_options`),
content types (`_media`), text that must be UTF-8 (`_text`), and the per-user caps on
open uploads (`_quotas`). The HTTP half of ingest (receive a request body, commit,
announce on the broker) is `gateway.http._ingest`; it takes the request context.

Other folders use only the names below.
"""

from ._manifests import ManifestRepository
from ._media import PAYLOAD_SECURITY_HEADERS, essence, is_inline, parse_content_type, served_type
from ._options import (
    RESERVED,
    PublishOptions,
    check_filename,
    filename_from_disposition,
    parse_ascii_int,
)
from ._pipe import StreamingUpload, crc32c_text, crc32c_update
from ._quotas import QUOTA_PREFIX, Quotas, abandoned_grant, grant_record_body, parse_record
from ._service import (
    OffloadService,
    Stored,
    Upload,
    message_id_from_headers,
    now_ms,
)
from ._text import manifest_text_problem, text_problem
from ._topics import MAX_KEY_BYTES, OVERSIZED_SUFFIX, parse_topic

__all__ = [
    "MAX_KEY_BYTES",
    "OVERSIZED_SUFFIX",
    "PAYLOAD_SECURITY_HEADERS",
    "QUOTA_PREFIX",
    "RESERVED",
    "ManifestRepository",
    "OffloadService",
    "PublishOptions",
    "Quotas",
    "Stored",
    "StreamingUpload",
    "Upload",
    "abandoned_grant",
    "check_filename",
    "crc32c_text",
    "crc32c_update",
    "essence",
    "filename_from_disposition",
    "grant_record_body",
    "is_inline",
    "manifest_text_problem",
    "message_id_from_headers",
    "now_ms",
    "parse_ascii_int",
    "parse_content_type",
    "parse_record",
    "parse_topic",
    "served_type",
    "text_problem",
]
