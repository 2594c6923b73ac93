"""A topic as the upload routes take it: from a URL path segment, checked against the
object keys it will name (`client.protocol`'s storage layout) on every store."""

from __future__ import annotations

from client.protocol import Topic, encode_level, topic_prefix

from ..core import BadRequest

OVERSIZED_SUFFIX = "+oversized"
MAX_KEY_BYTES = 1024  # S3's limit on object keys
MAX_LEVEL_BYTES = 255  # one file name on the file store (NAME_MAX)
# After the topic: "date=YYYY-MM-DD/hour=HH/" + 32-hex token + ".meta.json".
_KEY_TAIL = len("date=2026-01-01/hour=00/") + 32 + len(".meta.json")


def parse_topic(raw: str, *, max_bytes: int) -> Topic:
    """A topic from a URL path segment; 400 with a reason when unusable.

    Each level becomes one segment of the object key (percent-encoded, `_layout`), and on
    the file store one file name: a level longer than 255 bytes once encoded (NAME_MAX on
    every common file system) is refused on every store, so a topic works on both or
    neither, and the whole key must fit S3's 1024 bytes.
    """
    topic = Topic(raw)  # raises InvalidTopic (400) for empty, wildcards, NUL
    if topic.value.startswith("$"):
        raise BadRequest(f"topic {raw!r}: topics starting with '$' are reserved for the broker")
    if len(topic.value.encode("utf-8")) > max_bytes:
        raise BadRequest(f"topic longer than {max_bytes} bytes")
    for number, level in enumerate(topic.levels, 1):
        encoded = len(encode_level(level))
        if encoded > MAX_LEVEL_BYTES:
            raise BadRequest(
                f"topic level {number} is {encoded} bytes once percent-encoded for the "
                f"object key; at most {MAX_LEVEL_BYTES}"
            )
    if len(topic_prefix(topic)) + _KEY_TAIL > MAX_KEY_BYTES:
        raise BadRequest(f"topic too long: its object keys would exceed {MAX_KEY_BYTES} bytes")
    return topic
