"""Which way a message goes: direct, offloaded or chunked. Pure decision, no I/O.

Order (issue 3): a message whose exact PUBLISH size fits the limit is published as it is,
unless an operator's lower `offload_threshold` asks to keep big payloads off the broker and an
endpoint is there to take them; otherwise it is offloaded when an endpoint is known and
automatic offload is on; otherwise chunked when chunking is on; otherwise it cannot be sent.
"""

from __future__ import annotations

from ..core._exceptions import MessageTooLarge
from ..core._message import Route


def choose_route(
    *,
    packet_size: int,
    payload_size: int,
    limit: int,
    offload_threshold: int | None,
    endpoint_known: bool,
    automatic_offload: bool,
    chunking: bool,
) -> Route:
    """Pick the route for one message.

    Args:
        packet_size: the exact encoded size of the message as a single PUBLISH packet.
        payload_size: its payload length.
        limit: the Maximum Packet Size in force (CONNACK, else configured).
        offload_threshold: payloads larger than this go through the gateway even when they
            would fit, if an endpoint is known; None for no threshold.
        endpoint_known: an offload endpoint is configured or discovered.
        automatic_offload: the `automatic_offload` switch.
        chunking: the `chunking` switch.

    Raises:
        MessageTooLarge: it does not fit and neither offload nor chunking may be used.
    """
    can_offload = endpoint_known and automatic_offload
    fits = packet_size <= limit
    if fits:
        if can_offload and offload_threshold is not None and payload_size > offload_threshold:
            return Route.OFFLOADED
        return Route.DIRECT
    if can_offload:
        return Route.OFFLOADED
    if chunking:
        return Route.CHUNKED
    if not automatic_offload:
        reason = "automatic offload and chunking are disabled"
    else:
        reason = "no offload endpoint is known and chunking is disabled"
    raise MessageTooLarge(packet_size, limit, reason)
