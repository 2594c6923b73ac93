"""MQTT 5 PUBLISH properties as the project's own frozen value (no paho types)."""

from __future__ import annotations

from dataclasses import dataclass, replace


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
