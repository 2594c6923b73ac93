"""The one place that reaches into paho's private session queue, and why it must.

paho keeps every QoS 1/2 publish it could not finish in `_out_messages` (guarded by
`_out_message_mutex`) and resends them from there on the next connect
(`_messages_reconnect_reset`). That is MQTT's session semantics, which the client wants. The
gateway does not (`resend_unacknowledged=False`): its HTTP caller was already told the
publish failed and the stored message was withdrawn, so a later resend would announce a
message that no longer exists. paho has no public call to drop queued messages, so these two
functions do it, and do nothing on a paho without those attributes. Kept apart so that a
paho upgrade that changes its internals has one small module to check.
"""

from __future__ import annotations

import paho.mqtt.client as mqtt


def forget_outgoing(client: mqtt.Client, mid: int) -> None:
    """Drop one message from paho's resend queue (paho keeps QoS>0 ones it could not send).

    Args:
        client: the paho client.
        mid: the message id `publish` returned.
    """
    messages = getattr(client, "_out_messages", None)
    mutex = getattr(client, "_out_message_mutex", None)
    if messages is not None and mutex is not None:
        with mutex:
            messages.pop(mid, None)


def take_unacknowledged(client: mqtt.Client) -> list[int]:
    """Take every unacknowledged outgoing message out of paho's session; their mids.

    Each message's info gets `MQTT_ERR_CONN_LOST` and is marked published, so a
    `wait_for_publish` on it wakes and raises at once; the caller fails its own futures.

    Args:
        client: the paho client, just disconnected.
    """
    messages = getattr(client, "_out_messages", None)
    mutex = getattr(client, "_out_message_mutex", None)
    if messages is None or mutex is None:  # a paho without them: nothing we can do
        return []
    with mutex:
        lost = list(messages.values())
        messages.clear()
        if hasattr(client, "_inflight_messages"):
            client._inflight_messages = 0
    for message in lost:
        message.info.rc = mqtt.MQTT_ERR_CONN_LOST
        message.info._set_as_published()  # wakes wait_for_publish, which then raises
    return [message.mid for message in lost]
