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
IMPLEMENTATION_SPECIFIC = 0x83
NOT_AUTHORIZED = 0x87
QUOTA_EXCEEDED = 0x97
#: Refusals a resend of the same PUBLISH cannot change: a 3.1.1 client is answered (a plain
#: PUBACK/PUBREC, the message dropped) rather than disconnected to resend it for ever.
FINAL_REASONS = frozenset({IMPLEMENTATION_SPECIFIC, NOT_AUTHORIZED})


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
        """The MQTT 5 reason code for the PUBACK/PUBREC that refuses the message.

        0x80 only where a resend may succeed (no answer, 408, 5xx); 0x97 for 429 (too
        many at once: later) and a 413 naming the account's stored-bytes quota (given by
        the caller: deleting payloads makes room); 0x87 for a login or access the gateway
        refused (401, 403); 0x83 for any other refusal of the request itself (413: over
        the gateway's size limit, 431: properties over its head limit, 400), which the same
        PUBLISH always gets. 0x95 (Packet too large) is no PUBACK/PUBREC reason code in MQTT 5.
        """
        if self._reason is not None:
            return self._reason
        status = self.status
        if status in (401, 403):
            return NOT_AUTHORIZED
        if status == 429:
            return QUOTA_EXCEEDED
        if status is not None and 400 <= status < 500 and status != 408:
            return IMPLEMENTATION_SPECIFIC
        return UNSPECIFIED_ERROR


class CutOff(TransferFailed):
    """A gateway or store answered a fetch's request (a HEAD, a payload GET, the gateway's
    record) slower than the fetches' pace (`fetch_deadline`, then `fetch_min_rate`): its
    connection was shut down (counted in `offload_proxy_fetches_cut_off`)."""


class PayloadMismatch(TransferFailed):
    """The gateway holds another payload under a placeholder's URL than the placeholder
    names (another size or SHA-256): a lie of the placeholder's publisher, found out before
    any byte of it was written to a device, or a store whose bytes changed while they were
    fetched."""
