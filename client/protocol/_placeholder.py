"""The `_format=external` placeholder published in place of an offloaded payload. Pure.

One placeholder for every protocol version: the payload always carries the tag and the id
itself, so any consumer recognises it whichever version published it and whichever receives
it (a broker hands an MQTT 5 message to a 3.1.1 subscriber without its properties)::

    {"_format": "external", "_id": "<uuid>",
     "url": "https://gw.example/msg/<uuid>", "size": 20971520, "sha256": "<64 hex>"}

An MQTT 5 placeholder also has the user properties `_format=external` and `_id=<uuid>`
(hop-client's headers), followed by the original user properties. hop-client's own
`ExternalMessage` reads only `url` from the JSON, so the extra members do not disturb it.
An encrypted or compressed payload adds `cmp`, `enc` and `kid` (:mod:`._encoding`); `size`
and `sha256` then describe the stored bytes.

Detection rule (both protocol versions): a message is a placeholder when it has the user
property `_format=external`, or when it has no `_format` user property and its payload is a
JSON object (at most 64 KiB, nested at most 16 deep) whose `"_format"` member is
`"external"`. A tagged message whose reference cannot be read is a
:class:`MalformedPlaceholder`, never a payload. Size and depth are checked before any JSON is
decoded (:mod:`client.protocol._bounded`): every placeholder is hostile input.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from ._bounded import Origin, http_origin, loads_object
from ._encoding import PLAIN, Encoding
from ._errors import MalformedPlaceholder
from ._props import PublishProperties
from ._types import MessageId

FORMAT_KEY = "_format"
FORMAT_EXTERNAL = "external"
ID_KEY = "_id"
MAX_PLACEHOLDER_BYTES = 65536
#: The MQTT 5 CONNECT user property by which a client says it resolves placeholders itself:
#: an offload-proxy then hands it placeholders as they are (docs/proxy.md).
PLACEHOLDER_AWARE = ("_offload", "placeholders")

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class Placeholder:
    """A reference to an offloaded payload."""

    url: str
    size: int
    sha256: str
    message_id: MessageId
    #: compression and encryption of the stored bytes (:mod:`client.protocol._encoding`)
    encoding: Encoding = PLAIN

    def __post_init__(self) -> None:
        try:
            http_origin(self.url)
        except ValueError as exc:
            raise MalformedPlaceholder(f"url: {exc}") from exc
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 0:
            raise MalformedPlaceholder(f"size must be a non-negative integer: {self.size!r}")
        if not isinstance(self.sha256, str) or not _SHA256.fullmatch(self.sha256):
            raise MalformedPlaceholder("sha256 must be 64 lowercase hex characters")

    @property
    def origin(self) -> Origin:
        """Scheme, host and port of :attr:`url` (checked in `__post_init__`)."""
        return http_origin(self.url)

    @property
    def payload_url(self) -> str:
        """The gateway's raw-bytes URL for this object (no BSON to decode)."""
        return self.url.rstrip("/") + "/payload"

    def encode(
        self, properties: PublishProperties | None, *, protocol: int = 5
    ) -> tuple[bytes, PublishProperties | None]:
        """The placeholder's payload and properties.

        Args:
            properties: the original message's properties, kept on the placeholder.
            protocol: 5 for MQTT 5, 4 for MQTT 3.1.1 (tag carried in the payload).
        """
        doc: dict[str, Any] = {
            FORMAT_KEY: FORMAT_EXTERNAL,
            ID_KEY: str(self.message_id),
            "url": self.url,
            "size": self.size,
            "sha256": self.sha256,
            **self.encoding.members(),
        }
        if protocol != 5:
            return json.dumps(doc, separators=(",", ":")).encode(), None
        original = (properties or PublishProperties()).without_user_properties(FORMAT_KEY, ID_KEY)
        tags = ((FORMAT_KEY, FORMAT_EXTERNAL), (ID_KEY, str(self.message_id)))
        tagged = tags + original.user_properties
        return json.dumps(doc, separators=(",", ":")).encode(), replace(
            original, user_properties=tagged, topic_alias=None, subscription_identifiers=()
        )


def is_tagged(payload: bytes, properties: PublishProperties) -> bool:
    """Whether a received message claims to be a placeholder (see the module's rule)."""
    tag = properties.user_property(FORMAT_KEY)
    if tag is not None:
        return tag == FORMAT_EXTERNAL
    if len(payload) > MAX_PLACEHOLDER_BYTES or payload.lstrip()[:1] != b"{":
        return False
    if b'"' + FORMAT_KEY.encode() + b'"' not in payload:
        return False  # cheap: most JSON messages are not placeholders
    try:
        doc = loads_object(payload, max_bytes=MAX_PLACEHOLDER_BYTES)
    except ValueError:
        return False
    return doc.get(FORMAT_KEY) == FORMAT_EXTERNAL


def parse(payload: bytes, properties: PublishProperties) -> Placeholder:
    """Read a tagged message's reference.

    Args:
        payload: the placeholder's payload (JSON).
        properties: its properties; `_id` is taken from them, else from the JSON.

    Raises:
        MalformedPlaceholder: the reference cannot be read.
    """
    try:
        doc = loads_object(payload, max_bytes=MAX_PLACEHOLDER_BYTES)
    except ValueError as exc:
        raise MalformedPlaceholder(f"placeholder payload: {exc}") from exc
    prop_id, body_id = properties.user_property(ID_KEY), doc.get(ID_KEY)
    if prop_id is not None and body_id is not None and prop_id != body_id:
        raise MalformedPlaceholder("placeholder names two different ids")
    raw_id = prop_id if prop_id is not None else body_id
    url, size, sha = doc.get("url"), doc.get("size"), doc.get("sha256")
    if not isinstance(url, str):
        raise MalformedPlaceholder("placeholder has no url")
    try:
        http_origin(url)
    except ValueError as exc:
        raise MalformedPlaceholder(f"placeholder url: {exc}") from exc
    if not isinstance(raw_id, str):
        # hop-style references name the id only in the URL's last segment.
        raw_id = urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]
    try:
        message_id = MessageId.parse(raw_id)
    except ValueError as exc:
        raise MalformedPlaceholder(f"placeholder id: {exc}") from exc
    if not isinstance(size, int) or isinstance(size, bool) or not isinstance(sha, str):
        raise MalformedPlaceholder("placeholder needs integer size and string sha256")
    return Placeholder(url, size, sha, message_id, Encoding.from_members(doc))


def original_properties(properties: PublishProperties) -> PublishProperties:
    """The properties the producer set, without the placeholder's tags."""
    return properties.without_user_properties(FORMAT_KEY, ID_KEY)
