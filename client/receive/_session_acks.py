"""When a received QoS 1/2 message is acknowledged to the broker.

A clean session (the default) acknowledges a message as soon as the receive worker takes it
from the hand-off queue: that is flow control (the broker may send one more), and a message
not yet delivered when the process ends is lost with the session anyway.

A persistent session (`session_expiry` > 0) promises more: whatever the broker queued for the
client reaches the application, across a reconnect and a restart of the process. So a message
is acknowledged only once the application took its delivery (:meth:`Client.next_message`,
the `messages()` iterators) or the client decided to skip it (`ignore_payload_not_found`).
A message still being fetched or waiting in the delivery queue when the process dies is
sent again by the broker on the next connect: at least once, never lost.

Chunks of an ADR-23 message are the exception: each is acknowledged when taken, as before.
Holding every chunk until the whole message is delivered could fill the broker's window
(Receive Maximum) with chunks of one message and stop it for good; and a partial message is
kept in this process's memory, which a restart loses in any case.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..config._settings import ClientSettings
from ..mqtt._paho import Incoming, MqttConnection
from ..protocol._chunk import CHUNK_PROPERTY


def acknowledge_taken(
    conn: MqttConnection, incoming: Incoming, settings: ClientSettings
) -> Callable[[], None] | None:
    """The worker took `incoming`: acknowledge it now, or return the ack for later.

    Args:
        conn: the connection it came on.
        incoming: the message.
        settings: the client's settings (`session_expiry`, `protocol`).

    Returns:
        None when it was acknowledged now; else the call that acknowledges it, for when
        the application takes its delivery.
    """
    props = incoming.properties
    chunk = settings.protocol == 5 and props.user_property(CHUNK_PROPERTY) is not None
    if settings.session_expiry and incoming.qos and not chunk:
        return functools.partial(conn.ack, incoming)
    conn.ack(incoming)
    return None
