"""A stored payload's record, as a value: which object holds an account's copy of one
content, and which messages refer to it. Pure (`_blobs` reads and writes them).

    blobs/<account>/<sha256>-<size>[.<n>].json
        {"v": 1, "key": OBJECT, "size": N, "sha256": HEX, "crc32c": HEX | null,
         "state": "live" | "dying", "charge": HOLD | null, "event": EVENT | null,
         "refs": {"<id>.<token>": AT_MS}, "at": MS, "n": NONCE}

* One record per content per account: a message whose payload the account already stores
  is linked (`with_ref`) instead of stored again. A record holds at most MAX_REFS messages;
  the next copy of that content gets the next record (`.1`, `.2`, ...), so no record grows
  without bound.
* `charge` is the hold (`_ledger`) whose bytes the object was counted under, until the
  ledger has counted them; `settled` clears it. A record found with one long after its
  commit is finished by the sweeper: the ledger still holding the hold means the bytes were
  never counted.
* `dying`: the last message went (`without_ref` leaves no refs). Nothing links to a dying
  record; its object is deleted, its bytes given back under `event`, then the record goes.
* `n` changes with every write (see `_ledger`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from client.protocol import Manifest

BLOBS_PREFIX = "blobs/"
#: Messages one record counts: its document (about 60 bytes a message) is read and written
#: whole at every link, so a popular payload gets a fresh record (and object) every MAX_REFS:
#: a link costs at most ~12 KB of JSON each way, the bucket one copy per 200 messages.
MAX_REFS = 200
_NAME = re.compile(r"([0-9a-f]{64})-([0-9]{1,20})(?:\.([0-9]{1,6}))?\.json")

State = Literal["live", "dying"]


def record_key(account: str, sha256: str, size: int, generation: int = 0) -> str:
    """Where the record of `account`'s copy of this content lives (`account`: its digest)."""
    tail = "" if generation == 0 else f".{generation}"
    return f"{BLOBS_PREFIX}{account}/{sha256}-{size}{tail}.json"


def record_account(key: str) -> str | None:
    """The account digest a record key names; None for any other key."""
    if not key.startswith(BLOBS_PREFIX):
        return None
    account, _, name = key[len(BLOBS_PREFIX) :].partition("/")
    return account if account and _NAME.fullmatch(name) else None


def ref_of(manifest: Manifest) -> str:
    """How a record names a message: its id and its own token (ids can be reused)."""
    return f"{manifest.id}.{manifest.token}"


@dataclass(frozen=True, slots=True)
class Record:
    """One stored payload of an account (see the module docstring)."""

    key: str
    size: int
    sha256: str
    refs: dict[str, int] = field(default_factory=dict)
    state: State = "live"
    charge: str | None = None
    event: str | None = None
    at: int = 0  # when it was made, or became dying (ms)
    crc32c: str | None = None  # the object's, as its first manifest states it
    #: The SHA-256 is the gateway's or the store's, not only the uploader's word (a
    #: multipart direct upload's whole hash is, unless OFFLOAD_DIRECT_VERIFY_SHA256): only
    #: such a record takes other messages, so a false claim costs only its own message.
    verified: bool = True

    @property
    def full(self) -> bool:
        return len(self.refs) >= MAX_REFS

    @property
    def linkable(self) -> bool:
        return self.state == "live" and self.verified and not self.full

    def with_ref(self, ref: str, at: int) -> Record:
        return replace(self, refs={**self.refs, ref: at})

    def without_ref(self, ref: str, at: int) -> Record:
        """Without `ref`; dying since `at` (with a fresh event) when it was the last."""
        refs = {k: v for k, v in self.refs.items() if k != ref}
        if refs or self.state == "dying":
            return replace(self, refs=refs)
        return replace(self, refs=refs, state="dying", event=uuid.uuid4().hex, at=at)

    def settled(self) -> Record:
        return replace(self, charge=None)

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "v": 1,
            "key": self.key,
            "size": self.size,
            "sha256": self.sha256,
            "state": self.state,
            "charge": self.charge,
            "event": self.event,
            "refs": self.refs,
            "at": self.at,
            "crc32c": self.crc32c,
            "verified": self.verified,
            "n": uuid.uuid4().hex,
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")

    @classmethod
    def from_json(cls, raw: bytes) -> Record:
        """Raises ValueError when `raw` is not a record."""
        try:
            doc = json.loads(raw)
            refs = {str(k): int(v) for k, v in doc["refs"].items()}
            state = doc["state"]
            record = cls(
                str(doc["key"]),
                int(doc["size"]),
                str(doc["sha256"]),
                refs,
                state,
                _text(doc.get("charge")),
                _text(doc.get("event")),
                int(doc.get("at", 0)),
                _text(doc.get("crc32c")),
                doc.get("verified", True) is True,
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"not a payload record: {exc}") from exc
        if state not in ("live", "dying"):
            raise ValueError(f"not a payload record: state {state!r}")
        return record


def _text(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ValueError("a text field is not text")
