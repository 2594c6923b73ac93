"""The core's own errors (a leaf: nothing from the adapter or the network).

Hierarchy::

    ProxyProtocolError          bytes that break MQTT; carries the MQTT 5 reason code
    |-- MalformedPacket         0x81: a varint, length, string or property that cannot be read
    |-- PacketTooLarge          0x95: more than a limit the proxy or a peer set

    BadProxyHeader              a PROXY protocol header (a load balancer's) that cannot be
                                read, or none where one is required; not MQTT: no reason code
"""

from __future__ import annotations

MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
PACKET_TOO_LARGE = 0x95


class ProxyProtocolError(Exception):
    """A peer sent bytes the proxy refuses; `reason` is the MQTT 5 reason code to send."""

    reason = PROTOCOL_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class MalformedPacket(ProxyProtocolError):
    """A packet that cannot be decoded (MQTT 5 reason 0x81)."""

    reason = MALFORMED_PACKET


class PacketTooLarge(ProxyProtocolError):
    """A packet, or a part the proxy must hold, larger than its limit (reason 0x95)."""

    reason = PACKET_TOO_LARGE


class BadProxyHeader(Exception):
    """A connection's first bytes are not the PROXY protocol header they must be (or are one
    that breaks the specification)."""
