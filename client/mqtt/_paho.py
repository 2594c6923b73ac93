"""The project's one MQTT adapter: the module that owns the paho client.

Used by :class:`client.Client` (which takes one as `connection=`, as httpx takes a
`transport=`) and by the gateway's broker link. paho's callbacks run on its network thread and
must never block it (a blocked loop thread cannot read the PUBACK a publisher waits for: the
re-entrancy deadlock of the reference notes). So every callback here only converts and hands
over: received messages go to the message handler (it must be quick, e.g. a queue put),
PUBACK / SUBACK complete `concurrent.futures.Future` objects from paho's `on_publish` /
`on_subscribe` (no thread waits per publish), and CONNACK updates the Maximum Packet Size. No
paho type leaves this module.

Every publish is checked against the MQTT rules a broker enforces before it is queued: a
broker closes the connection over a malformed PUBLISH, and paho would resend it after every
reconnect. What happens to unacknowledged QoS 1/2 publishes when the connection drops is the
owner's choice (`resend_unacknowledged`): the client keeps MQTT's session semantics; the
gateway fails them at once, since its HTTP caller withdraws the stored message and answers
503, so a later resend would announce a message that no longer exists (paho has no public
call for that: `_paho_session` reaches into its queue).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from ..core._exceptions import ConnectionFailed
from ..protocol import PublishProperties
from ._acks import InOrder
from ._broker import BrokerUrl
from ._paho_publishes import PahoPublishes
from ._paho_setup import connect_properties, linger, new_paho_client
from ._paho_subscriptions import PahoSubscriptions
from ._props import from_paho_properties, to_paho_properties
from ._session import session_flags
from ._tls import TlsFiles, handshake_refusal

log = logging.getLogger("client.mqtt")

#: Seconds `close()` waits at most for the broker to read what was sent and close its side.
CLOSE_LINGER = 1.0


@dataclass(frozen=True, slots=True)
class Incoming:
    """A PUBLISH received from the broker, already in the project's own types."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: PublishProperties
    #: Packet id and connection number, for :meth:`MqttConnection.ack` (QoS 1/2 only).
    mid: int = 0
    session: int = 0


class MqttConnection:
    """A paho client on its own loop thread, with reconnect and restored subscriptions.

    Args:
        broker: where to connect, with credentials and TLS choice (a URL or parsed).
        on_message: called on paho's thread for every PUBLISH; must not block. May be set
            later with :meth:`set_message_handler` (a :class:`client.Client` does).
        on_connect: called on paho's thread after every successful (re)connect; more with
            :meth:`on_connected`.
        client_id: MQTT client id; empty lets the broker assign one (MQTT 5).
        protocol: 5 for MQTT 5, 4 for MQTT 3.1.1.
        keepalive: keep-alive seconds.
        ca_file: CA bundle (PEM) to verify an `mqtts://` broker; None: the system's.
        tls: CA and client certificate (:class:`client.mqtt._tls.TlsFiles`), instead of
            `ca_file`; a file that cannot be used is a :class:`ConfigError` here.
        websocket_headers: extra headers of the upgrade request for a `ws[s]://` broker.
        resend_unacknowledged: True (MQTT's session semantics): a QoS 1/2 publish still
            unacknowledged when the connection drops is sent again after the reconnect, and
            one made while disconnected waits for it. False: both fail with
            :class:`ConnectionFailed` at once and are never sent later.
        receive_maximum: None (paho's way): every QoS 1/2 message received is acknowledged
            at once, so a publisher decides how many arrive. A number: each is acknowledged
            only when the owner calls :meth:`ack`, and (MQTT 5) the broker is asked to hold
            back beyond that many unacknowledged ones (Receive Maximum, 1-65535): flow
            control, so a flood waits at the broker instead of in this process's memory.
        session_expiry: 0 (default): a clean session on every connect. Seconds: a
            persistent session (:mod:`client.mqtt._session`; needs `client_id`): the broker
            keeps subscriptions and queues QoS 1/2 messages for that long after a
            disconnect, and the subscriptions it kept are not sent again.
    """

    def __init__(
        self,
        broker: BrokerUrl | str,
        *,
        on_message: Callable[[Incoming], None] | None = None,
        on_connect: Callable[[], None] | None = None,
        client_id: str = "",
        protocol: int = 5,
        keepalive: int = 30,
        ca_file: str | None = None,
        tls: TlsFiles | None = None,
        websocket_headers: Mapping[str, str] | None = None,
        resend_unacknowledged: bool = True,
        receive_maximum: int | None = None,
        session_expiry: int = 0,
    ) -> None:
        session = session_flags(session_expiry, client_id)
        self._clean = session.clean
        #: CONNACK's Session Present flag of the latest connection.
        self.session_present = False
        self.broker = BrokerUrl.parse(broker) if isinstance(broker, str) else broker
        self._on_message_cb = on_message
        self._connect_callbacks: list[Callable[[], None]] = []
        if on_connect is not None:
            self._connect_callbacks.append(on_connect)
        self.protocol = protocol
        self._keepalive = keepalive
        self._connected = threading.Event()
        self._connack_error: ConnectionFailed | None = None
        self._first = threading.Event()
        self._caller_waits = False  # connect(): the caller gets the first refusal raised
        #: Maximum Packet Size from the latest CONNACK, None when the broker stated none.
        self.max_packet_size: int | None = None
        #: Incremented on every successful CONNACK.
        self.connections = 0
        self._paho = new_paho_client(
            self.broker,
            client_id=client_id,
            protocol=protocol,
            clean=session.clean,
            tls=tls,
            ca_file=ca_file,
            websocket_headers=websocket_headers,
        )
        self._publishes = PahoPublishes(self._paho, protocol=protocol, resend=resend_unacknowledged)
        self._subscriptions = PahoSubscriptions(self._paho)
        self._paho.on_connect = self._on_connect
        self._paho.on_disconnect = self._on_disconnect
        self._paho.on_message = self._on_message
        self._paho.on_publish = self._on_publish
        self._paho.on_subscribe = self._on_subscribe
        self._connect_properties = connect_properties(protocol, session.expiry, receive_maximum)
        self._manual_ack = receive_maximum is not None
        self._in_order = InOrder(self._paho.ack)
        if self._manual_ack:
            self._paho.manual_ack_set(True)
        self._closing = False
        self._paho.on_socket_close = self._on_socket_close

    def set_will(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int,
        retain: bool,
        properties: PublishProperties | None,
        delay: int = 0,
    ) -> None:
        """The Will every CONNECT from now on carries (see :mod:`client.publish._will`).

        Args:
            topic: the Will's topic.
            payload: its bytes (already known to fit).
            qos: its QoS.
            retain: its retain flag.
            properties: MQTT 5 properties of the Will message.
            delay: MQTT 5 Will Delay Interval, seconds (0: none).
        """
        props = None
        if self.protocol == 5:
            props = to_paho_properties(properties, PacketTypes.WILLMESSAGE)
            if delay:
                props = props or Properties(PacketTypes.WILLMESSAGE)  # type: ignore[no-untyped-call]
                props.WillDelayInterval = delay
        self._paho.will_set(topic, payload, qos, retain, props)

    def reconnect(self, timeout: float = 10.0) -> None:
        """End this connection normally and connect again (a new CONNECT: e.g. a new Will).

        Unacknowledged QoS 1/2 publishes stay in paho's session and are sent again.

        Raises:
            ConnectionFailed: as for :meth:`connect`.
        """
        self._paho.disconnect()
        self._paho.loop_stop()
        self._connected.clear()
        self._first.clear()
        self._connack_error = None
        self.connect(timeout)

    def set_message_handler(self, handler: Callable[[Incoming], None]) -> None:
        """Where received PUBLISHes go (paho's thread: the handler must not block)."""
        self._on_message_cb = handler

    def on_connected(self, callback: Callable[[], None]) -> None:
        """Also call `callback()` (from paho's thread, so quickly) after every (re)connect.

        :meth:`connect` returns only after the callbacks of the first connection ran.
        """
        self._connect_callbacks.append(callback)

    # -- lifecycle -------------------------------------------------------------------------

    def connect(self, timeout: float = 10.0) -> None:
        """Connect and wait for CONNACK.

        Args:
            timeout: seconds to wait for the broker's CONNACK.

        Raises:
            ConnectionFailed: unreachable, refused, or no CONNACK in time.
        """
        where = f"{self.broker.host}:{self.broker.port}"
        self._closing = False  # connected again after a close(): acknowledge again
        if self.broker.tls:  # until the first CONNACK: a refused handshake fails at once
            self._paho.on_log = self._on_handshake_log
        self._caller_waits = True
        try:
            if self.protocol == 5:
                self._paho.connect(
                    self.broker.host,
                    self.broker.port,
                    self._keepalive,
                    clean_start=self._clean,
                    properties=self._connect_properties,
                )
            else:
                self._paho.connect(self.broker.host, self.broker.port, self._keepalive)
        except (OSError, ValueError) as exc:
            self._paho.on_log = None
            refusal = handshake_refusal(exc)
            detail = f"TLS handshake refused: {refusal}" if refusal else str(exc)
            raise ConnectionFailed(f"cannot connect to {where}: {detail}") from exc
        self._paho.loop_start()
        first = self._first.wait(timeout)
        self._paho.on_log = None  # paho formats every log line while one is set
        if not first:
            self.close()
            raise ConnectionFailed(f"no CONNACK from {where} within {timeout}s")
        if self._connack_error is not None:
            self.close()
            raise self._connack_error

    def start(self) -> None:
        """Connect in the background and keep reconnecting (a server's link: never raises)."""
        self._paho.connect_async(
            self.broker.host,
            self.broker.port,
            self._keepalive,
            clean_start=self._clean if self.protocol == 5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
            properties=self._connect_properties,
        )
        self._paho.loop_start()

    def close(self) -> None:
        """Disconnect and stop the loop thread; pending acks fail with ConnectionFailed.

        The connection ends with a lingering close (`_paho_setup.linger`): at most `CLOSE_LINGER`
        seconds for the broker to read what was sent, so nothing written is lost.
        """
        self._closing = True
        self._paho.disconnect()
        self._paho.loop_stop()
        self._connected.clear()
        closed = ConnectionFailed("connection closed")
        self._publishes.fail_all(closed)
        self._subscriptions.fail_all(closed)

    def ack(self, incoming: Incoming) -> None:
        """Acknowledge a QoS 1/2 message (with `receive_maximum` set; else a no-op).

        Lets the broker send one more. The PUBACKs (PUBRECs) go out in the order their
        PUBLISHes came (MQTT 5 4.6.0-2, -3): one made before an earlier message's waits for
        it (:attr:`ack_backlog` counts the messages not acknowledged yet). A message from an
        earlier connection is not
        acknowledged: its session ended with it (clean start), and its packet id may
        belong to a message of this connection (a persistent session's broker sends it
        again instead). Nothing is acknowledged once :meth:`close` began: what the
        application did not get stays with the broker's session. Thread-safe, never blocks.
        """
        if self._closing:
            return
        if self._manual_ack and incoming.qos:
            self._in_order.made(incoming.session, incoming.mid)

    @property
    def ack_backlog(self) -> int:
        """QoS 1/2 messages of this connection not acknowledged to the broker yet (their
        acknowledgement not made, or made and waiting for an earlier one's)."""
        return self._in_order.backlog

    @property
    def connected(self) -> bool:
        """Whether the broker accepted the connection and it has not dropped since."""
        return self._connected.is_set()

    def wait_connected(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a connection; whether there is one."""
        return self._connected.wait(timeout)

    # -- operations ------------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 0,
        retain: bool = False,
        properties: PublishProperties | None = None,
    ) -> Future[None]:
        """Queue one PUBLISH; the future completes when it is written (QoS 0) or acked.

        A QoS 0 PUBLISH still unwritten when the connection drops fails with
        :class:`ConnectionFailed` (paho discards it: at most once).

        Args:
            topic: topic name.
            payload: the bytes, already known to fit the broker's limit.
            qos: 0, 1 or 2.
            retain: retain flag.
            properties: MQTT 5 properties (ignored for 3.1.1 by the caller's choice).

        The future fails with :class:`InvalidPublish` (nothing queued) for a PUBLISH the
        broker would disconnect us for, :class:`PublishRejected` for a failure reason code,
        and :class:`ConnectionFailed` when it cannot be delivered (see
        `resend_unacknowledged`).
        """
        return self._publishes.publish(
            topic,
            payload,
            qos,
            retain,
            properties,
            connected=self.connected,
            where=str(self.broker),
        )

    def subscribe(self, topic_filter: str, qos: int = 1) -> Future[None]:
        """Subscribe now (if connected) and again after every reconnect.

        Args:
            topic_filter: MQTT topic filter.
            qos: maximum QoS.
        """
        return self._subscriptions.subscribe(topic_filter, qos)

    def resubscribe(self, topic_filter: str) -> Future[None]:
        """Subscribe again to an existing subscription (the broker re-sends retained)."""
        return self._subscriptions.resubscribe(topic_filter)

    def unsubscribe(self, topic_filter: str) -> None:
        """Stop receiving `topic_filter`, also after reconnects."""
        self._subscriptions.unsubscribe(topic_filter)

    # -- paho callbacks (paho's thread: never block) --------------------------------------

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: Any,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason.is_failure:
            # A refusal connect() raises is the caller's to report (the CLI: one line).
            raised = self._caller_waits and not self._first.is_set()
            log.log(
                logging.INFO if raised else logging.WARNING,
                "broker %s refused the connection: %s",
                self.broker,
                reason,
            )
            self._connack_error = ConnectionFailed(f"broker refused the connection: {reason}")
            self._first.set()
            return
        size = getattr(properties, "MaximumPacketSize", None) if properties else None
        self.max_packet_size = int(size) if size else None
        self.connections += 1
        # A clean session never finds one present (some brokers set the flag regardless).
        self.session_present = not self._clean and bool(getattr(flags, "session_present", False))
        log.info(
            "connected to broker %s (Maximum Packet Size %s%s)",
            self.broker,
            self.max_packet_size,
            ", session resumed" if self.session_present else "",
        )
        self._subscriptions.restore(self.session_present)
        self._connected.set()
        for callback in list(self._connect_callbacks):
            try:
                callback()
            except Exception:  # paho would stop its loop thread on an escaping exception
                log.exception("on_connected callback failed")
        # After the callbacks: connect() returns only once they ran (the client's discovery
        # wait starts in one; a publish right after connect() must not find it unstarted).
        self._first.set()

    def _on_disconnect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: Any,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if self._connected.is_set():
            log.info("lost broker %s: %s", self.broker, reason)
        self._connected.clear()
        self._publishes.disconnected()

    def _on_handshake_log(self, client: mqtt.Client, userdata: Any, level: int, buf: str) -> None:
        # Under TLS 1.3 a broker checks the client certificate after the client finished its
        # handshake: the refusal is an alert on the first read, which paho only logs before
        # reconnecting for ever. Turn it into connect()'s error.
        if level != mqtt.MQTT_LOG_ERR or self._first.is_set():
            return
        refusal = handshake_refusal(buf)
        if refusal is not None:
            where = f"{self.broker.host}:{self.broker.port}"
            self._connack_error = ConnectionFailed(f"TLS handshake with {where} refused: {refusal}")
            self._first.set()

    def _on_socket_close(self, client: mqtt.Client, userdata: Any, sock: object) -> None:
        if self._closing:  # our DISCONNECT was written; a dropped link has nothing to save
            linger(sock, CLOSE_LINGER)

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        # paho re-raises a callback's exception and its loop thread dies with it: one odd
        # message would stop the client for good. Nothing may leave this method.
        # With manual acknowledgement, a message not handed over is acknowledged here: an
        # unacknowledged one would hold a place of the broker's window for good. Each is
        # acknowledged in the order they came, whenever its acknowledgement is made (_acks).
        if self._manual_ack and msg.qos:
            self._in_order.received(self.connections, msg.mid, msg.qos)
        handler = self._on_message_cb
        if handler is None:
            self._ack_now(msg)
            return
        try:
            incoming = Incoming(
                msg.topic,
                bytes(msg.payload),
                msg.qos,
                bool(msg.retain),
                from_paho_properties(getattr(msg, "properties", None)),
                msg.mid,
                self.connections,
            )
        except (UnicodeDecodeError, ValueError, TypeError):
            log.warning("dropped a PUBLISH with an undecodable topic or properties")
            self._ack_now(msg)
            return
        try:
            handler(incoming)
        except Exception:
            log.exception("dropped a PUBLISH on %r that could not be handed over", incoming.topic)
            self.ack(incoming)

    def _ack_now(self, msg: mqtt.MQTTMessage) -> None:
        if self._manual_ack and msg.qos:
            self._in_order.made(self.connections, msg.mid)

    def _on_publish(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        self._publishes.acknowledged(mid, reason)

    def _on_subscribe(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reasons: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        self._subscriptions.acknowledged(mid, reasons)
