"""Offsets of the `offload` streaming source: which committed messages a micro-batch takes. Pure.

Messages have no global sequence number: a payload key carries only its topic, UTC hour and
a random token, and a message becomes visible (its sidecar appears) when its upload ends,
which may be long after the timestamp the gateway stamped when the upload began. So an
offset is a position in time plus the tokens already delivered near it:

* `floor`: every message stamped before it has been delivered, or is given up on;
* `seen`: token -> stamp of delivered messages stamped at or after `floor` (never twice);
* `max`: the latest timestamp delivered so far;
* `batch`: the payload keys this micro-batch delivers (so a batch replayed after a crash
  reads exactly the same keys: the offset alone decides, nothing else).

`floor` trails `max` by `lateness` ms (an upload taking longer than that from its stamp to
its commit is missed), and never passes a message still waiting for a later batch.
`seen` therefore holds the tokens of about `lateness` ms of traffic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._exceptions import ConfigError

OFFSET_VERSION = 1


@dataclass(frozen=True, slots=True)
class Candidate:
    """A committed message not yet delivered: its payload key, token and stamp."""

    key: str
    token: str
    timestamp: int


@dataclass(frozen=True, slots=True)
class StreamOffset:
    """One position of the stream (see the module docstring)."""

    floor: int
    max: int
    seen: Mapping[str, int]
    batch: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The offset as Spark stores it in the checkpoint (primitive types only)."""
        return {
            "v": OFFSET_VERSION,
            "floor": self.floor,
            "max": self.max,
            "seen": dict(sorted(self.seen.items())),
            "batch": list(self.batch),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StreamOffset:
        """Parse an offset read back from a checkpoint; a foreign one is a ConfigError."""
        try:
            if data.get("v") != OFFSET_VERSION:
                raise ValueError(f"version {data.get('v')!r}")
            floor, top = int(data["floor"]), int(data["max"])
            seen = {str(t): int(ms) for t, ms in dict(data["seen"]).items()}
            batch = tuple(str(k) for k in data["batch"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"not an offload stream offset: {exc}") from exc
        return cls(floor, top, seen, batch)


def initial_offset(since: int | None) -> StreamOffset:
    """Where a new query starts: at `since` (ms), or at the oldest message."""
    start = since if since is not None else 0
    return StreamOffset(start, start, {})


def pending(offset: StreamOffset, candidates: Sequence[Candidate]) -> list[Candidate]:
    """Candidates not yet delivered by `offset`, oldest first (ties by key)."""
    fresh = [c for c in candidates if c.timestamp >= offset.floor and c.token not in offset.seen]
    return sorted(fresh, key=lambda c: (c.timestamp, c.key))


def advance(
    offset: StreamOffset,
    candidates: Sequence[Candidate],
    *,
    max_files: int | None,
    lateness: int,
) -> StreamOffset:
    """The next offset: up to `max_files` of the oldest pending candidates form the batch.

    Returns `offset` itself when nothing is pending (Spark then runs no batch).

    Args:
        offset: the previous batch's end offset.
        candidates: committed messages listed at or after `offset.floor`.
        max_files: at most this many messages per batch (None: all pending).
        lateness: ms a message may be committed after its stamp and still be delivered.
    """
    waiting = pending(offset, candidates)
    if not waiting:
        return offset
    take = waiting if max_files is None else waiting[:max_files]
    left = waiting[len(take) :]
    top = max(offset.max, take[-1].timestamp)
    floor = max(offset.floor, top - lateness)
    if left:  # never skip a message a later batch still has to deliver
        floor = min(floor, left[0].timestamp)
    seen = {t: ms for t, ms in offset.seen.items() if ms >= floor}
    seen.update((c.token, c.timestamp) for c in take if c.timestamp >= floor)
    return StreamOffset(floor, top, seen, tuple(c.key for c in take))


def positive_ms(value: str, name: str) -> int:
    """A non-negative duration option in seconds (decimals allowed), as ms."""
    try:
        seconds = float(value)
    except ValueError as exc:
        raise ConfigError(f"{name}: expected seconds, got {value!r}") from exc
    if not seconds >= 0 or seconds > 10 * 365 * 86400:
        raise ConfigError(f"{name}: expected seconds >= 0, got {value!r}")
    return int(seconds * 1000)
