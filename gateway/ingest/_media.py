"""Content types in and out: strict at upload, inert at download.

An uploader names the message's content type (`Content-Type` on `POST /publish`, the
`content_type` tus metadata). It travels in two places that trust it: the placeholder's MQTT
Content Type property (mosquitto disconnects a client whose PUBLISH carries a control
character in it) and the `Content-Type` the gateway serves the payload with (a browser runs
a `text/html` payload as a page of the gateway's origin). So:

* at upload, a content type must be an RFC 9110 media type (`type/subtype *(; name=value)`),
  printable ASCII only, at most 255 bytes, else 400 before anything is stored;
* at download, every payload answer says `X-Content-Type-Options: nosniff` and
  `Content-Security-Policy: sandbox; default-src 'none'` (no script, no subresources, an
  opaque origin even if a browser renders it), and types a browser would render as a
  document (anything not on the short inline list below) are sent as
  `Content-Disposition: attachment`.
"""

from __future__ import annotations

import re

from ..core import BadRequest

MAX_CONTENT_TYPE_BYTES = 255

# RFC 9110 §5.6.2 token, §5.6.4 quoted-string (printable ASCII only: HTAB and obs-text are
# legal in HTTP but not in an MQTT string mosquitto accepts), §8.3.1 media-type.
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\[\x20-\x7e])*"'
_MEDIA_TYPE = re.compile(rf"({_TOKEN})/({_TOKEN})(?: *; *{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))*")

PAYLOAD_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "sandbox; default-src 'none'",
}

# Types a browser shows without running anything: served inline. Everything else (html,
# svg, xml, javascript, pdf, unknown types...) is an attachment.
_INLINE = frozenset(
    {
        "application/octet-stream",
        "application/json",
        "application/bson",
        "text/plain",
        "text/csv",
        "image/png",
        "image/jpeg",
        "image/gif",
        "image/webp",
        "image/avif",
    }
)
_INLINE_MAJOR = frozenset({"audio", "video"})


def parse_content_type(raw: str | None, *, source: str) -> str | None:
    """A validated media type (surrounding spaces removed), None when absent or blank.

    Args:
        raw: the uploader's value.
        source: where it came from, for the error message (`Content-Type`, ...).

    Raises:
        BadRequest: not a media type, too long, or holding control or non-ASCII characters.
    """
    if raw is None:
        return None
    value = raw.strip(" ")
    if not value:
        return None
    if len(value.encode("utf-8")) > MAX_CONTENT_TYPE_BYTES:
        raise BadRequest(f"{source} longer than {MAX_CONTENT_TYPE_BYTES} bytes")
    if any(not 0x20 <= ord(c) <= 0x7E for c in value):
        raise BadRequest(f"{source} must be printable ASCII (no control characters)")
    if _MEDIA_TYPE.fullmatch(value) is None:
        raise BadRequest(f"{source} {value!r} is not a media type (type/subtype; name=value)")
    return value


def essence(content_type: str) -> str:
    """`type/subtype` in lowercase, parameters dropped."""
    return content_type.split(";", 1)[0].strip().lower()


def served_type(stored: str | None) -> str:
    """The Content-Type to serve a payload with; octet-stream when none or not valid.

    Manifests written before upload validation existed may hold anything.
    """
    if stored is None:
        return "application/octet-stream"
    try:
        return parse_content_type(stored, source="stored content type") or (
            "application/octet-stream"
        )
    except BadRequest:
        return "application/octet-stream"


def is_inline(content_type: str) -> bool:
    """True when a browser shows this type without interpreting it as a document."""
    kind = essence(content_type)
    return kind in _INLINE or kind.split("/", 1)[0] in _INLINE_MAJOR
