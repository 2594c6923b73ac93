"""MQTT 5 PUBLISH properties between the project's frozen value and paho's mutable one.

Used only by :mod:`client.mqtt._paho`, the module that owns the paho client, and its parts
(`_paho_publishes`); no paho type leaves the adapter.
"""

from __future__ import annotations

from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from ..protocol import PublishProperties
from ..protocol._props_wire import encode_properties

#: paho's tables of property names and types, which every `Properties` builds for itself.
_TABLES = dict(vars(Properties(PacketTypes.PUBLISH)))  # type: ignore[no-untyped-call]
_NONE = PublishProperties()


class PackedProperties(Properties):
    """A PUBLISH's properties, packed once by the project's encoder
    (:func:`client.protocol._props_wire.encode_properties`).

    paho's own `Properties` builds its name tables for each object, checks each attribute
    set against them and packs by scanning all 27 names: 24 us for one user property (a
    `traceparent`), 5 % of a 1 KB message's round trip. paho reads the properties of a
    PUBLISH it sends only through :meth:`pack` (and `str()` in a log line), so they are
    set here without its checks (:func:`client.protocol.publish_properties_problem` has
    passed them) on its shared tables, and :meth:`pack` returns the bytes.
    """

    _wire: bytes

    def __init__(self, props: PublishProperties) -> None:  # paho's tables: shared, not built
        state = vars(self)
        state.update(_TABLES)
        state.update(_attributes(props))
        state["_wire"] = encode_properties(props)

    def pack(self) -> bytes:
        return self._wire


def to_paho_properties(
    props: PublishProperties | None, packet: int = PacketTypes.PUBLISH
) -> Properties | None:
    """Our PublishProperties as paho's PUBLISH (or `packet`'s, e.g. WILLMESSAGE) Properties
    (None when there are none); a PUBLISH's already packed (:class:`PackedProperties`)."""
    if props is None or props == _NONE:
        return None
    if packet == PacketTypes.PUBLISH:
        return PackedProperties(props)
    out = Properties(packet)  # type: ignore[no-untyped-call]
    for name, value in _attributes(props).items():
        setattr(out, name, value)
    return out


def _attributes(props: PublishProperties) -> dict[str, object]:
    """paho's attribute names and values for the properties a client sends."""
    out: dict[str, object] = {}
    if props.payload_format_indicator is not None:
        out["PayloadFormatIndicator"] = props.payload_format_indicator
    if props.message_expiry_interval is not None:
        out["MessageExpiryInterval"] = props.message_expiry_interval
    if props.content_type is not None:
        out["ContentType"] = props.content_type
    if props.response_topic is not None:
        out["ResponseTopic"] = props.response_topic
    if props.correlation_data is not None:
        out["CorrelationData"] = props.correlation_data
    if props.user_properties:
        out["UserProperty"] = list(props.user_properties)
    if props.topic_alias is not None:
        out["TopicAlias"] = props.topic_alias
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
