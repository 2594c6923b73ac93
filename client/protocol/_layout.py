"""Object-store layout: where payloads and their metadata live. Pure, no I/O.

Two kinds of object, both written by the gateway, readable by any S3 tool::

    data/<topic levels>/date=YYYY-MM-DD/hour=HH/<token>            raw payload bytes
    data/<topic levels>/date=YYYY-MM-DD/hour=HH/<token>.meta.json  Manifest (sidecar)
    ids/<message id>.json                                           Manifest (id index)

* A reader selects by topic and time with a key prefix: topic `a/x` on 2026-11-22 is
  `data/a/x/date=2026-11-22/`; the filter `a/#` is `data/a/`. No full listing.
* `GET /msg/<id>` reads `ids/<id>.json` then the payload: a constant two requests.
* The index is written last, so only complete uploads are ever visible by id.
* `<token>` is a fresh random UUID per upload: a hop-client upload names its id only in the
  headers after the payload, so the id is unknown while the payload streams.

Each topic level is percent-encoded (RFC 3986 unreserved characters kept), so `/`, `=`,
`%` and non-ASCII are unambiguous; the levels `.` and `..` are written `%2E` / `%2E%2E` so no
tool mistakes them for path steps, and an empty level is written `%00` (NUL cannot occur in an
MQTT topic). Any segment containing `=` is therefore a partition, never a topic level.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote

from ._errors import ProtocolError
from ._retention import check_group, key_token
from ._tracecontext import TraceContext
from ._types import MessageId, Topic, TopicFilter

DATA_PREFIX = "data/"
INDEX_PREFIX = "ids/"
META_SUFFIX = ".meta.json"
MANIFEST_VERSION = 1


def encode_level(level: str) -> str:
    if level == "":
        return "%00"
    if level in (".", ".."):
        return "%2E" * len(level)
    return quote(level, safe="")


def decode_level(segment: str) -> str:
    if segment == "%00":
        return ""
    return unquote(segment, errors="strict")


def topic_prefix(topic: Topic) -> str:
    """Key prefix of every payload on exactly this topic (ends with `/`)."""
    return DATA_PREFIX + "/".join(encode_level(lv) for lv in topic.levels) + "/"


def filter_prefix(topic_filter: TopicFilter) -> str:
    """The longest key prefix under which every match of `topic_filter` lies.

    Levels before the first wildcard become the prefix; callers still check each key's
    topic against the filter (a `+` level, or `#` matching the parent level itself).
    """
    fixed: list[str] = []
    for level in topic_filter.levels:
        if level in ("+", "#"):
            break
        fixed.append(encode_level(level))
    if not fixed:
        return DATA_PREFIX
    if len(fixed) == len(topic_filter.levels):
        return DATA_PREFIX + "/".join(fixed) + "/date="
    return DATA_PREFIX + "/".join(fixed) + "/"


def utc_parts(timestamp_ms: int) -> tuple[str, str]:
    dt = datetime.fromtimestamp(timestamp_ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%d"), dt.strftime("%H")


def data_key(topic: Topic, timestamp_ms: int, token: str) -> str:
    date, hour = utc_parts(timestamp_ms)
    return f"{topic_prefix(topic)}date={date}/hour={hour}/{token}"


def index_key(message_id: MessageId) -> str:
    return f"{INDEX_PREFIX}{message_id}.json"


def meta_key(payload_key: str) -> str:
    return payload_key + META_SUFFIX


@dataclass(frozen=True, slots=True)
class DataKey:
    """A parsed payload key."""

    topic: Topic
    date: str
    hour: str
    token: str


def parse_data_key(key: str) -> DataKey | None:
    """Parse a payload key; None for sidecars and keys outside the layout."""
    if not key.startswith(DATA_PREFIX) or key.endswith(META_SUFFIX):
        return None
    parts = key[len(DATA_PREFIX) :].split("/")
    if len(parts) < 4 or not parts[-3].startswith("date=") or not parts[-2].startswith("hour="):
        return None
    try:
        topic = Topic("/".join(decode_level(p) for p in parts[:-3]))
    except (ProtocolError, UnicodeDecodeError):
        return None
    return DataKey(topic, parts[-3][5:], parts[-2][5:], parts[-1])


def _is_crc32c(text: object) -> bool:
    return isinstance(text, str) and len(text) == 8 and all(c in "0123456789abcdef" for c in text)


def _traceparent(value: object) -> str | None:
    """A stored traceparent as it is when it parses; anything else is none."""
    ctx = TraceContext.parse(value) if isinstance(value, str) else None
    return None if ctx is None else ctx.traceparent


def _optional_text(value: object, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ProtocolError(f"manifest: {name} must be text")


def _groups(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
        raise ProtocolError("manifest: groups must be a list of group names")
    return tuple(value)


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise ProtocolError("manifest: binary field must be base64 text")
    return base64.b64decode(text, validate=True)


@dataclass(frozen=True, slots=True)
class Manifest:
    """Everything known about one stored message except its payload bytes.

    `crc32c` (8 lowercase hex digits, the CRC-32C of the payload as S3's
    `x-amz-checksum-crc32c` defines it, big-endian) was added after version 1 shipped, so it
    is optional: manifests written before it have none, and a reader that does not know it
    ignores it (`from_json` ignores unknown keys). It detects corruption and mismatched or
    torn objects cheaply; only `sha256` also stands against someone who rewrites payloads.

    `traceparent` (W3C Trace Context, added likewise) is the trace the upload belonged to:
    the gateway's request span that stored it. A value that does not parse is read as none,
    never as an error: it is a trace id, not part of the message.

    Added for retention by group and one object per payload (docs/operations.md), each
    absent from the JSON when unset, as the two above:

    * `filed_at`: the message's own key when its payload is an object another message of
      the same account stored (`data_key` names that object): its sidecar is
      `meta_key(filed_at)`, and no payload object exists at `filed_at` itself;
    * `groups`: the consumer groups that must each confirm the message before it is
      deleted ahead of its expiry (fixed when it is committed);
    * `blob`: the key of the record that counts the messages sharing the payload object
      (`gateway.retention`); None: the payload is the message's alone (written before
      records existed, or by a gateway that keeps none), deleted with it.
    """

    id: MessageId
    topic: Topic
    timestamp: int  # milliseconds since the epoch, UTC
    size: int
    sha256: str
    data_key: str
    headers: tuple[tuple[str, bytes], ...] = ()
    key: bytes | None = None
    content_type: str | None = None
    filename: str | None = None
    expires: int | None = None  # milliseconds since the epoch; None: keep
    extra: dict[str, Any] = field(default_factory=dict)
    crc32c: str | None = None
    traceparent: str | None = None
    filed_at: str | None = None
    groups: tuple[str, ...] = ()
    blob: str | None = None

    def __post_init__(self) -> None:
        if self.crc32c is not None and not _is_crc32c(self.crc32c):
            raise ProtocolError("manifest: crc32c must be 8 lowercase hex digits")
        if self.traceparent is not None and TraceContext.parse(self.traceparent) is None:
            raise ProtocolError("manifest: traceparent is not a W3C traceparent")
        for group in self.groups:
            check_group(group)

    @property
    def home(self) -> str:
        """The message's own key: its sidecar is `meta_key(home)` (`filed_at`, else
        `data_key`)."""
        return self.filed_at or self.data_key

    @property
    def token(self) -> str:
        """The last segment of `home`: this message's, not its id's (ids can be reused)."""
        return key_token(self.home)

    @property
    def trace_id(self) -> str | None:
        """The trace id of the upload (32 lowercase hex digits), None when unknown."""
        ctx = TraceContext.parse(self.traceparent)
        return None if ctx is None else ctx.trace_id_hex

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "v": MANIFEST_VERSION,
            "id": str(self.id),
            "topic": self.topic.value,
            "timestamp": self.timestamp,
            "size": self.size,
            "sha256": self.sha256,
            "data_key": self.data_key,
            "headers": [[name, _b64(value)] for name, value in self.headers],
            "key": _b64(self.key),
            "content_type": self.content_type,
            "filename": self.filename,
            "expires": self.expires,
        }
        if self.extra:
            doc["extra"] = self.extra
        if self.crc32c is not None:  # absent rather than null: as a pre-crc32c manifest
            doc["crc32c"] = self.crc32c
        if self.traceparent is not None:  # likewise
            doc["traceparent"] = self.traceparent
        if self.filed_at is not None:
            doc["filed_at"] = self.filed_at
        if self.groups:
            doc["groups"] = list(self.groups)
        if self.blob is not None:
            doc["blob"] = self.blob
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        try:
            doc = json.loads(raw)
            headers = tuple((str(n), _unb64(v) or b"") for n, v in doc.get("headers", []))
            return cls(
                id=MessageId.parse(doc["id"]),
                topic=Topic(doc["topic"]),
                timestamp=int(doc["timestamp"]),
                size=int(doc["size"]),
                sha256=str(doc["sha256"]),
                data_key=str(doc["data_key"]),
                headers=headers,
                key=_unb64(doc.get("key")),
                content_type=doc.get("content_type"),
                filename=doc.get("filename"),
                expires=doc.get("expires"),
                extra=dict(doc.get("extra") or {}),
                crc32c=doc.get("crc32c"),
                traceparent=_traceparent(doc.get("traceparent")),
                filed_at=_optional_text(doc.get("filed_at"), "filed_at"),
                groups=_groups(doc.get("groups")),
                blob=_optional_text(doc.get("blob"), "blob"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed manifest: {exc}") from exc
