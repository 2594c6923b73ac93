"""Offsets of the `offload` streaming source: which committed messages a micro-batch takes. Pure.

Messages have no global sequence number: a payload key carries only its topic, UTC hour and
a random token, and a message becomes visible (its sidecar appears) when its upload ends,
which may be long after the timestamp the gateway stamped when the upload began. So an
offset is a position in time plus the tokens already delivered near it:

* `floor`: every message stamped before it has been delivered, or is given up on;
* `seen`: token -> stamp of delivered messages stamped at or after `floor` (never twice);
* `max`: the latest timestamp delivered so far;
* `batch`: the payload keys this micro-batch delivers (so a batch replayed after a crash
  reads exactly the same keys: the offset alone decides, nothing else);
* `bad`: those of `batch` the driver found undeliverable (an undecodable sidecar or index
  entry), key -> (kind, reason): the batch reports them instead of reading them;
* `skipped`: token -> hour (ms) of every such message reported while its key can still be
  listed, so each is reported once; they have no trustworthy stamp and do not move `floor`.

`floor` trails `max` by `lateness` ms (an upload taking longer than that from its stamp to
its commit is missed), and never passes a message still waiting for a later batch.
`seen` therefore holds the tokens of about `lateness` ms of traffic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core._exceptions import ConfigError

OFFSET_VERSION = 1
_HOUR_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class Candidate:
    """A committed message not yet delivered: its payload key, token and stamp.

    `problem` (kind, reason) marks a message the driver could not decode: `timestamp` is then
    its key's hour, it goes into the next batch whatever `floor` is, and that batch reports
    it instead of reading it.
    """

    key: str
    token: str
    timestamp: int
    problem: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class StreamOffset:
    """One position of the stream (see the module docstring)."""

    floor: int
    max: int
    seen: Mapping[str, int]
    batch: tuple[str, ...] = ()
    bad: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    skipped: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The offset as Spark stores it in the checkpoint (primitive types only)."""
        doc: dict[str, Any] = {
            "v": OFFSET_VERSION,
            "floor": self.floor,
            "max": self.max,
            "seen": dict(sorted(self.seen.items())),
            "batch": list(self.batch),
        }
        if self.bad or self.skipped:  # absent otherwise: offsets read as before
            doc["bad"] = {k: list(v) for k, v in sorted(self.bad.items())}
            doc["skipped"] = dict(sorted(self.skipped.items()))
        return doc

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StreamOffset:
        """Parse an offset read back from a checkpoint; a foreign one is a ConfigError."""
        try:
            if data.get("v") != OFFSET_VERSION:
                raise ValueError(f"version {data.get('v')!r}")
            floor, top = int(data["floor"]), int(data["max"])
            seen = {str(t): int(ms) for t, ms in dict(data["seen"]).items()}
            batch = tuple(str(k) for k in data["batch"])
            bad = {str(k): (str(v[0]), str(v[1])) for k, v in dict(data.get("bad", {})).items()}
            skipped = {str(t): int(ms) for t, ms in dict(data.get("skipped", {})).items()}
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ConfigError(f"not an offload stream offset: {exc}") from exc
        return cls(floor, top, seen, batch, bad, skipped)


def initial_offset(since: int | None) -> StreamOffset:
    """Where a new query starts: at `since` (ms), or at the oldest message."""
    start = since if since is not None else 0
    return StreamOffset(start, start, {})


def pending(offset: StreamOffset, candidates: Sequence[Candidate]) -> list[Candidate]:
    """Candidates not yet delivered by `offset`: undecodable ones, then oldest first."""
    bad = [c for c in candidates if c.problem is not None and c.token not in offset.skipped]
    fresh = [
        c
        for c in candidates
        if c.problem is None and c.timestamp >= offset.floor and c.token not in offset.seen
    ]
    by_age = sorted(fresh, key=lambda c: (c.timestamp, c.key))
    return sorted(bad, key=lambda c: c.key) + by_age


def advance(
    offset: StreamOffset,
    candidates: Sequence[Candidate],
    *,
    max_files: int | None,
    lateness: int,
    key_lead: int = 0,
) -> StreamOffset:
    """The next offset: up to `max_files` of the oldest pending candidates form the batch.

    Returns `offset` itself when nothing is pending (Spark then runs no batch).

    Args:
        offset: the previous batch's end offset.
        candidates: committed messages listed from `offset.floor - key_lead` on.
        max_files: at most this many messages per batch (None: all pending).
        lateness: ms a message may be committed after its stamp and still be delivered.
        key_lead: ms the listing reaches below `floor` (keys chosen before their stamp).
    """
    waiting = pending(offset, candidates)
    if not waiting:
        return offset
    take = waiting if max_files is None else waiting[:max_files]
    good = [c for c in take if c.problem is None]
    left = [c for c in waiting[len(take) :] if c.problem is None]
    top = max([offset.max, *(c.timestamp for c in good)])
    floor = max(offset.floor, top - lateness)
    if left:  # never skip a message a later batch still has to deliver
        floor = min(floor, left[0].timestamp)
    seen = {t: ms for t, ms in offset.seen.items() if ms >= floor}
    seen.update((c.token, c.timestamp) for c in good if c.timestamp >= floor)
    # Kept while the key's hour can still be listed (the listing starts at floor - key_lead).
    skipped = {t: hour for t, hour in offset.skipped.items() if hour + _HOUR_MS > floor - key_lead}
    skipped.update((c.token, c.timestamp) for c in take if c.problem is not None)
    bad = {c.key: c.problem for c in take if c.problem is not None}
    return StreamOffset(floor, top, seen, tuple(c.key for c in take), bad, skipped)


def positive_ms(value: str, name: str) -> int:
    """A non-negative duration option in seconds (decimals allowed), as ms."""
    try:
        seconds = float(value)
    except ValueError as exc:
        raise ConfigError(f"{name}: expected seconds, got {value!r}") from exc
    if not seconds >= 0 or seconds > 10 * 365 * 86400:
        raise ConfigError(f"{name}: expected seconds >= 0, got {value!r}")
    return int(seconds * 1000)
