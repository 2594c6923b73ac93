"""What :class:`~._envelope_parse.EnvelopeParser` reports: the payload's start, its slices,
its end, and the document's completion, in that order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeAlias

_NO_FIELDS: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class PayloadStart:
    """The ``message`` element's header was read: `length` payload bytes follow.

    `fields` holds the fields that came before ``message``, already decoded: with our
    encoders the headers and key (so a server can pick the object key before the payload),
    with hop-client's nothing. It does not take part in comparisons.
    """

    length: int
    fields: Mapping[str, Any] = field(default_factory=lambda: _NO_FIELDS, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class PayloadData:
    """A slice of the payload, in order.

    `data` is a read-only view of the buffer given to :meth:`EnvelopeParser.feed`: consume
    it (or copy it) before that buffer is reused or resized.
    """

    data: bytes | memoryview


@dataclass(frozen=True, slots=True)
class PayloadEnd:
    """The last payload byte was delivered."""


@dataclass(frozen=True, slots=True)
class Complete:
    """The document ended well; `fields` holds every top-level field except ``message``."""

    fields: Mapping[str, Any]


Event: TypeAlias = PayloadStart | PayloadData | PayloadEnd | Complete
