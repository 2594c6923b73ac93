"""Bad objects: one message the reader cannot turn into a row is skipped and reported, by key.

Anyone who can publish can commit a message whose payload does not match the SHA-256 its
publisher claimed (a direct upload's whole-payload hash is the publisher's word), and anyone
with the store's credentials can write any sidecar or index entry. Failing the task on such
an object would fail the query, and a restarted query would meet the same object again: one
publisher could stop a pipeline for good. So by default (`onBadObject` = `skip`) a task skips
the object and reports it:

* a WARNING on the `client.spark` logger, in the executor's log, naming the object's URL,
  the kind of problem and the reason;
* the count per kind, and the first EXAMPLES (key, kind, reason), in the accumulator that
  `register` returns (`BadObjects`), readable on the driver.

`onBadObject` = `fail` fails the task instead (the error names the object), for a job that
would rather stop than publish a partial result. An object deleted after the scan planned it
(`gone`: expiry, the sweeper) is reported but never fails a scan: expiry is routine.

Only problems of one object are contained here. A store that cannot be reached or refuses
the credentials fails the task as before, so that Spark retries it and a stream restarts from
its checkpoint, rather than skipping, and so losing, every message it could not read.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core._exceptions import ProtocolError
from ._options import OnBadObject

log = logging.getLogger("client.spark")

EXAMPLES = 100  # (key, kind, reason) kept in the accumulator; the counts are exact


class Problem(enum.Enum):
    """Why an object was not delivered."""

    GONE = "gone"  # deleted (expired, swept) after the scan planned it
    MALFORMED = "malformed"  # sidecar or index entry is not a manifest a row can hold
    CHECKSUM = "checksum"  # payload differs from its manifest: size, CRC-32C or SHA-256
    TOO_LARGE = "too-large"  # larger than a Spark binary value, or a sidecar beyond bound
    UNDECODABLE = "undecodable"  # encrypted or compressed, and no identity (or frame) opens it


@dataclass(frozen=True, slots=True)
class BadObject:
    """One object a task did not deliver, and why. `error` is what `fail` raises."""

    key: str
    problem: Problem
    reason: str
    error: Exception | None = field(default=None, compare=False)

    def describe(self, location: str) -> str:
        """One line naming the object (`location` is the store URL) for logs and errors."""
        return f"{location}/{self.key} ({self.problem.value}): {self.reason}"


@dataclass(frozen=True, slots=True)
class Tally:
    """What the accumulator adds up: counts per problem, and the first EXAMPLES objects."""

    counts: Mapping[str, int] = field(default_factory=dict)
    examples: tuple[tuple[str, str, str], ...] = ()

    @classmethod
    def of(cls, bad: BadObject) -> Tally:
        return cls({bad.problem.value: 1}, ((bad.key, bad.problem.value, bad.reason),))

    def plus(self, other: Tally) -> Tally:
        counts = dict(self.counts)
        for kind, n in other.counts.items():
            counts[kind] = counts.get(kind, 0) + n
        return Tally(counts, (self.examples + other.examples)[:EXAMPLES])


class TallyParam:
    """A pyspark AccumulatorParam (duck-typed, so this module needs no pyspark)."""

    def zero(self, value: Tally) -> Tally:
        return Tally()

    def addInPlace(self, value1: Tally, value2: Tally) -> Tally:
        return value1.plus(value2)


class BadObjects:
    """The driver's view of the objects every `offload` scan of a session skipped.

    Returned by `register(spark)`, the same counter for every call in one SparkContext.
    Counts add up over every query of the session; `reset()` starts again from zero. Spark counts
    a task's updates again when it re-runs the task, so after a retry a count can exceed the
    number of distinct objects; the executors' WARNING lines name each one. Without a
    SparkContext (Spark Connect) nothing is counted: see the logs.
    """

    def __init__(self, accumulator: Any | None) -> None:
        self.accumulator = accumulator

    def _tally(self) -> Tally:
        return Tally() if self.accumulator is None else self.accumulator.value

    @property
    def count(self) -> int:
        """Objects skipped so far, of every kind."""
        return sum(self._tally().counts.values())

    @property
    def counts(self) -> dict[str, int]:
        """Objects skipped so far, per kind (`gone`, `malformed`, `checksum`, `too-large`,
        `undecodable`)."""
        return dict(self._tally().counts)

    @property
    def examples(self) -> list[tuple[str, str, str]]:
        """(key, kind, reason) of the first EXAMPLES skipped objects."""
        return list(self._tally().examples)

    def reset(self) -> None:
        """Start counting from zero again (on the driver, between queries)."""
        if self.accumulator is not None:
            self.accumulator.value = Tally()

    def __repr__(self) -> str:
        return f"BadObjects(count={self.count}, counts={self.counts})"


@dataclass(frozen=True, slots=True)
class Reporter:
    """Reports a task's bad objects; under `fail` raises for every one not merely gone."""

    location: str
    on_bad_object: OnBadObject = OnBadObject.SKIP
    accumulator: Any | None = None

    def __call__(self, bad: BadObject) -> None:
        line = bad.describe(self.location)
        if self.on_bad_object is OnBadObject.FAIL and bad.problem is not Problem.GONE:
            if bad.error is not None:
                raise bad.error
            raise ProtocolError(line)
        log.warning("offload source skipped %s", line)
        if self.accumulator is not None:
            self.accumulator.add(Tally.of(bad))
