"""Pure protocol cores: values and codecs over bytes, with no network or storage I/O.

Shared by the client, the gateway, the discovery advertiser and the Spark reader. A leaf: it
imports nothing from the rest of the project and no I/O library (paho, httpx, minio, fastapi),
and it raises only its own errors (:mod:`client.protocol._errors`, re-exported by `client`).
`lint-imports` (contracts in pyproject.toml) keeps it that way.
"""

from ._bounded import Origin, http_origin, loads_object
from ._chunk import (
    CHUNK_PROPERTY,
    ChunkHeader,
    ChunkPlan,
    PlannedChunk,
    chunk_header,
    plan_chunks,
    split,
)
from ._discovery import (
    DISCOVERY_ENDPOINT_KEY,
    DISCOVERY_PROTOCOL_VERSION,
    DISCOVERY_TOPIC,
    DiscoveryRecord,
)
from ._endpoint_cache import CachedRecord, EndpointCache
from ._envelope import (
    MAX_BSON_DOCUMENT,
    EnvelopeParser,
    PayloadData,
    PayloadEnd,
    PayloadStart,
    encode_download,
    encode_upload,
)
from ._envelope import Complete as EnvelopeComplete
from ._envelope_fields import DownloadFields, UploadFields, download_fields, upload_fields
from ._errors import (
    ChecksumMismatchError,
    ChunkBufferOverflow,
    ChunkError,
    ChunkTimeoutError,
    EnvelopeTooLarge,
    InvalidMessageId,
    InvalidTopic,
    MalformedChunk,
    MalformedDiscoveryRecord,
    MalformedEnvelope,
    MalformedPlaceholder,
    MessageTooLarge,
    OffloadError,
    ProtocolError,
)
from ._layout import (
    DATA_PREFIX,
    INDEX_PREFIX,
    META_SUFFIX,
    DataKey,
    Manifest,
    data_key,
    decode_level,
    encode_level,
    filter_prefix,
    index_key,
    meta_key,
    parse_data_key,
    topic_prefix,
)
from ._placeholder import FORMAT_KEY, ID_KEY, Placeholder
from ._props import PublishProperties, mqtt_text_problem, publish_properties_problem
from ._reassembly import Complete as ChunkComplete
from ._reassembly import Error as ChunkFailure
from ._reassembly import Pending as ChunkPending
from ._reassembly import Reassembler
from ._size import MAX_PACKET_SIZE, fits, max_payload, publish_packet_size
from ._types import MAX_TOPIC_BYTES, MessageId, Topic, TopicFilter, mqtt_string_problem

__all__ = [
    "CHUNK_PROPERTY",
    "DATA_PREFIX",
    "DISCOVERY_ENDPOINT_KEY",
    "DISCOVERY_PROTOCOL_VERSION",
    "DISCOVERY_TOPIC",
    "FORMAT_KEY",
    "ID_KEY",
    "INDEX_PREFIX",
    "MAX_BSON_DOCUMENT",
    "MAX_PACKET_SIZE",
    "MAX_TOPIC_BYTES",
    "META_SUFFIX",
    "CachedRecord",
    "ChecksumMismatchError",
    "ChunkBufferOverflow",
    "ChunkComplete",
    "ChunkError",
    "ChunkFailure",
    "ChunkHeader",
    "ChunkPending",
    "ChunkPlan",
    "ChunkTimeoutError",
    "DataKey",
    "DiscoveryRecord",
    "DownloadFields",
    "EndpointCache",
    "EnvelopeComplete",
    "EnvelopeParser",
    "EnvelopeTooLarge",
    "InvalidMessageId",
    "InvalidTopic",
    "MalformedChunk",
    "MalformedDiscoveryRecord",
    "MalformedEnvelope",
    "MalformedPlaceholder",
    "Manifest",
    "MessageId",
    "MessageTooLarge",
    "OffloadError",
    "Origin",
    "PayloadData",
    "PayloadEnd",
    "PayloadStart",
    "Placeholder",
    "PlannedChunk",
    "ProtocolError",
    "PublishProperties",
    "Reassembler",
    "Topic",
    "TopicFilter",
    "UploadFields",
    "chunk_header",
    "data_key",
    "decode_level",
    "download_fields",
    "encode_download",
    "encode_level",
    "encode_upload",
    "filter_prefix",
    "fits",
    "http_origin",
    "index_key",
    "loads_object",
    "max_payload",
    "meta_key",
    "mqtt_string_problem",
    "mqtt_text_problem",
    "parse_data_key",
    "plan_chunks",
    "publish_packet_size",
    "publish_properties_problem",
    "split",
    "topic_prefix",
    "upload_fields",
]
