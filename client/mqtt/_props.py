"""MQTT 5 PUBLISH properties between the project's frozen value and paho's mutable one.

Used only by :mod:`client.mqtt._paho`, the module that owns the paho client, and its parts
(`_paho_publishes`); no paho type leaves the adapter.
"""

from __future__ import annotations

from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from ..protocol import PublishProperties


def to_paho_properties(
    props: PublishProperties | None, packet: int = PacketTypes.PUBLISH
) -> Properties | None:
    """Our PublishProperties as paho's PUBLISH (or `packet`'s, e.g. WILLMESSAGE) Properties
    (None when there are none)."""
    if props is None or props == PublishProperties():
        return None
    out = Properties(packet)  # type: ignore[no-untyped-call]
    if props.payload_format_indicator is not None:
        out.PayloadFormatIndicator = props.payload_format_indicator
    if props.message_expiry_interval is not None:
        out.MessageExpiryInterval = props.message_expiry_interval
    if props.content_type is not None:
        out.ContentType = props.content_type
    if props.response_topic is not None:
        out.ResponseTopic = props.response_topic
    if props.correlation_data is not None:
        out.CorrelationData = props.correlation_data
    if props.user_properties:
        out.UserProperty = list(props.user_properties)
    if props.topic_alias is not None:
        out.TopicAlias = props.topic_alias
    return out


def from_paho_properties(props: Properties | None) -> PublishProperties:
    """paho's received PUBLISH Properties as our frozen value."""
    if props is None:
        return PublishProperties()

    def get(name: str) -> Any:
        return getattr(props, name, None)

    sub_ids = get("SubscriptionIdentifier")
    if isinstance(sub_ids, int):
        sub_ids = [sub_ids]
    corr = get("CorrelationData")
    return PublishProperties(
        payload_format_indicator=get("PayloadFormatIndicator"),
        message_expiry_interval=get("MessageExpiryInterval"),
        content_type=get("ContentType"),
        response_topic=get("ResponseTopic"),
        correlation_data=bytes(corr) if corr is not None else None,
        user_properties=tuple((str(k), str(v)) for k, v in (get("UserProperty") or ())),
        topic_alias=get("TopicAlias"),
        subscription_identifiers=tuple(sub_ids or ()),
    )
