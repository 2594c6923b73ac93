"""The gateway's own broker connection: discovery adverts and HTTP-initiated publishes.

The only gateway module that imports paho. Connects in the background and keeps
reconnecting; `connected` feeds /readyz.

A PUBLISH the broker refuses must never wedge the link. mosquitto answers a malformed one
(a control character in a property, say) by closing the connection, and paho keeps every
unacknowledged QoS 1/2 message and sends it again after each reconnect: one bad message
would cost the link for good. So every publish is validated against the MQTT string rules
before it is queued (`publish_properties_problem`, the check every route runs first), and a
lost connection fails every message still waiting for its acknowledgement instead of
resending it. That is also what the HTTP publish paths need: their caller withdraws the
stored message and answers 503 when the publish fails, so a later resend would announce a
message that no longer exists.
"""

from __future__ import annotations

import logging
import ssl
import threading
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

# One conversion for the whole project: the client adapter owns the paho mapping.
from client.mqtt import to_paho_properties
from client.protocol import PublishProperties, Topic, publish_properties_problem

log = logging.getLogger("gateway.mqtt")


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool
    username: str | None
    password: str | None

    @classmethod
    def parse(
        cls, url: str, *, username: str | None = None, password: str | None = None
    ) -> BrokerAddress:
        parts = urlsplit(url)
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise ValueError(f"broker URL must be mqtt://HOST:PORT or mqtts://HOST:PORT: {url!r}")
        tls = parts.scheme == "mqtts"
        return cls(
            host=parts.hostname,
            port=parts.port or (8883 if tls else 1883),
            tls=tls,
            username=username or (unquote(parts.username) if parts.username else None),
            password=password or (unquote(parts.password) if parts.password else None),
        )

    def __repr__(self) -> str:  # never show the password
        return f"BrokerAddress({self.host}:{self.port}, tls={self.tls}, user={self.username!r})"


class InvalidPublish(ValueError):
    """A publish that breaks the MQTT rules a broker enforces; refused before it is queued."""


def _publish_problem(
    topic: str, payload: bytes, qos: int, properties: PublishProperties | None
) -> str | None:
    try:
        Topic(topic)
    except ValueError as exc:  # InvalidTopic is a ProtocolError, a ValueError
        return str(exc)
    if qos not in (0, 1, 2):
        return f"qos must be 0, 1 or 2, not {qos!r}"
    if len(payload) > _MAX_PAYLOAD:
        return f"payload of {len(payload)} bytes exceeds MQTT's packet limit"
    return None if properties is None else publish_properties_problem(properties)


_MAX_PAYLOAD = 268_435_455 - 65_535 * 2  # MQTT's remaining-length cap, less the headers


class BrokerConnection:
    """A paho client kept connected in the background."""

    def __init__(
        self,
        address: BrokerAddress,
        *,
        client_id: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.address = address
        self._connected = threading.Event()
        self._client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id or f"offload-gateway-{uuid.uuid4().hex[:12]}",
            protocol=paho.MQTTv5,
        )
        if address.username is not None:
            self._client.username_pw_set(address.username, address.password)
        if address.tls:
            self._client.tls_set_context(ssl.create_default_context(cafile=ca_file))
        self._client.reconnect_delay_set(min_delay=1, max_delay=10)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._on_connected: list[Any] = []

    def on_connected(self, callback: Any) -> None:
        """Call `callback()` (from paho's thread, so quickly) after every (re)connect."""
        self._on_connected.append(callback)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def start(self) -> None:
        self._client.connect_async(self.address.host, self.address.port, keepalive=30)
        self._client.loop_start()

    def stop(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()
        self._connected.clear()

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            log.warning("broker %s refused the connection: %s", self.address, reason)
            return
        log.info("connected to broker %s", self.address)
        self._connected.set()
        for callback in self._on_connected:
            callback()

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any
    ) -> None:
        if self._connected.is_set():
            log.warning("lost broker %s: %s", self.address, reason)
        self._connected.clear()
        dropped = self._fail_unacknowledged()
        if dropped:
            log.warning(
                "%d publish(es) unacknowledged at the disconnect: failed, not resent", dropped
            )

    def _forget(self, mid: int) -> None:
        messages = getattr(self._client, "_out_messages", None)
        mutex = getattr(self._client, "_out_message_mutex", None)
        if messages is not None and mutex is not None:
            with mutex:
                messages.pop(mid, None)

    def _fail_unacknowledged(self) -> int:
        """Take every unacknowledged outgoing message out of paho's session; how many.

        paho has no public call for this: `_out_messages` (guarded by `_out_message_mutex`)
        is the queue `_messages_reconnect_reset` resends from on the next connect. Each
        message's info gets `MQTT_ERR_CONN_LOST`, so `wait_for_publish` raises at once.
        """
        client = self._client
        messages = getattr(client, "_out_messages", None)
        mutex = getattr(client, "_out_message_mutex", None)
        if messages is None or mutex is None:  # a paho without them: nothing we can do
            return 0
        with mutex:
            lost = list(messages.values())
            messages.clear()
            if hasattr(client, "_inflight_messages"):
                client._inflight_messages = 0
        for message in lost:
            message.info.rc = paho.MQTT_ERR_CONN_LOST
            message.info._set_as_published()  # wakes wait_for_publish, which then raises
        return len(lost)

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 1,
        retain: bool = False,
        properties: PublishProperties | None = None,
    ) -> Future[None]:
        """Publish; the future completes when the broker acknowledged (QoS>0) or it was sent."""
        future: Future[None] = Future()
        problem = _publish_problem(topic, payload, qos, properties)
        if problem is not None:  # the broker would disconnect us for it: never queue it
            future.set_exception(InvalidPublish(problem))
            return future
        if not self.connected:
            future.set_exception(ConnectionError(f"not connected to broker {self.address}"))
            return future
        info = self._client.publish(
            topic, payload, qos=qos, retain=retain, properties=to_paho_properties(properties)
        )
        if info.rc != paho.MQTT_ERR_SUCCESS:
            # paho keeps a QoS>0 message it could not send (no connection) for the next
            # connect; our caller is told it failed, so it must never go out later.
            self._forget(info.mid)
            future.set_exception(ConnectionError(f"publish failed: {paho.error_string(info.rc)}"))
            return future

        def wait() -> None:
            outcome: BaseException | None = None
            try:
                info.wait_for_publish(timeout=30)
                if not info.is_published():
                    outcome = TimeoutError("broker did not acknowledge in 30 s")
            except (RuntimeError, ValueError) as exc:
                outcome = ConnectionError(str(exc))
            # The caller may have given up (cancelled) already: settle only a pending future.
            if future.set_running_or_notify_cancel():
                if outcome is None:
                    future.set_result(None)
                else:
                    future.set_exception(outcome)

        threading.Thread(target=wait, daemon=True).start()
        return future
