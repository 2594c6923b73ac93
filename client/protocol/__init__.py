"""Pure protocol cores: values and codecs over bytes, with no network or storage I/O.

Shared by the client, the gateway, the discovery advertiser and the Spark reader. A leaf: it
imports nothing from the rest of the project and no I/O library (paho, httpx, minio, fastapi),
and it raises only its own errors (:mod:`client.protocol._errors`, re-exported by `client`).
`lint-imports` (contracts in pyproject.toml) keeps it that way.

Only the errors load with the package; every other name loads its module on first use
(PEP 562 `__getattr__`), since each `offload` command and each gateway or Spark process
needs a few of these codecs and building all their dataclasses cost about 50 ms a start.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import (
    ChecksumMismatchError,
    ChunkBufferOverflow,
    ChunkError,
    ChunkTimeoutError,
    DecompressionBomb,
    DecompressionFailed,
    DecryptionFailed,
    EnvelopeTooLarge,
    InvalidMessageId,
    InvalidTopic,
    MalformedChunk,
    MalformedDiscoveryRecord,
    MalformedEnvelope,
    MalformedPlaceholder,
    MessageTooLarge,
    NoMatchingIdentity,
    OffloadError,
    PayloadDecodeError,
    ProtocolError,
)

if TYPE_CHECKING:
    from ._addresses import IPV6_SHARE_PREFIX, address_key
    from ._bounded import Origin, http_origin, loads_object
    from ._chunk import ChunkPlan, PlannedChunk, plan_chunks, split
    from ._chunk_header import CHUNK_PROPERTY, ChunkHeader, chunk_header
    from ._discovery import (
        DISCOVERY_ENDPOINT_KEY,
        DISCOVERY_PROTOCOL_VERSION,
        DISCOVERY_TOPIC,
        DiscoveryRecord,
    )
    from ._encoding import PLAIN as PLAIN_ENCODING
    from ._encoding import Encoding
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
    from ._placeholder import FORMAT_KEY, ID_KEY, PLACEHOLDER_AWARE, Placeholder
    from ._placeholder import is_tagged as is_placeholder
    from ._placeholder import parse as parse_placeholder
    from ._props import PublishProperties, mqtt_text_problem, publish_properties_problem
    from ._reassembly import Complete as ChunkComplete
    from ._reassembly import Error as ChunkFailure
    from ._reassembly import Pending as ChunkPending
    from ._reassembly import Reassembler
    from ._retention import (
        ACKS_PREFIX,
        GROUP_PATTERN,
        PENDING_PREFIX,
        QUOTA_HEADER,
        AckKey,
        ack_key,
        ack_prefix,
        check_group,
        key_token,
        parse_ack_key,
        pending_at,
        pending_key,
        pending_prefix,
    )
    from ._size import MAX_PACKET_SIZE, encode_varint, fits, max_payload, publish_packet_size
    from ._tracecontext import (
        TRACEPARENT,
        TRACESTATE,
        TraceContext,
        carries_trace,
        parse_tracestate,
        without_trace,
    )
    from ._types import MAX_TOPIC_BYTES, MessageId, Topic, TopicFilter, mqtt_string_problem

# name -> (module, name there). Loaded on first use: a process that needs one value (the
# `offload` CLI checking a topic, a client importing its errors) does not pay for every codec.
_LAZY: dict[str, tuple[str, str]] = {
    "IPV6_SHARE_PREFIX": ("._addresses", "IPV6_SHARE_PREFIX"),
    "ACKS_PREFIX": ("._retention", "ACKS_PREFIX"),
    "GROUP_PATTERN": ("._retention", "GROUP_PATTERN"),
    "AckKey": ("._retention", "AckKey"),
    "ack_key": ("._retention", "ack_key"),
    "ack_prefix": ("._retention", "ack_prefix"),
    "check_group": ("._retention", "check_group"),
    "key_token": ("._retention", "key_token"),
    "parse_ack_key": ("._retention", "parse_ack_key"),
    "PENDING_PREFIX": ("._retention", "PENDING_PREFIX"),
    "QUOTA_HEADER": ("._retention", "QUOTA_HEADER"),
    "pending_at": ("._retention", "pending_at"),
    "pending_key": ("._retention", "pending_key"),
    "pending_prefix": ("._retention", "pending_prefix"),
    "address_key": ("._addresses", "address_key"),
    "CHUNK_PROPERTY": ("._chunk_header", "CHUNK_PROPERTY"),
    "CachedRecord": ("._endpoint_cache", "CachedRecord"),
    "ChunkComplete": ("._reassembly", "Complete"),
    "ChunkFailure": ("._reassembly", "Error"),
    "ChunkHeader": ("._chunk_header", "ChunkHeader"),
    "ChunkPending": ("._reassembly", "Pending"),
    "ChunkPlan": ("._chunk", "ChunkPlan"),
    "DATA_PREFIX": ("._layout", "DATA_PREFIX"),
    "DISCOVERY_ENDPOINT_KEY": ("._discovery", "DISCOVERY_ENDPOINT_KEY"),
    "DISCOVERY_PROTOCOL_VERSION": ("._discovery", "DISCOVERY_PROTOCOL_VERSION"),
    "DISCOVERY_TOPIC": ("._discovery", "DISCOVERY_TOPIC"),
    "DataKey": ("._layout", "DataKey"),
    "Encoding": ("._encoding", "Encoding"),
    "PLAIN_ENCODING": ("._encoding", "PLAIN"),
    "DiscoveryRecord": ("._discovery", "DiscoveryRecord"),
    "DownloadFields": ("._envelope_fields", "DownloadFields"),
    "EndpointCache": ("._endpoint_cache", "EndpointCache"),
    "EnvelopeComplete": ("._envelope", "Complete"),
    "EnvelopeParser": ("._envelope", "EnvelopeParser"),
    "FORMAT_KEY": ("._placeholder", "FORMAT_KEY"),
    "ID_KEY": ("._placeholder", "ID_KEY"),
    "INDEX_PREFIX": ("._layout", "INDEX_PREFIX"),
    "MAX_BSON_DOCUMENT": ("._envelope", "MAX_BSON_DOCUMENT"),
    "MAX_PACKET_SIZE": ("._size", "MAX_PACKET_SIZE"),
    "MAX_TOPIC_BYTES": ("._types", "MAX_TOPIC_BYTES"),
    "META_SUFFIX": ("._layout", "META_SUFFIX"),
    "Manifest": ("._layout", "Manifest"),
    "MessageId": ("._types", "MessageId"),
    "Origin": ("._bounded", "Origin"),
    "PayloadData": ("._envelope", "PayloadData"),
    "PayloadEnd": ("._envelope", "PayloadEnd"),
    "PayloadStart": ("._envelope", "PayloadStart"),
    "PLACEHOLDER_AWARE": ("._placeholder", "PLACEHOLDER_AWARE"),
    "Placeholder": ("._placeholder", "Placeholder"),
    "PlannedChunk": ("._chunk", "PlannedChunk"),
    "PublishProperties": ("._props", "PublishProperties"),
    "Reassembler": ("._reassembly", "Reassembler"),
    "TRACEPARENT": ("._tracecontext", "TRACEPARENT"),
    "TRACESTATE": ("._tracecontext", "TRACESTATE"),
    "Topic": ("._types", "Topic"),
    "TraceContext": ("._tracecontext", "TraceContext"),
    "TopicFilter": ("._types", "TopicFilter"),
    "UploadFields": ("._envelope_fields", "UploadFields"),
    "carries_trace": ("._tracecontext", "carries_trace"),
    "chunk_header": ("._chunk_header", "chunk_header"),
    "data_key": ("._layout", "data_key"),
    "decode_level": ("._layout", "decode_level"),
    "download_fields": ("._envelope_fields", "download_fields"),
    "encode_download": ("._envelope", "encode_download"),
    "encode_level": ("._layout", "encode_level"),
    "encode_upload": ("._envelope", "encode_upload"),
    "filter_prefix": ("._layout", "filter_prefix"),
    "fits": ("._size", "fits"),
    "http_origin": ("._bounded", "http_origin"),
    "index_key": ("._layout", "index_key"),
    "is_placeholder": ("._placeholder", "is_tagged"),
    "loads_object": ("._bounded", "loads_object"),
    "max_payload": ("._size", "max_payload"),
    "meta_key": ("._layout", "meta_key"),
    "mqtt_string_problem": ("._types", "mqtt_string_problem"),
    "mqtt_text_problem": ("._props", "mqtt_text_problem"),
    "parse_data_key": ("._layout", "parse_data_key"),
    "parse_placeholder": ("._placeholder", "parse"),
    "parse_tracestate": ("._tracecontext", "parse_tracestate"),
    "plan_chunks": ("._chunk", "plan_chunks"),
    "publish_packet_size": ("._size", "publish_packet_size"),
    "encode_varint": ("._size", "encode_varint"),
    "publish_properties_problem": ("._props", "publish_properties_problem"),
    "split": ("._chunk", "split"),
    "topic_prefix": ("._layout", "topic_prefix"),
    "upload_fields": ("._envelope_fields", "upload_fields"),
    "without_trace": ("._tracecontext", "without_trace"),
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where[0], __name__), where[1])
    globals()[name] = value
    return value


__all__ = [
    "ACKS_PREFIX",
    "CHUNK_PROPERTY",
    "DATA_PREFIX",
    "DISCOVERY_ENDPOINT_KEY",
    "DISCOVERY_PROTOCOL_VERSION",
    "DISCOVERY_TOPIC",
    "FORMAT_KEY",
    "GROUP_PATTERN",
    "ID_KEY",
    "INDEX_PREFIX",
    "IPV6_SHARE_PREFIX",
    "MAX_BSON_DOCUMENT",
    "MAX_PACKET_SIZE",
    "MAX_TOPIC_BYTES",
    "META_SUFFIX",
    "PENDING_PREFIX",
    "PLACEHOLDER_AWARE",
    "PLAIN_ENCODING",
    "QUOTA_HEADER",
    "TRACEPARENT",
    "TRACESTATE",
    "AckKey",
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
    "DecompressionBomb",
    "DecompressionFailed",
    "DecryptionFailed",
    "DiscoveryRecord",
    "DownloadFields",
    "Encoding",
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
    "NoMatchingIdentity",
    "OffloadError",
    "Origin",
    "PayloadData",
    "PayloadDecodeError",
    "PayloadEnd",
    "PayloadStart",
    "Placeholder",
    "PlannedChunk",
    "ProtocolError",
    "PublishProperties",
    "Reassembler",
    "Topic",
    "TopicFilter",
    "TraceContext",
    "UploadFields",
    "ack_key",
    "ack_prefix",
    "address_key",
    "carries_trace",
    "check_group",
    "chunk_header",
    "data_key",
    "decode_level",
    "download_fields",
    "encode_download",
    "encode_level",
    "encode_upload",
    "encode_varint",
    "filter_prefix",
    "fits",
    "http_origin",
    "index_key",
    "is_placeholder",
    "key_token",
    "loads_object",
    "max_payload",
    "meta_key",
    "mqtt_string_problem",
    "mqtt_text_problem",
    "parse_ack_key",
    "parse_data_key",
    "parse_placeholder",
    "parse_tracestate",
    "pending_at",
    "pending_key",
    "pending_prefix",
    "plan_chunks",
    "publish_packet_size",
    "publish_properties_problem",
    "split",
    "topic_prefix",
    "upload_fields",
    "without_trace",
]
