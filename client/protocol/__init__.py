"""Pure protocol cores: values and codecs over bytes, with no network or storage I/O.

Shared by the client, the gateway and the Spark reader.
"""

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
from ._types import MAX_TOPIC_BYTES, MessageId, Topic, TopicFilter

__all__ = [
    "DATA_PREFIX",
    "INDEX_PREFIX",
    "MAX_TOPIC_BYTES",
    "META_SUFFIX",
    "DataKey",
    "Manifest",
    "MessageId",
    "PublishProperties",
    "Topic",
    "TopicFilter",
    "data_key",
    "filter_prefix",
    "index_key",
    "meta_key",
    "parse_data_key",
    "topic_prefix",
]
