"""Pure protocol cores: values and codecs over bytes, with no network or storage I/O.

Shared by the client, the gateway and the Spark reader.
"""

from ._chunk import (
    CHUNK_PROPERTY,
    ChunkHeader,
    ChunkPlan,
    PlannedChunk,
    Reassembler,
    chunk_header,
    plan_chunks,
    split,
)
from ._chunk import Complete as ChunkComplete
from ._chunk import Error as ChunkFailure
from ._chunk import Pending as ChunkPending
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
from ._layout import (
    DATA_PREFIX,
    INDEX_PREFIX,
    META_SUFFIX,
    DataKey,
    Manifest,
    data_key,
    filter_prefix,
    index_key,
    meta_key,
    parse_data_key,
    topic_prefix,
)
from ._props import PublishProperties
from ._size import MAX_PACKET_SIZE, fits, max_payload, publish_packet_size
from ._types import MAX_TOPIC_BYTES, MessageId, Topic, TopicFilter, mqtt_string_problem

__all__ = [
    "CHUNK_PROPERTY",
    "DATA_PREFIX",
    "INDEX_PREFIX",
    "MAX_BSON_DOCUMENT",
    "MAX_PACKET_SIZE",
    "MAX_TOPIC_BYTES",
    "META_SUFFIX",
    "ChunkComplete",
    "ChunkFailure",
    "ChunkHeader",
    "ChunkPending",
    "ChunkPlan",
    "DataKey",
    "DownloadFields",
    "EnvelopeComplete",
    "EnvelopeParser",
    "Manifest",
    "MessageId",
    "PayloadData",
    "PayloadEnd",
    "PayloadStart",
    "PlannedChunk",
    "PublishProperties",
    "Reassembler",
    "Topic",
    "TopicFilter",
    "UploadFields",
    "chunk_header",
    "data_key",
    "download_fields",
    "encode_download",
    "encode_upload",
    "filter_prefix",
    "fits",
    "index_key",
    "max_payload",
    "meta_key",
    "mqtt_string_problem",
    "parse_data_key",
    "plan_chunks",
    "publish_packet_size",
    "split",
    "topic_prefix",
    "upload_fields",
]
