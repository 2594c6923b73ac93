"""A committed message announced on the broker: its placeholder, published or withdrawn.

The placeholder is the same `_format=external` one the client library publishes
(`client.protocol.Placeholder.encode`), so subscribers cannot tell who offloaded it. A
placeholder the broker would refuse (over its Maximum Packet Size, a user property no
PUBLISH may carry) is a 400 before it is sent; one the broker does not take withdraws the
message it announces, so no stored payload is left unannounced.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from client import ConnectionFailed, PublishRejected
from client.protocol import (
    TRACEPARENT,
    Manifest,
    Placeholder,
    PublishProperties,
    mqtt_text_problem,
    publish_packet_size,
    publish_properties_problem,
)
from client.tracing import Span, message_attributes

from ..core import BadRequest, BrokerUnavailable, InvalidPublish, StorageUnavailable, child
from ..ingest import RESERVED, PublishOptions
from ._context import Context, NoBroker

log = logging.getLogger("gateway")

PUBLISH_TIMEOUT = 30.0  # seconds to wait for the broker's PUBACK/PUBCOMP


def require_broker(ctx: Context) -> None:
    """Refuse before reading a body when the placeholder could not be published anyway."""
    if isinstance(ctx.broker, NoBroker):
        raise BrokerUnavailable("this gateway has no broker configured (OFFLOAD_MQTT_URL)")
    if not ctx.broker.connected:
        raise BrokerUnavailable(f"broker unreachable: not connected to {ctx.broker.broker}")


async def announce(
    ctx: Context,
    manifest: Manifest,
    url: str,
    options: PublishOptions,
    *,
    created: bool = True,
) -> None:
    """Publish the placeholder for a committed message; withdraw the message on failure.

    Args:
        ctx: the request context (its broker link).
        manifest: the committed message.
        url: the message URL the placeholder carries (`.../msg/<id>`).
        options: QoS, retain, expiry and user properties of the placeholder.
        created: False when the commit found an identical earlier message: that one is
            not withdrawn on failure, since an earlier publish may have announced it.

    The placeholder carries the `publish` span's context only where it still fits the
    broker's Maximum Packet Size (as offload-proxy adds it).

    Raises:
        BadRequest: the placeholder (its user properties) is over the broker's limit.
        BrokerUnavailable: the broker is unreachable or did not acknowledge.
    """
    placeholder = Placeholder(url, manifest.size, manifest.sha256, manifest.id, options.encoding)
    original = options.properties(manifest.content_type)
    with publish_span(manifest, original) as span:
        body, props = placeholder.encode(original)
        if span.context is not None and original.user_property(TRACEPARENT) is None:
            traced = placeholder.encode(original.with_user_properties(*span.context.pairs()))
            if _over_limit(ctx, manifest, traced[0], traced[1], options) is None:
                body, props = traced
        await _publish_placeholder(ctx, manifest, body, props, options, created)


def publish_span(manifest: Manifest, original: PublishProperties) -> Span:
    """The placeholder's `publish {topic}` span: PRODUCER, its context the message's
    creation context, unless the uploader gave its own `traceparent` user property (kept
    as it is: then CLIENT)."""
    custom = original.user_property(TRACEPARENT) is not None
    attributes = message_attributes(
        manifest.topic.value, manifest.size, "publish", "send", str(manifest.id)
    )
    name = f"publish {manifest.topic.value}"
    return child(name, "client" if custom else "producer", attributes)


async def _publish_placeholder(
    ctx: Context,
    manifest: Manifest,
    body: bytes,
    props: PublishProperties | None,
    options: PublishOptions,
    created: bool,
) -> None:
    """Send the placeholder; withdraw the message when the broker does not take it."""
    problem = None if props is None else publish_properties_problem(props)
    # A PUBLISH over the broker's limit is answered by dropping the gateway's connection,
    # and with it every other request's placeholder on the way.
    problem = problem or _over_limit(ctx, manifest, body, props, options)
    if problem is not None:
        # Every route validates before storing; this is the last line, never the first.
        if created:
            await ctx.service.forget(manifest)
        raise BadRequest(f"cannot publish this message: {problem}; nothing was kept")
    try:
        require_broker(ctx)
        future = ctx.broker.publish(
            manifest.topic.value, body, qos=options.qos, retain=options.retain, properties=props
        )
        await asyncio.wait_for(asyncio.wrap_future(future), PUBLISH_TIMEOUT)
    except InvalidPublish as exc:  # unreachable after the check above; never a 5xx
        if created:
            await ctx.service.forget(manifest)
        raise BadRequest(f"cannot publish this message: {exc}; nothing was kept") from exc
    except (ConnectionFailed, PublishRejected, TimeoutError, BrokerUnavailable) as exc:
        if created:
            try:
                await ctx.service.forget(manifest)
            except StorageUnavailable as gone:  # the sweeper removes it at expiry instead
                log.warning("could not withdraw unannounced %s: %s", manifest.id, gone)
        raise BrokerUnavailable(
            f"broker unreachable, message not published and not kept: {exc}"
        ) from exc


def _over_limit(
    ctx: Context,
    manifest: Manifest,
    body: bytes,
    props: PublishProperties | None,
    options: PublishOptions,
) -> str | None:
    """Why the placeholder cannot go to the broker (over its Maximum Packet Size), or None
    (also when the broker states no limit)."""
    limit = ctx.broker.max_packet_size
    try:
        size = publish_packet_size(
            manifest.topic.value, len(body), qos=options.qos, properties=props
        )
    except ValueError as exc:  # ProtocolError: a property no PUBLISH can carry
        return str(exc)
    if limit is None or size <= limit:
        return None
    return f"its placeholder would be {size} bytes, over the broker's limit of {limit}"


def placeholder_user_properties(
    headers: Sequence[tuple[str, bytes]],
) -> tuple[tuple[str, str], ...]:
    """Stored headers as the placeholder's MQTT user properties (reserved names skipped).

    A value that is not UTF-8 is a binary hop header with no user-property form and stays
    only in the stored message. A text header the broker would refuse (control characters
    such as CR/LF, non-characters, over 65535 bytes) is refused with 400: dropping it would
    lose it silently, sending it would get the gateway disconnected.

    Raises:
        BadRequest: a text header cannot travel as an MQTT user property.
    """
    out: list[tuple[str, str]] = []
    for name, value in headers:
        if name in RESERVED:
            continue
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            continue  # binary hop headers have no MQTT user-property form
        problem = mqtt_text_problem(name, "header name") or mqtt_text_problem(
            text, f"header {name!r:.60} value"
        )
        if problem is not None:
            raise BadRequest(f"{problem}: it cannot travel as an MQTT user property")
        out.append((name, text))
    return tuple(out)
