"""The stored state of a resumable upload: `uploads/<id>.json` and its segments' keys.

A plain value with its JSON form, kept apart from `ResumableUploads` (the store calls) so
that either can be read alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from client.protocol import MessageId, Topic

from ..core import BadRequest
from ..ingest import PublishOptions
from ..storage import StoreError

UPLOADS_PREFIX = "uploads/"
STATE_VERSION = 1


def state_key(upload_id: str) -> str:
    return f"{UPLOADS_PREFIX}{upload_id}.json"


def segments_prefix(upload_id: str) -> str:
    return f"{UPLOADS_PREFIX}{upload_id}/"


@dataclass(frozen=True, slots=True)
class Segment:
    key: str
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class UploadState:
    """One resumable upload, as stored in `uploads/<id>.json`."""

    id: str
    topic: Topic
    length: int
    message_id: MessageId
    created: float  # seconds since the epoch
    expires: float
    segments: tuple[Segment, ...] = ()
    filename: str | None = None
    content_type: str | None = None
    sha256: str | None = None  # whole payload, lowercase hex, when the client named it
    options: PublishOptions = field(default_factory=PublishOptions)  # checked on arrival
    url: str | None = None  # set once completed and announced
    owner: str | None = None  # the creating user; None: anonymous (the id is the capability)
    partial: bool = False  # tus concatenation: a part, never published by itself
    parts: tuple[str, ...] = ()  # a final upload's partial uploads, removed once it is done

    def __post_init__(self) -> None:
        if self.length < 0:
            raise BadRequest("Upload-Length must not be negative")
        if self.offset > self.length:
            raise BadRequest("segments exceed the upload length")

    @property
    def offset(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def completed(self) -> bool:
        return self.url is not None

    def to_json(self) -> bytes:
        doc = {
            "v": STATE_VERSION,
            "id": self.id,
            "topic": self.topic.value,
            "length": self.length,
            "message_id": str(self.message_id),
            "created": self.created,
            "expires": self.expires,
            "segments": [[s.key, s.offset, s.size] for s in self.segments],
            "filename": self.filename,
            "content_type": self.content_type,
            "sha256": self.sha256,
            "options": self.options.to_json(),
            "url": self.url,
            "owner": self.owner,
            "partial": self.partial,
            "parts": list(self.parts),
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")

    @classmethod
    def from_json(cls, raw: bytes) -> UploadState:
        try:
            doc = json.loads(raw)
            return cls(
                id=str(doc["id"]),
                topic=Topic(doc["topic"]),
                length=int(doc["length"]),
                message_id=MessageId.parse(doc["message_id"]),
                created=float(doc["created"]),
                expires=float(doc["expires"]),
                segments=tuple(Segment(str(k), int(o), int(n)) for k, o, n in doc["segments"]),
                filename=doc.get("filename"),
                content_type=doc.get("content_type"),
                sha256=doc.get("sha256"),
                options=PublishOptions.from_json(doc.get("options") or {}),
                url=doc.get("url"),
                owner=doc.get("owner"),
                partial=bool(doc.get("partial", False)),
                parts=tuple(str(p) for p in doc.get("parts") or ()),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"unreadable upload state: {exc}") from exc
