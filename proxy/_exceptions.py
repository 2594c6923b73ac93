"""The proxy's errors (the wire core's own are in :mod:`proxy.protocol._errors`).

Hierarchy::

    ProxyError
    |-- PeerGone          a socket closed or failed
    |-- PeerTimeout       a peer stayed silent inside a packet, or over its CONNECT
    |-- TransferFailed    the gateway did not store or serve a payload (`status`, MQTT `reason`)
    |   |-- PayloadMismatch   it holds another payload than the placeholder names
    |-- ProxyConfigError  settings that cannot work
"""

from __future__ import annotations

UNSPECIFIED_ERROR = 0x80
NOT_AUTHORIZED = 0x87
QUOTA_EXCEEDED = 0x97


class ProxyError(Exception):
    """Base of the proxy's own errors."""


class PeerGone(ProxyError):
    """A socket closed or failed."""


class PeerTimeout(ProxyError):
    """A peer stayed silent inside a packet or over its CONNECT."""


class ProxyConfigError(ProxyError):
    """Settings that cannot work."""


class TransferFailed(ProxyError):
    """The gateway did not store (or serve) a payload.

    Args:
        message: what happened, without payload bytes or credentials.
        status: the gateway's HTTP status, None when it did not answer.
    """

    def __init__(
        self, message: str, status: int | None = None, *, reason: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self._reason = reason

    @property
    def reason(self) -> int:
        """The MQTT 5 reason code for the PUBACK/PUBREC that refuses the message."""
        if self._reason is not None:
            return self._reason
        if self.status in (401, 403):
            return NOT_AUTHORIZED
        if self.status in (413, 429):  # too large; too many at once (the device may retry)
            return QUOTA_EXCEEDED
        return UNSPECIFIED_ERROR


class PayloadMismatch(TransferFailed):
    """The gateway holds another payload under a placeholder's URL than the placeholder
    names (another size or SHA-256): a lie of the placeholder's publisher, found out before
    any byte of it was written to a device, or a store whose bytes changed while they were
    fetched."""
