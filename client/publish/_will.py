"""The Will message: sent by the broker when the client vanishes, offloaded when too large.

A Will travels inside CONNECT, so a Will larger than the broker's Maximum Packet Size makes
the broker refuse the connection itself; and the broker's limit is only known from CONNACK.
So a client with a Will (`will_topic`) connects first without one, learns the limit, and
then connects again with the Will that fits: the payload itself, or, when it is larger than
the broker takes, a placeholder pointing at the payload uploaded to the gateway first (the
same placeholder a large publish sends: a consumer resolves it like any other). Nothing else
happens between the two connections (:meth:`client.Client.connect` has not returned), so the
application never runs without its Will.

The uploaded payload lives as long as the gateway keeps payloads (`OFFLOAD_DEFAULT_TTL`, 7
days, or the Will's Message Expiry Interval): a client connected longer than that leaves a
Will whose payload is gone when it fires; every :meth:`~client.Client.connect` uploads anew.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..config._settings import ClientSettings
from ..core._exceptions import ConfigError, MessageTooLarge
from ..mqtt._paho import MqttConnection
from ..protocol import PublishProperties, Topic
from ..protocol._size import publish_packet_size
from ._publish import Publisher

log = logging.getLogger("client")

#: CONNECT's own bytes beside the Will and the login: fixed header, protocol name and
#: level, flags, keep-alive, the connect properties (Receive Maximum, Session Expiry).
_CONNECT_OVERHEAD = 64


@dataclass(frozen=True, slots=True)
class Will:
    """The Will the settings ask for."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    delay: int

    @classmethod
    def from_settings(cls, s: ClientSettings) -> Will | None:
        """The Will in `s`, None without `will_topic`.

        Raises:
            ConfigError: a Will setting without a topic, an invalid topic, QoS or delay.
        """
        if s.will_topic is None:
            if s.will_payload is not None or s.will_retain or s.will_qos or s.will_delay:
                raise ConfigError(
                    "will_payload, will_qos, will_retain and will_delay need will_topic"
                )
            return None
        try:
            Topic(s.will_topic)
        except ValueError as exc:
            raise ConfigError(f"will_topic: {exc}") from exc
        if s.will_qos not in (0, 1, 2):
            raise ConfigError(f"will_qos must be 0, 1 or 2, got {s.will_qos}")
        if not 0 <= s.will_delay <= 0xFFFFFFFF:
            raise ConfigError(f"will_delay must be 0-4294967295 seconds, got {s.will_delay}")
        payload = s.will_payload or b""
        data = payload.encode() if isinstance(payload, str) else bytes(payload)
        return cls(s.will_topic, data, s.will_qos, s.will_retain, s.will_delay)

    def connect_size(
        self, payload_len: int, props: PublishProperties | None, s: ClientSettings
    ) -> int:
        """A bound on the CONNECT that carries this Will with a payload of `payload_len`."""
        will = publish_packet_size(
            self.topic, payload_len, qos=0, properties=props, protocol=s.protocol
        )
        login = sum(len((v or "").encode()) + 2 for v in (s.client_id, s.username, s.password))
        return will + login + _CONNECT_OVERHEAD


def arm(
    will: Will, conn: MqttConnection, publisher: Publisher, s: ClientSettings, timeout: float
) -> None:
    """Set the Will that fits the broker learnt from this connection's CONNACK, then connect
    again so that the broker holds it.

    Raises:
        ConfigError: the Will's topic is encrypted and no endpoint takes it.
        MessageTooLarge: the Will does not fit and cannot be offloaded (no endpoint, or
            even its placeholder is too large).
        UploadError: the upload failed.
        ConnectionFailed: the second connection failed.
    """
    limit = publisher.max_packet_size
    payload, props = will.payload, None
    size = will.connect_size(len(payload), props, s)
    # An encrypted topic's Will is offloaded whatever its size: the broker never holds it in
    # the clear (docs/encryption.md).
    encrypted = publisher.encrypts(will.topic)
    if size > limit or encrypted:
        placeholder = publisher.upload_placeholder(
            will.topic, payload, qos=will.qos, properties=None
        )
        if placeholder is None and encrypted:
            raise ConfigError(
                f"the Will's topic {will.topic!r} is encrypted (encrypt_to) and no endpoint "
                "takes its payload: a Will is never sent in the clear"
            )
        if placeholder is None:
            raise MessageTooLarge(size, limit, "the Will does not fit and no endpoint takes it")
        payload, props, url = placeholder
        size = will.connect_size(len(payload), props, s)
        if size > limit:
            raise MessageTooLarge(size, limit, "even the Will's placeholder does not fit")
        log.info("Will of %d bytes offloaded to %s", len(will.payload), url)
    conn.set_will(
        will.topic, payload, qos=will.qos, retain=will.retain, properties=props, delay=will.delay
    )
    conn.reconnect(timeout)
