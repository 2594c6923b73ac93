"""Publish options: one value type, parsed here from every place a client can give them.

`POST|PUT /publish` takes them as query parameters or `X-Offload-*` headers, a tus upload as
`Upload-Metadata` keys; a resumable upload keeps them in its stored state (`to_json`) until
its last byte arrives. Each path parses into the same frozen `PublishOptions`, which checks
itself, so a placeholder the broker would refuse is refused before any byte is stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from starlette.requests import Request

from client.protocol import (
    FORMAT_KEY,
    ID_KEY,
    PLAIN_ENCODING,
    Encoding,
    MalformedPlaceholder,
    PublishProperties,
    mqtt_text_problem,
    publish_properties_problem,
)

from ..core import BadRequest
from ._text import text_problem

MAX_EXPIRY = 2**32 - 1  # MQTT's Message Expiry Interval is a four-byte integer
MAX_FILENAME_BYTES = 255
RESERVED = (FORMAT_KEY, ID_KEY)
#: The placeholder's encoding members a tus upload names in `Upload-Metadata` (its bytes
#: were compressed and/or encrypted by the uploader; :mod:`client.protocol._encoding`).
ENCODING_KEYS = ("cmp", "enc", "kid")
#: `kid` in metadata: comma-separated key ids, at most 64 of 16 hex characters.
MAX_KID_CHARS = 64 * 17


@dataclass(frozen=True, slots=True)
class PublishOptions:
    """How the gateway publishes a placeholder: QoS, retain, expiry, user properties."""

    qos: int = 1
    retain: bool = False
    expiry: int | None = None  # seconds (Message Expiry Interval); None: never expires
    user_properties: tuple[tuple[str, str], ...] = ()
    encoding: Encoding = PLAIN_ENCODING  # the stored bytes' (tus `cmp`, `enc`, `kid`)

    def __post_init__(self) -> None:
        if self.qos not in (0, 1, 2):
            raise BadRequest(f"qos must be 0, 1 or 2, not {self.qos!r}")
        if self.expiry is not None and not 0 <= self.expiry <= MAX_EXPIRY:
            raise BadRequest(f"expiry must be between 0 and {MAX_EXPIRY} seconds")
        for name, _value in self.user_properties:
            if not name:
                raise BadRequest("user property names must not be empty")
            if name in RESERVED:
                raise BadRequest(f"user property {name!r} is reserved for the placeholder")
        # The broker drops the connection of a client whose PUBLISH breaks the MQTT string
        # rules: refuse here, before the payload is read or stored.
        problem = publish_properties_problem(self.properties(None))
        if problem is not None:
            raise BadRequest(problem)

    def properties(self, content_type: str | None) -> PublishProperties:
        """The original message's properties (the placeholder keeps them)."""
        return PublishProperties(
            message_expiry_interval=self.expiry,
            content_type=content_type,
            user_properties=self.user_properties,
        )

    def headers(self) -> tuple[tuple[str, bytes], ...]:
        """User properties as stored headers, the way the client library stores them."""
        return tuple((name, value.encode("utf-8")) for name, value in self.user_properties)

    def with_leading(self, properties: tuple[tuple[str, str], ...]) -> PublishOptions:
        """These options with `properties` placed before the user properties (re-checked)."""
        return PublishOptions(
            qos=self.qos,
            retain=self.retain,
            expiry=self.expiry,
            user_properties=properties + self.user_properties,
            encoding=self.encoding,
        )

    def to_json(self) -> dict[str, Any]:
        """The stored form (a resumable upload's state keeps its options until the end)."""
        return {
            "qos": self.qos,
            "retain": self.retain,
            "expiry": self.expiry,
            "user_properties": [list(p) for p in self.user_properties],
            "encoding": self.encoding.members(),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PublishOptions:
        """Read the stored form back; checked again, as on arrival."""
        return cls(
            qos=int(doc.get("qos", 1)),
            retain=bool(doc.get("retain", False)),
            expiry=doc.get("expiry"),
            user_properties=tuple((str(k), str(v)) for k, v in doc.get("user_properties", [])),
            encoding=_encoding(doc.get("encoding") or {}),
        )

    @classmethod
    def from_request(cls, request: Request) -> PublishOptions:
        """The options of `/publish`: query parameters, else `X-Offload-*` headers.

        Raises:
            BadRequest: an option is malformed.
        """
        qos = _one(request, "qos", "x-offload-qos")
        retain = _one(request, "retain", "x-offload-retain")
        expiry = _one(request, "expiry", "x-offload-expiry")
        props = request.query_params.getlist("prop") or request.headers.getlist(
            "x-offload-property"
        )
        return cls(
            qos=1 if qos is None else parse_ascii_int(qos, "qos"),
            retain=False if retain is None else parse_bool(retain, "retain"),
            expiry=None if expiry is None else parse_ascii_int(expiry, "expiry"),
            user_properties=tuple(_parse_property(p) for p in props),
        )

    @classmethod
    def from_metadata(cls, meta: Mapping[str, str]) -> PublishOptions:
        """The options of a tus upload: `qos`, `retain`, `expiry`, `prop.<name>` metadata,
        and the stored bytes' encoding (`cmp`, `enc`, `kid`: :func:`encoding_from_metadata`).

        Raises:
            BadRequest: an option is malformed.
        """
        props = tuple((k[len("prop.") :], v) for k, v in meta.items() if k.startswith("prop."))
        return cls(
            qos=parse_ascii_int(meta["qos"], "qos") if "qos" in meta else 1,
            retain=parse_bool(meta["retain"], "retain") if "retain" in meta else False,
            expiry=parse_ascii_int(meta["expiry"], "expiry") if "expiry" in meta else None,
            user_properties=props,
            encoding=encoding_from_metadata(meta),
        )


def encoding_from_metadata(meta: Mapping[str, str]) -> Encoding:
    """The placeholder's `cmp`, `enc` and `kid` as a tus upload names them (hostile input).

    `cmp` and `enc` are the placeholder's values (`zstd`, `age-v1`), `kid` the key ids
    joined by commas. The same checks as a consumer's placeholder parser
    (`Encoding.from_members`): known values only, at most 64 ids of 16 hex characters,
    no `kid` without `enc`.

    Raises:
        BadRequest: anything else, before any byte is stored.
    """
    kid = meta.get("kid")
    if kid is not None and len(kid) > MAX_KID_CHARS:
        raise BadRequest(f"Upload-Metadata kid: at most 64 key ids ({MAX_KID_CHARS} characters)")
    doc: dict[str, Any] = {k: meta[k] for k in ("cmp", "enc") if k in meta}
    if kid is not None:
        doc["kid"] = kid.split(",")
    try:
        return Encoding.from_members(doc)
    except MalformedPlaceholder as exc:
        raise BadRequest(f"Upload-Metadata: {exc}") from exc


def _encoding(doc: Any) -> Encoding:
    """A stored state's encoding (written by `to_json`, checked again)."""
    if not isinstance(doc, dict):
        raise BadRequest("stored encoding is not an object")
    try:
        return Encoding.from_members(doc)
    except MalformedPlaceholder as exc:
        raise BadRequest(f"stored encoding: {exc}") from exc


def parse_ascii_int(raw: str, name: str, *, max_digits: int = 20) -> int:
    """A non-negative decimal integer of ASCII digits only; 400 with a reason otherwise.

    `int()` and `str.isdigit()` accept far more: `int("١٢")` is 12, `"²".isdigit()` is
    True and `int("²")` raises; `int(" 1_0 ")` is 10. A header is not a Python literal.
    """
    value = raw.strip(" \t")
    if not value or len(value) > max_digits or not (value.isascii() and value.isdigit()):
        raise BadRequest(f"{name} must be a non-negative integer of ASCII digits, not {raw!r:.40}")
    return int(value)


def parse_bool(raw: str, name: str) -> bool:
    """`true|false` (also `1|0`, `yes|no`, `on|off`); 400 with a reason otherwise."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise BadRequest(f"{name} must be true or false, not {raw!r}")


def _parse_property(raw: str) -> tuple[str, str]:
    name, colon, value = raw.partition(":")
    if not colon:
        raise BadRequest(f"user property must be NAME:VALUE, not {raw!r:.80}")
    # Checked again, with everything else that reaches the PUBLISH, by PublishOptions.
    for part, what in ((name, "name"), (value, "value")):
        problem = mqtt_text_problem(part, f"user property {what}")
        if problem is not None:  # the broker would drop our connection for it
            raise BadRequest(problem)
    return name.strip(), value


def _one(request: Request, query: str, header: str) -> str | None:
    value = request.query_params.get(query)
    return value if value is not None else request.headers.get(header)


def filename_from_disposition(header: str | None) -> str | None:
    """The file name of a Content-Disposition header (RFC 6266: `filename*` wins)."""
    if not header:
        return None
    plain: str | None = None
    for part in header.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        key = key.strip().lower()
        value = value.strip()
        if key == "filename*":
            charset, _, rest = value.partition("'")
            _lang, _, encoded = rest.partition("'")
            try:
                return unquote(encoded, encoding=charset or "utf-8", errors="strict")
            except (LookupError, UnicodeDecodeError) as exc:
                raise BadRequest(f"undecodable Content-Disposition filename*: {exc}") from exc
        if key == "filename":
            plain = value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value
    return plain


def check_filename(name: str | None) -> str | None:
    """A file name safe to store and send back in a header; None when absent."""
    if name is None:
        return None
    # Only the last path component: a name is a label for the download, never a path.
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    if not name or name in (".", ".."):
        return None
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise BadRequest("filename must not contain control characters")
    problem = text_problem(name, "filename")  # `filename*=utf-7''...` can decode to one
    if problem is not None:
        raise BadRequest(problem)
    if len(name.encode("utf-8")) > MAX_FILENAME_BYTES:
        raise BadRequest(f"filename longer than {MAX_FILENAME_BYTES} bytes")
    return name
