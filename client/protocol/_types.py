"""Self-validating values shared by every wire format: topics, filters, message ids."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from ._errors import InvalidMessageId, InvalidTopic

MAX_TOPIC_BYTES = 65535  # MQTT UTF-8 string limit


#: What MQTT 5 (1.5.4) forbids or says SHOULD NOT appear in a UTF-8 string, and mosquitto
#: refuses: C0 and C1 controls (NUL included), surrogates, and the Unicode non-characters
#: (U+FDD0-U+FDEF, and the last two code points of each of the 17 planes).
_DISALLOWED = re.compile(
    "[\x00-\x1f\x7f-\x9f\ud800-\udfff\ufdd0-\ufdef"
    + "".join(chr(plane << 16 | 0xFFFE) + chr(plane << 16 | 0xFFFF) for plane in range(17))
    + "]"
)


def mqtt_string_problem(value: str) -> str | None:
    """Why `value` cannot travel as an MQTT UTF-8 string, or None.

    MQTT 5 §1.5.4 forbids NUL and surrogates and says control characters and Unicode
    non-characters SHOULD NOT appear; mosquitto enforces all of them by disconnecting the
    sender ("Malformed packet"), so we refuse them before they reach a broker. One search
    of :data:`_DISALLOWED` (a loop over the characters in Python took 3.1 us for a
    20-character topic and 23 us for 208, the search 1.2 and 6.4).
    """
    found = _DISALLOWED.search(value)
    if found is not None:
        return f"contains the character U+{ord(found.group()):04X}, which MQTT brokers refuse"
    return None


def _check_common(value: object, kind: str) -> str:
    if not isinstance(value, str):
        raise InvalidTopic(value, f"{kind} must be a string")
    if not value:
        raise InvalidTopic(value, f"{kind} must not be empty")
    if "\x00" in value:
        raise InvalidTopic(value, f"{kind} must not contain NUL")
    problem = mqtt_string_problem(value)
    if problem is not None:
        raise InvalidTopic(value, problem)
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidTopic(value, "not valid UTF-8") from exc
    if len(encoded) > MAX_TOPIC_BYTES:
        raise InvalidTopic(value, f"longer than {MAX_TOPIC_BYTES} bytes")
    return value


@dataclass(frozen=True, slots=True)
class Topic:
    """An MQTT topic name: what a message is published to (no wildcards)."""

    value: str

    def __post_init__(self) -> None:
        _check_common(self.value, "topic")
        if "+" in self.value or "#" in self.value:
            raise InvalidTopic(self.value, "wildcards are not allowed in a topic name")

    @property
    def levels(self) -> tuple[str, ...]:
        return tuple(self.value.split("/"))

    def matches(self, topic_filter: TopicFilter | str) -> bool:
        f = topic_filter if isinstance(topic_filter, TopicFilter) else TopicFilter(topic_filter)
        return f.matches(self)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class TopicFilter:
    """An MQTT topic filter (`+` single level, `#` multi-level, last only)."""

    value: str

    def __post_init__(self) -> None:
        _check_common(self.value, "topic filter")
        levels = self.value.split("/")
        for i, level in enumerate(levels):
            if "#" in level and (level != "#" or i != len(levels) - 1):
                raise InvalidTopic(self.value, "'#' must be a whole last level")
            if "+" in level and level != "+":
                raise InvalidTopic(self.value, "'+' must be a whole level")

    @property
    def levels(self) -> tuple[str, ...]:
        return tuple(self.value.split("/"))

    @property
    def has_wildcards(self) -> bool:
        return "+" in self.value or "#" in self.value

    def matches(self, topic: Topic | str) -> bool:
        name = topic.value if isinstance(topic, Topic) else topic
        t_levels = name.split("/")
        f_levels = self.levels
        # MQTT-4.7.2-1: wildcards at the first level do not match topics starting with `$`
        if name.startswith("$") and f_levels[0] in ("+", "#"):
            return False
        for i, f in enumerate(f_levels):
            if f == "#":
                return True
            if i >= len(t_levels):
                return False
            if f != "+" and f != t_levels[i]:
                return False
        return len(t_levels) == len(f_levels)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class MessageId:
    """A message id: a UUID, on the wire as 16 raw bytes (hop-client) or 36-char text."""

    uuid: uuid.UUID

    def __post_init__(self) -> None:
        if not isinstance(self.uuid, uuid.UUID):
            raise InvalidMessageId(self.uuid, "not a UUID object")

    @classmethod
    def new(cls) -> MessageId:
        return cls(uuid.uuid4())

    @classmethod
    def parse(cls, value: str | bytes | bytearray | memoryview) -> MessageId:
        """Parse 16 raw bytes or the canonical 8-4-4-4-12 text (as str or ASCII bytes)."""
        if isinstance(value, bytes | bytearray | memoryview):
            raw = bytes(value)
            if len(raw) == 16:
                return cls(uuid.UUID(bytes=raw))
            try:
                value = raw.decode("ascii")
            except UnicodeDecodeError as exc:
                raise InvalidMessageId(raw, "neither 16 raw bytes nor UUID text") from exc
        if not isinstance(value, str):
            raise InvalidMessageId(value, "must be str or bytes")
        # Only the canonical form: ids become object keys and URL path segments.
        if len(value) != 36 or value.count("-") != 4:
            raise InvalidMessageId(value, "expected 8-4-4-4-12 hexadecimal UUID text")
        try:
            parsed = uuid.UUID(value)
        except ValueError as exc:
            raise InvalidMessageId(value) from exc
        if str(parsed) != value.lower():
            raise InvalidMessageId(value, "expected 8-4-4-4-12 hexadecimal UUID text")
        return cls(parsed)

    @property
    def bytes(self) -> bytes:
        return self.uuid.bytes

    def __str__(self) -> str:
        return str(self.uuid)
