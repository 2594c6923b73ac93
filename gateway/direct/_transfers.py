"""Direct transfers: clients send and fetch payload bytes at the store, the gateway signs.

The pattern of Git LFS, container registries and AWS IoT's presigned URLs. With
`OFFLOAD_S3_PUBLIC_URL` set (the store's URL as clients reach it):

1. Grant. A producer allowed to write the topic states the payload's size, SHA-256, part
   size and each part's SHA-256; the gateway starts a multipart upload (or, for one part, a
   plain PUT) and answers one presigned PUT URL per part and a grant token.
2. Upload. The producer PUTs each part to the store, in parallel. Each URL carries its
   part's SHA-256 as the signed query parameter `x-amz-checksum-sha256`: the store refuses
   other bytes (400 BadDigest), so a leaked URL cannot place anything else.
3. Commit. The producer sends the token and the parts' ETags; the gateway completes the
   upload, checks the object's size against the grant and commits manifest and index with
   the same `build_manifest` / `commit_or_discard` as every other upload path. A refused
   commit (size, missing or altered part, expired grant) deletes what was uploaded.

What is verified and what is trusted: the store verifies every part's bytes against the
SHA-256 the producer stated at grant time, and the gateway verifies the total size. For a
single-part upload the part is the whole object, so its SHA-256 is store-verified end to end.
For a multipart object the whole-object SHA-256 (which the manifest and placeholder carry)
is the producer's own statement over the parts it hashed: SHA-256 does not compose, and
reading the object back through the gateway would put the bytes in its path again. That is
safe because the producer is authenticated and allowed to write the topic (through the proxy
it could send any bytes it liked), nobody else can place bytes (the URLs are content-bound),
and every consumer verifies the whole SHA-256 before it delivers a payload. Who wants the
gateway to check it anyway sets `OFFLOAD_DIRECT_VERIFY_SHA256`: the commit then reads the
object back on a transfer thread and refuses a mismatch.

The grant is stateless: an HMAC-sealed token (`gateway.http._signing`) naming the topic, object
key, upload id, size, hashes and expiry, valid on any replica with the same
`OFFLOAD_AUTH_SECRET`; presigned URLs expire with it.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import time
from dataclasses import dataclass
from typing import Any

from client.protocol import Manifest, MessageId, Topic

from ..core import BadRequest, Forbidden, NotFound, PayloadTooLarge
from ..ingest import is_inline, served_type, text_problem
from ..storage import DirectStore, ObjectStore, SupportsDirect

#: S3's multipart rules.
MIN_PART = 5 * 1024 * 1024
MAX_PART = 5 * 1024**3
MAX_PARTS = 10_000
#: Where the commits' claims on grants are kept (`Grant.claim_key`), until the grant expires.
GRANTS_PREFIX = "grants/"
#: Largest grant or commit request body read (10,000 hex hashes fit).
MAX_REQUEST_BYTES = 1024 * 1024
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ETAG = re.compile(r'"?[0-9A-Za-z-]{1,100}"?')


class DirectUnavailable(NotFound):
    """404: this gateway offers no direct transfers (clients use the proxied upload).

    Not 501: an off switch is no server failure, and the gateway answers no request with a
    5xx that a healthy gateway would not. An older gateway answers 404 too (no such route).
    """


class Direct:
    """This gateway's direct transfers: the store presigner, or why there is none.

    Args:
        store: the presigner; None when direct transfers are off.
        reason: why they are off (the 404's detail).
        redirect: `GET /msg/{id}/payload` answers 307 to the store.
        grant_ttl: seconds a grant and its URLs stay valid.
        redirect_ttl: seconds a redirect's URL stays valid.
    """

    def __init__(
        self,
        store: DirectStore | None,
        *,
        reason: str = "",
        redirect: bool = False,
        grant_ttl: int = 3600,
        redirect_ttl: int = 300,
    ) -> None:
        self._store = store
        self.reason = reason
        self.redirect = redirect and store is not None
        self.grant_ttl = grant_ttl
        self.redirect_ttl = redirect_ttl

    @classmethod
    def off(cls, reason: str) -> Direct:
        return cls(None, reason=reason)

    @classmethod
    def build(
        cls,
        store: ObjectStore,
        public_url: str | None,
        *,
        redirect: bool | None,
        grant_ttl: int,
        redirect_ttl: int,
    ) -> Direct:
        """From the settings: on when a public store URL is set and the store can sign."""
        if not public_url:
            return cls.off("direct transfers are off on this gateway (OFFLOAD_S3_PUBLIC_URL)")
        if not isinstance(store, SupportsDirect):
            return cls.off("direct transfers need an S3 store")
        return cls(
            store.direct(public_url),
            redirect=True if redirect is None else redirect,
            grant_ttl=grant_ttl,
            redirect_ttl=redirect_ttl,
        )

    @property
    def store(self) -> DirectStore | None:
        """The presigner (multipart calls too); None when direct transfers are off."""
        return self._store

    @property
    def public_url(self) -> str | None:
        """The store origin advertised to clients; None when off."""
        return self._store.public_url if self._store is not None else None

    def require(self) -> DirectStore:
        if self._store is None:
            raise DirectUnavailable(self.reason)
        return self._store

    def redirect_url(self, manifest: Manifest, *, delete_after_fetch: bool) -> str | None:
        """A short-lived presigned store URL for the payload; None: serve it through here.

        Served through the gateway when redirects are off, and with delete-after-fetch
        (only the gateway can tell that a payload was sent whole). The store answers Range
        itself; the gateway keeps HEAD and If-None-Match (answered before this is asked).
        The store's answer gets the gateway's content type and disposition (`response-*`
        overrides): a payload is never shown inline unless its type is safe to show.
        """
        if not self.redirect or delete_after_fetch or self._store is None:
            return None
        seconds = self.redirect_ttl
        if manifest.expires is not None:  # never outlive the message
            seconds = min(seconds, max(1, manifest.expires // 1000 - int(time.time())))
        media_type = served_type(manifest.content_type)
        inline = is_inline(media_type) and not manifest.filename
        return self._store.presign_get(
            manifest.data_key,
            seconds=seconds,
            response_headers={
                "response-content-type": media_type,
                "response-content-disposition": "inline" if inline else "attachment",
                "response-cache-control": "private, max-age=0, must-revalidate",
            },
        )


@dataclass(frozen=True, slots=True)
class GrantRequest:
    """A producer's request for an upload grant, parsed and checked."""

    size: int
    sha256: str
    part_size: int
    parts: tuple[str, ...]  # hex SHA-256 of each part, in order
    message_id: MessageId | None
    ttl: int | None
    content_type: str | None

    @property
    def single(self) -> bool:
        return len(self.parts) == 1


def _int(doc: dict[str, Any], name: str, *, low: int, high: int) -> int:
    value = doc.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"`{name}` must be an integer")
    if not low <= value <= high:
        raise BadRequest(f"`{name}` must be between {low} and {high}")
    return value


def parse_grant_request(doc: object, *, max_size: int) -> GrantRequest:
    """Check a grant request's JSON against S3's part rules and the gateway's size limit.

    Raises:
        BadRequest: a missing, malformed or inconsistent field (the reason names it).
        PayloadTooLarge: the size is over the gateway's maximum.
    """
    if not isinstance(doc, dict):
        raise BadRequest("the request body must be a JSON object")
    size = _int(doc, "size", low=0, high=2**63)
    if size > max_size:
        raise PayloadTooLarge(f"size {size} exceeds the limit of {max_size} bytes")
    sha256 = doc.get("sha256")
    if not isinstance(sha256, str) or _HEX64.fullmatch(sha256) is None:
        raise BadRequest("`sha256` must be 64 lowercase hex digits")
    part_size = _int(doc, "part_size", low=1, high=MAX_PART)
    count = max(1, math.ceil(size / part_size))
    if count > 1 and part_size < MIN_PART:
        raise BadRequest(f"`part_size` must be at least {MIN_PART} bytes (S3's minimum)")
    if count > MAX_PARTS:
        raise BadRequest(f"{count} parts: at most {MAX_PARTS}; choose a larger `part_size`")
    parts = doc.get("parts")
    if not isinstance(parts, list) or len(parts) != count:
        raise BadRequest(f"`parts` must list the SHA-256 of each of the {count} parts")
    if not all(isinstance(p, str) and _HEX64.fullmatch(p) for p in parts):
        raise BadRequest("each of `parts` must be 64 lowercase hex digits")
    if count == 1 and parts[0] != sha256:
        raise BadRequest("one part: its SHA-256 must be the payload's")
    raw_id = doc.get("id")
    if raw_id is not None and not isinstance(raw_id, str):
        raise BadRequest("`id` must be a UUID string")
    ttl = None if doc.get("ttl") is None else _int(doc, "ttl", low=1, high=2**32 - 1)
    content_type = doc.get("content_type")
    if content_type is not None and not isinstance(content_type, str):
        raise BadRequest("`content_type` must be a string")
    problem = None if content_type is None else text_problem(content_type, "`content_type`")
    if problem is not None:
        raise BadRequest(problem)
    return GrantRequest(
        size,
        sha256,
        part_size,
        tuple(parts),
        MessageId.parse(raw_id) if raw_id is not None else None,
        ttl,
        content_type,
    )


def b64_of_hex(digest: str) -> str:
    """The base64 form S3's `x-amz-checksum-sha256` takes."""
    return base64.b64encode(bytes.fromhex(digest)).decode("ascii")


@dataclass(frozen=True, slots=True)
class Grant:
    """What a sealed grant token states; built at grant time, read back at commit."""

    topic: Topic
    key: str
    upload_id: str  # "" for a single PUT
    size: int
    sha256: str
    parts: int
    message_id: MessageId | None
    ttl: int | None
    content_type: str | None
    timestamp: int  # ms, when the grant was made (the message's time)
    expires: int  # Unix seconds
    owner: str | None = None  # who asked for it (its open-upload record is theirs)

    def claims(self) -> dict[str, Any]:
        return {
            "v": 1,
            "t": self.topic.value,
            "k": self.key,
            "u": self.upload_id,
            "s": self.size,
            "h": self.sha256,
            "n": self.parts,
            "i": None if self.message_id is None else str(self.message_id),
            "l": self.ttl,
            "c": self.content_type,
            "ts": self.timestamp,
            "e": self.expires,
            "o": self.owner,
        }

    @classmethod
    def from_claims(cls, claims: dict[str, Any]) -> Grant:
        """Claims this gateway (or a replica with its secret) sealed: trusted, not foreign."""
        if claims.get("v") != 1:
            raise Forbidden("upload grant of an unknown version")
        raw_id = claims["i"]
        return cls(
            Topic(claims["t"]),
            claims["k"],
            claims["u"],
            claims["s"],
            claims["h"],
            claims["n"],
            None if raw_id is None else MessageId.parse(raw_id),
            claims["l"],
            claims["c"],
            claims["ts"],
            claims["e"],
            claims.get("o"),  # absent from grants sealed before it existed
        )

    def expired(self, now: float | None = None) -> bool:
        return self.expires <= (time.time() if now is None else now)

    @property
    def claim_key(self) -> str:
        """The store key whose conditional create makes one commit (or abandon) the grant's.

        The expiry leads the key, so the sweeper drops expired claims without reading them.
        """
        return f"{GRANTS_PREFIX}{self.expires}/{self.digest}"

    @property
    def digest(self) -> str:
        """32 hex digits naming the grant's object key (its claim and quota record)."""
        return hashlib.sha256(self.key.encode("utf-8")).hexdigest()[:32]

    @property
    def quota_ident(self) -> str:
        return f"g-{self.digest}"


def claim_expiry(key: str) -> int | None:
    """The grant expiry (Unix seconds) a claim key names; None for any other key."""
    rest = key.removeprefix(GRANTS_PREFIX)
    stamp, _, digest = rest.partition("/")
    if rest == key or not stamp.isascii() or not stamp.isdigit() or len(digest) != 32:
        return None
    return int(stamp)


@dataclass(frozen=True, slots=True)
class CommitRequest:
    """A producer's commit: the grant token, the parts' ETags and the message headers.

    `abandon`: the producer gives the upload up (a part failed); the gateway removes what
    was uploaded. Older clients abandon with `{"etags": []}`, refused and removed the same
    way for a multipart grant; for a single PUT it would commit the object.
    """

    token: str
    etags: tuple[str, ...]
    headers: tuple[tuple[str, bytes], ...]
    abandon: bool = False


def parse_commit_request(doc: object, *, max_header_bytes: int) -> CommitRequest:
    """Check a commit request's JSON; bounded before anything is kept.

    Raises:
        BadRequest: a missing or malformed field.
    """
    if not isinstance(doc, dict):
        raise BadRequest("the request body must be a JSON object")
    token = doc.get("grant")
    if not isinstance(token, str):
        raise BadRequest("`grant` must be the token the grant answered")
    etags = doc.get("etags", [])
    if not isinstance(etags, list) or len(etags) > MAX_PARTS:
        raise BadRequest(f"`etags` must be a list of at most {MAX_PARTS} strings")
    if not all(isinstance(e, str) and _ETAG.fullmatch(e) for e in etags):
        raise BadRequest("each of `etags` must be the ETag the store answered for its part")
    abandon = doc.get("abandon", False)
    if not isinstance(abandon, bool):
        raise BadRequest("`abandon` must be true or false")
    raw_headers = doc.get("headers", [])
    if not isinstance(raw_headers, list):
        raise BadRequest("`headers` must be a list of [name, value] pairs")
    headers: list[tuple[str, bytes]] = []
    total = 0
    for pair in raw_headers:
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(item, str) for item in pair)
        ):
            raise BadRequest("`headers` must be a list of [name, value] string pairs")
        name, value = pair
        total += len(name) + len(value)
        if total > max_header_bytes:
            raise BadRequest(f"headers exceed {max_header_bytes} bytes")
        problem = text_problem(name, "header name") or text_problem(value, "header value")
        if problem is not None:
            raise BadRequest(problem)
        if name == "_id":  # the id is the grant's; the manifest adds its own `_id`
            continue
        headers.append((name, value.encode("utf-8")))
    return CommitRequest(token, tuple(etags), tuple(headers), abandon)
