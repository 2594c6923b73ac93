"""What the proxy changes in a PUBLISH: the placeholder in, the payload out. Pure.

The placeholder is the one the client library publishes (:class:`client.protocol.Placeholder`,
the same JSON for both protocol versions); in MQTT 5 the PUBLISH keeps every property the
client set, Topic Alias included (so an alias the offloaded PUBLISH set is set at the broker
too), with the user properties `_format=external` and `_id=<uuid>` in front, as the library
puts them. On the way out those two tags are removed again and every other property stays.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from client.protocol import (
    FORMAT_KEY,
    ID_KEY,
    TRACEPARENT,
    MessageId,
    Placeholder,
    PublishProperties,
    TraceContext,
    is_placeholder,
    parse_placeholder,
)

from ._errors import ProxyProtocolError
from ._framer import Head
from ._packets import PublishHeader, Will, fixed_header, publish_header_bytes
from ._properties import TOPIC_ALIAS, Prop, first, user_properties, without_user_properties
from ._properties import user_property as make_user_property

FORMAT_EXTERNAL = "external"


class UnknownTopicAlias(ProxyProtocolError):
    """A PUBLISH names a Topic Alias no earlier PUBLISH set (MQTT 5 reason 0x94)."""

    reason = 0x94


class AliasMap:
    """Topic aliases on a connection, client to broker, bounded by `maximum` (the broker's
    Topic Alias Maximum), as the client set them and as the broker was told them.

    The two differ when a PUBLISH that set an alias never reached the broker (the gateway
    refused a large one: MQTT 5 has the receiver set the alias all the same, and the
    client counts on it). An alias-only PUBLISH on such an alias goes to the broker with
    its topic written out (:meth:`for_broker`), which sets the broker's alias to what the
    client meant: it never lands on the topic the broker still held for that alias.
    """

    def __init__(self, maximum: int = 65535) -> None:
        self.maximum = maximum
        self._client: dict[int, bytes] = {}  # what the client set
        self._broker: dict[int, bytes] = {}  # what the broker was sent

    def topic(self, header: PublishHeader) -> str:
        """The PUBLISH's topic: its own, or the one its alias stands for; records a new
        alias as the client set it.

        Raises:
            UnknownTopicAlias: an empty topic with an alias never set, or out of range.
        """
        alias = first(header.properties, TOPIC_ALIAS)
        if isinstance(alias, int):
            if not 1 <= alias <= self.maximum:
                raise UnknownTopicAlias(f"Topic Alias {alias} is outside 1..{self.maximum}")
            if header.topic:
                self._client[alias] = header.topic
            elif alias in self._client:
                return self._client[alias].decode("utf-8")
            else:
                raise UnknownTopicAlias(f"Topic Alias {alias} was never set")
        if not header.topic:
            raise UnknownTopicAlias("a PUBLISH with neither topic nor Topic Alias")
        return header.topic_text

    def for_broker(
        self, head: Head, header: PublishHeader, prefix: bytes
    ) -> tuple[Head, PublishHeader, bytes]:
        """The PUBLISH as the broker must get it (after :meth:`topic`): as it is, or with
        the topic its alias stands for written out when the broker holds another (the
        fixed header, the variable header and the start of the body, as
        :func:`proxy.protocol.upgrade_publish` gives them)."""
        alias = first(header.properties, TOPIC_ALIAS)
        if header.topic or not isinstance(alias, int):
            return head, header, prefix
        topic = self._client[alias]
        if self._broker.get(alias) == topic:
            return head, header, prefix
        spelled = PublishHeader(topic, header.packet_id, header.properties, 0)
        variable = publish_header_bytes(spelled, header.properties, v5=True)
        length = head.length - header.size + len(variable)
        return (
            Head(head.first, length, fixed_header(head.first, length)),
            PublishHeader(topic, header.packet_id, header.properties, len(variable)),
            variable + prefix[header.size :],
        )

    def sent(self, header: PublishHeader) -> None:
        """The broker was sent this PUBLISH (or its placeholder, which keeps its topic and
        alias): an alias it sets is set at the broker too."""
        alias = first(header.properties, TOPIC_ALIAS)
        if isinstance(alias, int) and header.topic:
            self._broker[alias] = header.topic


@dataclass(frozen=True, slots=True)
class Stored:
    """A payload the gateway stored: what the placeholder says."""

    url: str
    size: int
    sha256: str
    message_id: MessageId


def _placeholder(
    original: tuple[Prop, ...], stored: Stored, *, v5: bool
) -> tuple[tuple[Prop, ...], bytes]:
    """The placeholder's properties (the tags, then the original's) and its JSON."""
    ref = Placeholder(stored.url, stored.size, stored.sha256, stored.message_id)
    body, _ = ref.encode(None, protocol=4)  # the JSON alone; tags as raw properties below
    if not v5:
        return (), body
    tags = (
        make_user_property(FORMAT_KEY, FORMAT_EXTERNAL),
        make_user_property(ID_KEY, str(stored.message_id)),
    )
    return tags + without_user_properties(original, FORMAT_KEY, ID_KEY), body


def placeholder_packet(
    first_byte: int, header: PublishHeader, stored: Stored, *, v5: bool
) -> bytes:
    """The whole PUBLISH that goes to the broker in place of the offloaded one."""
    props, body = _placeholder(header.properties, stored, v5=v5)
    variable = publish_header_bytes(header, props, v5=v5)
    return fixed_header(first_byte, len(variable) + len(body)) + variable + body


def placeholder_will(will: Will, stored: Stored, *, v5: bool) -> tuple[tuple[Prop, ...], bytes]:
    """The Will properties and payload that stand for a stored Will payload."""
    return _placeholder(will.properties, stored, v5=v5)


def stored_headers(header: PublishHeader) -> tuple[tuple[str, str], ...]:
    """The user properties the gateway stores beside the payload (the library's choice)."""
    return tuple(
        (k, v) for k, v in user_properties(header.properties) if k not in (FORMAT_KEY, ID_KEY)
    )


def trace_context(header: PublishHeader) -> TraceContext | bool:
    """A PUBLISH's own W3C trace context (its `traceparent` / `tracestate` user
    properties, parsed by the bounded codec): the context; True when it carries a
    `traceparent` that is not one (kept as it is, never replaced); False when none."""
    pairs = user_properties(header.properties)
    if not any(name == TRACEPARENT for name, _ in pairs):
        return False
    return TraceContext.from_pairs(pairs) or True


def will_trace(will: Will) -> TraceContext | None:
    """A Will's own W3C trace context (its `traceparent` / `tracestate` Will properties,
    parsed by the bounded codec); None when it carries no valid one."""
    return TraceContext.from_pairs(user_properties(will.properties))


def with_trace(header: PublishHeader, context: TraceContext) -> PublishHeader:
    """`header` with `context` appended as `traceparent` / `tracestate` user properties
    (its `size` stays the received header's: the payload is cut by it)."""
    added = tuple(make_user_property(name, value) for name, value in context.pairs())
    return replace(header, properties=header.properties + added)


def read_placeholder(header: PublishHeader, payload: bytes) -> Placeholder | None:
    """The reference a delivered PUBLISH carries, None when it is not a placeholder.

    Raises:
        MalformedPlaceholder: tagged as one, but its reference cannot be read.
    """
    props = PublishProperties(user_properties=user_properties(header.properties))
    if not is_placeholder(payload, props):
        return None
    return parse_placeholder(payload, props)


def resolved_size(header: PublishHeader, size: int, *, v5: bool) -> int:
    """The whole PUBLISH's size once the placeholder's `size` bytes replace it (any size)."""
    props = without_user_properties(header.properties, FORMAT_KEY, ID_KEY)
    remaining = len(publish_header_bytes(header, props, v5=v5)) + size
    width = 1 if remaining < 2**7 else 2 if remaining < 2**14 else 3 if remaining < 2**21 else 4
    return 1 + width + remaining


def resolved_head(first_byte: int, header: PublishHeader, size: int, *, v5: bool) -> bytes:
    """Fixed and variable header of the PUBLISH that carries the payload itself."""
    props = without_user_properties(header.properties, FORMAT_KEY, ID_KEY)
    variable = publish_header_bytes(header, props, v5=v5)
    return fixed_header(first_byte, len(variable) + size) + variable
