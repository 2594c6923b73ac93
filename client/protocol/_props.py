"""MQTT 5 PUBLISH properties as the project's own frozen value (no paho types)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ._errors import InvalidTopic
from ._types import Topic, mqtt_string_problem

MAX_MQTT_STRING_BYTES = 65535  # two-byte length prefix (MQTT 5 §1.5.4, §1.5.6)


@dataclass(frozen=True, slots=True)
class PublishProperties:
    """The PUBLISH properties an application can set or receive.

    `user_properties` keeps order and duplicates, as MQTT 5 does.
    """

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    topic_alias: int | None = None
    subscription_identifiers: tuple[int, ...] = ()

    def user_property(self, name: str) -> str | None:
        """The first value of user property `name`, or None."""
        for key, value in self.user_properties:
            if key == name:
                return value
        return None

    def without_user_properties(self, *names: str) -> PublishProperties:
        kept = tuple((k, v) for k, v in self.user_properties if k not in names)
        return replace(self, user_properties=kept)

    def with_user_properties(self, *pairs: tuple[str, str]) -> PublishProperties:
        return replace(self, user_properties=self.user_properties + tuple(pairs))


def mqtt_text_problem(value: object, what: str) -> str | None:
    """Why `value` cannot be an MQTT UTF-8 string (`what` names it), or None.

    The rules mosquitto enforces by disconnecting the sender: a str, encodable as UTF-8
    (no lone surrogates), no U+0000, no control characters, no non-characters, at most
    65535 bytes.
    """
    if not isinstance(value, str):
        return f"{what} must be a string"
    problem = mqtt_string_problem(value)
    if problem is not None:
        return f"{what} {problem}"
    if len(value.encode("utf-8")) > MAX_MQTT_STRING_BYTES:
        return f"{what} is longer than {MAX_MQTT_STRING_BYTES} bytes"
    return None


def publish_properties_problem(props: PublishProperties) -> str | None:
    """Why a broker would refuse a PUBLISH carrying `props`, or None. Pure.

    Every string property must pass :func:`mqtt_text_problem`, the response topic must be
    a topic name (no wildcards), correlation data at most 65535 bytes, integers in range
    (a topic alias 1 to 65535).
    One check for every path that publishes, so a value a broker refuses is caught before
    anything is stored or queued.
    """
    strings = (("content type", props.content_type), ("response topic", props.response_topic))
    for name, text in strings:
        if text is not None:
            problem = mqtt_text_problem(text, name)
            if problem is not None:
                return problem
    if props.response_topic is not None:
        try:
            Topic(props.response_topic)
        except InvalidTopic as exc:
            return f"response topic: {exc}"
    if props.correlation_data is not None and (
        not isinstance(props.correlation_data, bytes)
        or len(props.correlation_data) > MAX_MQTT_STRING_BYTES
    ):
        return f"correlation data must be at most {MAX_MQTT_STRING_BYTES} bytes"
    for index, pair in enumerate(props.user_properties):
        if not isinstance(pair, tuple) or len(pair) != 2:
            return f"user property {index} must be a (name, value) pair"
        for part, text in zip(("name", "value"), pair, strict=True):
            problem = mqtt_text_problem(text, f"user property {index} {part}")
            if problem is not None:
                return problem
    if props.payload_format_indicator not in (None, 0, 1):
        return "payload format indicator must be 0 or 1"
    if props.topic_alias is not None and not 1 <= props.topic_alias <= 65535:
        return "topic alias must be 1 to 65535"  # 0 is a protocol error (MQTT 5 3.3.2.3.4)
    expiry = props.message_expiry_interval
    if expiry is not None and not 0 <= expiry <= 2**32 - 1:
        return "message expiry interval must fit four bytes"
    return None
