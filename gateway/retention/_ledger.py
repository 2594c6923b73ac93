"""An account's ledger, as a value: bytes stored, holds of uploads in flight, deletions under
way. Pure: every change is a function from one ledger to the next (`_accounts` writes them
with a conditional write, so replicas never lose each other's changes).

    accounts/<account>.json  {"v": 1, "user": NAME, "stored": BYTES,
                              "holds": {HOLD: [BYTES, UNTIL_MS]},
                              "journal": {EVENT: [DELTA, RECORD_KEY, AT_MS]}, "n": NONCE}

* `stored` is the size of every payload object of the account's records (`_records`), each
  counted once however many messages share it.
* A hold reserves bytes for an upload before they are written (`reserve`): refused when
  stored plus every hold plus the new bytes would pass the cap. A commit turns the hold into
  stored bytes (`charge`), keyed by the hold, so a commit repeated after a crash never
  counts twice; an upload that ends otherwise drops it (`release`); a hold nobody ended
  lapses after its `until` (`lapse`, the sweeper).
* A deletion takes its bytes back under an event id kept in `journal` until the record is
  gone (`uncharge`, then `settle`): a deletion a crash interrupted is finished by whoever
  finds its record, and never takes the bytes back twice.
* `n` changes with every write, so two writes of otherwise equal ledgers are told apart by
  the store's version (an ETag names the content).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class Refused:
    """A hold that would take the account past its cap."""

    user: str | None
    used: int  # stored + held before this hold
    asked: int
    cap: int

    def reason(self) -> str:
        who = "anonymous callers" if self.user is None else f"account {self.user!r}"
        return (
            f"{who} stores {self.used} bytes; {self.asked} more would pass "
            f"OFFLOAD_MAX_STORED_BYTES_PER_USER={self.cap}: nothing was kept"
        )


@dataclass(frozen=True, slots=True)
class LedgerDoc:
    """One account's ledger (see the module docstring)."""

    user: str | None = None
    stored: int = 0
    holds: dict[str, tuple[int, int]] = field(default_factory=dict)
    journal: dict[str, tuple[int, str, int]] = field(default_factory=dict)

    @property
    def held(self) -> int:
        return sum(size for size, _ in self.holds.values())

    @property
    def used(self) -> int:
        """What counts against the cap: stored bytes and every hold."""
        return self.stored + self.held

    # -- changes ----------------------------------------------------------------------------

    def reserve(
        self, hold: str, size: int, until: int, cap: int, slack: int = 0
    ) -> LedgerDoc | Refused:
        """`size` more bytes for `hold` (made, or grown), kept until `until` (ms).

        Refused when they would take the account past `cap` (0: no cap) by more than
        `slack`: an upload of unknown length reserves a part at a time with one part of
        slack, so the account passes its cap by less than a part, never more, however
        many such uploads run at once.
        """
        if cap and self.used + size > cap + slack:
            return Refused(self.user, self.used, size, cap)
        before = self.holds.get(hold, (0, until))[0]
        return replace(self, holds={**self.holds, hold: (before + size, until)})

    def refresh(self, hold: str, until: int) -> LedgerDoc:
        """Keep `hold` until `until` (no change when it is gone)."""
        if hold not in self.holds:
            return self
        return replace(self, holds={**self.holds, hold: (self.holds[hold][0], until)})

    def release(self, hold: str) -> LedgerDoc:
        return replace(self, holds={k: v for k, v in self.holds.items() if k != hold})

    def charge(self, hold: str, size: int) -> LedgerDoc:
        """The upload `hold` stored `size` bytes: the hold becomes stored bytes, once.

        Without the hold (a commit repeated, or one that outlived its hold) nothing changes:
        the hold's presence is what says the bytes are not counted yet.
        """
        if hold not in self.holds:
            return self
        return replace(self.release(hold), stored=self.stored + size)

    def uncharge(self, event: str, size: int, record: str, at: int) -> LedgerDoc:
        """A deletion gives `size` bytes back, once per `event` (kept until `settle`)."""
        if event in self.journal:
            return self
        journal = {**self.journal, event: (-size, record, at)}
        return replace(self, stored=max(0, self.stored - size), journal=journal)

    def settle(self, event: str) -> LedgerDoc:
        return replace(self, journal={k: v for k, v in self.journal.items() if k != event})

    def lapse(self, before: int) -> LedgerDoc:
        """Without the holds whose `until` is before `before` (ms)."""
        return replace(self, holds={k: v for k, v in self.holds.items() if v[1] >= before})

    def named(self, user: str | None) -> LedgerDoc:
        """With the account's name, for the operator reading the bucket (`user`)."""
        return self if user is None or self.user == user else replace(self, user=user)

    # -- the document -----------------------------------------------------------------------

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "v": 1,
            "user": self.user,
            "stored": self.stored,
            "holds": {k: list(v) for k, v in self.holds.items()},
            "journal": {k: list(v) for k, v in self.journal.items()},
            "n": uuid.uuid4().hex,
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")

    @classmethod
    def from_json(cls, raw: bytes) -> LedgerDoc:
        """Raises ValueError when `raw` is not a ledger."""
        try:
            doc = json.loads(raw)
            user = doc.get("user")
            holds = {str(k): (int(v[0]), int(v[1])) for k, v in doc.get("holds", {}).items()}
            journal = {
                str(k): (int(v[0]), str(v[1]), int(v[2])) for k, v in doc.get("journal", {}).items()
            }
            stored = int(doc["stored"])
        except (KeyError, TypeError, IndexError, AttributeError, ValueError) as exc:
            raise ValueError(f"not an account ledger: {exc}") from exc
        if user is not None and not isinstance(user, str):
            raise ValueError("not an account ledger: user must be text")
        return cls(user, stored, holds, journal)
