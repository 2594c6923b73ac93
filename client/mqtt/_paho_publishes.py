"""The publishes of the adapter's paho client: checked, queued, and their acks as futures.

Used only by :mod:`client.mqtt._paho`. Every publish is checked against the MQTT rules a
broker enforces before it is queued (:func:`client.mqtt._acks.publish_problem`); its future
completes when paho wrote it (QoS 0) or the broker acknowledged it (QoS 1/2). What happens to
those unacknowledged when the connection drops is the owner's `resend` choice. Runs on the
caller's thread and on paho's (the acks, the disconnect): nothing here blocks.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode

from ..core._exceptions import ConnectionFailed, PublishRejected
from ..protocol import PublishProperties
from ._acks import Acks, InvalidPublish, Refused, publish_problem
from ._paho_session import forget_outgoing, take_unacknowledged
from ._props import to_paho_properties

log = logging.getLogger("client.mqtt")


class PahoPublishes:
    """The PUBLISHes one paho client sends, and their acknowledgements as futures.

    Args:
        paho: the client they are sent with.
        protocol: 5 (properties sent) or 4.
        resend: keep unacknowledged QoS 1/2 publishes for the next connection (MQTT's
            session semantics) instead of failing them at once.
    """

    def __init__(self, paho: mqtt.Client, *, protocol: int, resend: bool) -> None:
        self._paho = paho
        self._protocol = protocol
        self._resend = resend
        self._acks = Acks()

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        properties: PublishProperties | None,
        *,
        connected: bool,
        where: str,
    ) -> Future[None]:
        """Queue one PUBLISH (see :meth:`client.mqtt._paho.MqttConnection.publish`).

        Args:
            topic: topic name.
            payload: the bytes.
            qos: 0, 1 or 2.
            retain: retain flag.
            properties: MQTT 5 properties.
            connected: whether the connection is up now.
            where: the broker, for the error of a publish refused while disconnected.
        """
        future: Future[None] = Future()
        problem = publish_problem(topic, payload, qos, properties)
        if problem is not None:
            future.set_exception(InvalidPublish(problem))
            return future
        if not self._resend and not connected:
            future.set_exception(ConnectionFailed(f"not connected to broker {where}"))
            return future
        paho_props = to_paho_properties(properties) if self._protocol == 5 else None
        info = self._paho.publish(topic, payload, qos, retain, paho_props)
        if info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN and (qos == 0 or not self._resend):
            # QoS 0 is not kept for a reconnect by paho: it is simply lost, so say so; a
            # QoS>0 one paho keeps must not go out later when the caller was told it failed.
            forget_outgoing(self._paho, info.mid)
            future.set_exception(ConnectionFailed(f"not connected: publish to {topic!r} not sent"))
            return future
        if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            forget_outgoing(self._paho, info.mid)
            future.set_exception(PublishRejected(topic, mqtt.error_string(info.rc)))
            return future
        self._acks.register(info.mid, future, qos0=qos == 0, topic=topic)
        return future

    def acknowledged(self, mid: int, reason: ReasonCode) -> None:
        """paho wrote a QoS 0 publish or the broker acked one (paho's thread)."""
        if reason.is_failure:
            self._acks.settle(mid, Refused(str(reason)))  # names the topic registered
        else:
            self._acks.settle(mid, None)

    def disconnected(self) -> None:
        """The connection dropped (paho's thread): fail what will never be delivered.

        QoS 0 messages still queued are lost (at most once): say so instead of leaving
        their futures pending for ever; without `resend`, the unacknowledged QoS 1/2 too.
        """
        lost = self._acks.fail_unwritten(
            ConnectionFailed("connection lost before the QoS 0 message was written")
        )
        if lost:
            log.info("%d QoS 0 message(s) not written before the disconnect: lost", lost)
        if not self._resend:
            dropped = self._fail_unacknowledged()
            if dropped:
                log.warning(
                    "%d publish(es) unacknowledged at the disconnect: failed, not resent", dropped
                )

    def fail_all(self, exc: BaseException) -> None:
        """Fail every acknowledgement still awaited (the connection closed)."""
        self._acks.fail_all(exc)

    def _fail_unacknowledged(self) -> int:
        """Fail every unacknowledged publish, taken out of paho's session; how many."""
        lost = take_unacknowledged(self._paho)
        for mid in lost:
            self._acks.settle(mid, ConnectionFailed("connection lost before the acknowledgement"))
        return len(lost)
