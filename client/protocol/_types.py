"""Self-validating values shared by every wire format: topics, filters, message ids."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from ._errors import InvalidMessageId, InvalidTopic

MAX_TOPIC_BYTES = 65535  # MQTT UTF-8 string limit


def _is_disallowed(ch: str) -> bool:
    code = ord(ch)
    return (
        code < 0x20
        or 0x7F <= code <= 0x9F
        or 0xD800 <= code <= 0xDFFF
        or 0xFDD0 <= code <= 0xFDEF
        or (code & 0xFFFE) == 0xFFFE
    )


def mqtt_string_problem(value: str) -> str | None:
    """Why `value` cannot travel as an MQTT UTF-8 string, or None.

    MQTT 5 §1.5.4 forbids NUL and surrogates and says control characters and Unicode
    non-characters SHOULD NOT appear; mosquitto enforces all of them by disconnecting the
    sender ("Malformed packet"), so we refuse them before they reach a broker.
    """
    for ch in value:
        if _is_disallowed(ch):
            return f"contains the character U+{ord(ch):04X}, which MQTT brokers refuse"
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
