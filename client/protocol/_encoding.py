"""How a stored payload was encoded: the placeholder's `enc`, `kid` and `cmp` members. Pure.

    {"_format": "external", ..., "size": <stored bytes>, "sha256": "<of the stored bytes>",
     "cmp": "zstd", "enc": "age-v1", "kid": ["<16 hex>", ...]}

`size` and `sha256` always describe the STORED bytes, so the gateway, tus, direct transfers,
presigned links and resumed downloads work unchanged without keys, and no digest of the
plaintext is published. `cmp` is applied first, then `enc`. `kid` names the recipients'
short key ids (:func:`client.protocol._age_keys.key_id`) so that a reader without a
matching identity is told which keys it needed.

A reader older than these members ignores them and delivers the stored bytes (an age file,
or zstd frames). A reader that meets a value it does not know refuses the message
(:class:`MalformedPlaceholder`) rather than hand out bytes it cannot decode. Parsing is
bounded: at most :data:`MAX_KEY_IDS` ids of 16 hex characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ._errors import MalformedPlaceholder

ENC_AGE = "age-v1"
CMP_ZSTD = "zstd"
MAX_KEY_IDS = 64
_KEY_ID = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True, slots=True)
class Encoding:
    """What was done to a payload before it was stored.

    Attributes:
        compressed: zstd frames (:mod:`client.protocol._zstd`).
        encrypted: an age v1 file (:mod:`client.protocol._age`), after compression.
        key_ids: the recipients' key ids, when encrypted.
    """

    compressed: bool = False
    encrypted: bool = False
    key_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.key_ids) > MAX_KEY_IDS or not all(
            isinstance(k, str) and _KEY_ID.fullmatch(k) for k in self.key_ids
        ):
            raise MalformedPlaceholder(f"kid: at most {MAX_KEY_IDS} ids of 16 hex characters")
        if self.key_ids and not self.encrypted:
            raise MalformedPlaceholder("kid without enc")

    @property
    def plain(self) -> bool:
        return not (self.compressed or self.encrypted)

    def members(self) -> dict[str, Any]:
        """The placeholder's members for this encoding (none for a plain payload)."""
        doc: dict[str, Any] = {}
        if self.compressed:
            doc["cmp"] = CMP_ZSTD
        if self.encrypted:
            doc["enc"] = ENC_AGE
            if self.key_ids:
                doc["kid"] = list(self.key_ids)
        return doc

    @classmethod
    def from_members(cls, doc: dict[str, Any]) -> Encoding:
        """Read the members from a placeholder's JSON object.

        Raises:
            MalformedPlaceholder: an unknown encoding or a malformed member.
        """
        cmp, enc, kid = doc.get("cmp"), doc.get("enc"), doc.get("kid", [])
        if cmp not in (None, CMP_ZSTD):
            raise MalformedPlaceholder(f"unsupported compression {str(cmp)[:40]!r}")
        if enc not in (None, ENC_AGE):
            raise MalformedPlaceholder(f"unsupported encryption {str(enc)[:40]!r}")
        if not isinstance(kid, list):
            raise MalformedPlaceholder("kid must be a list")
        return cls(cmp is not None, enc is not None, tuple(kid))


PLAIN = Encoding()
