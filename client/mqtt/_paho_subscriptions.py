"""The subscriptions of the adapter's paho client: sent, restored after a reconnect, acked.

Used only by :mod:`client.mqtt._paho`: a subscription is recorded once and sent again after
every reconnect the broker did not keep it across (:class:`client.mqtt._session.Subscriptions`
decides which); each SUBACK completes the future its SUBSCRIBE returned. Runs on the caller's
thread and on paho's (the restore and the SUBACKs): nothing here blocks.
"""

from __future__ import annotations

from concurrent.futures import Future

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode

from ._acks import Acks, SubscriptionRefused
from ._session import Subscriptions


class PahoSubscriptions:
    """The topic filters one paho client subscribes to, and their SUBACKs as futures.

    Args:
        paho: the client they are sent with.
    """

    def __init__(self, paho: mqtt.Client) -> None:
        self._paho = paho
        self._subscriptions = Subscriptions()
        self._subacks = Acks()

    def subscribe(self, topic_filter: str, qos: int) -> Future[None]:
        """Record `topic_filter` and subscribe now (if connected); done at its SUBACK."""
        self._subscriptions.add(topic_filter, qos)
        return self._send(topic_filter, qos)

    def resubscribe(self, topic_filter: str) -> Future[None]:
        """Subscribe again to a recorded filter (the broker re-sends retained messages)."""
        return self._send(topic_filter, self._subscriptions.qos(topic_filter))

    def unsubscribe(self, topic_filter: str) -> None:
        """Forget `topic_filter` and unsubscribe from it."""
        self._subscriptions.remove(topic_filter)
        self._paho.unsubscribe(topic_filter)

    def restore(self, session_present: bool) -> None:
        """After a CONNACK (paho's thread): send what the broker's session does not hold."""
        for topic_filter, qos in self._subscriptions.to_restore(session_present):
            rc, mid = self._paho.subscribe(topic_filter, qos)
            if rc == MQTTErrorCode.MQTT_ERR_SUCCESS and mid is not None:
                self._subscriptions.sent(mid, topic_filter)
                # Nobody waits on these SUBACKs; registering keeps the mid from lingering.
                self._subacks.register(mid, Future())

    def acknowledged(self, mid: int, reasons: list[ReasonCode]) -> None:
        """A SUBACK (paho's thread): its future done, or failed with the first refusal."""
        failed = [r for r in reasons if r.is_failure]
        self._subscriptions.acknowledged(mid, not failed)
        if failed:
            self._subacks.settle(mid, SubscriptionRefused(str(failed[0])))
        else:
            self._subacks.settle(mid, None)

    def fail_all(self, exc: BaseException) -> None:
        """Fail every SUBACK still awaited (the connection closed)."""
        self._subacks.fail_all(exc)

    def _send(self, topic_filter: str, qos: int) -> Future[None]:
        future: Future[None] = Future()
        rc, mid = self._paho.subscribe(topic_filter, qos)
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            # Not connected: the next CONNACK's restore subscribes everything recorded.
            future.set_result(None)
            return future
        self._subscriptions.sent(mid, topic_filter)
        self._subacks.register(mid, future)
        return future
