"""`offload-proxy`: an MQTT proxy that lets unmodified clients send and receive messages of
any size through a broker that caps packet size.

Clients connect to the proxy instead of the broker; each gets its own broker connection,
and packets are copied byte for byte both ways, except that a PUBLISH over the broker's
limit is streamed to the gateway and replaced by the library's placeholder, and a
placeholder delivered to a client that does not resolve placeholders itself is replaced by
its payload. docs/proxy.md says when to use it and how.

The wire logic is the sans-I/O core :mod:`proxy.protocol`; the sockets are asyncio.
"""

from ._exceptions import (
    PeerGone,
    PeerTimeout,
    ProxyConfigError,
    ProxyError,
    TransferFailed,
)
from ._server import Proxy
from ._settings import ProxySettings

__all__ = [
    "PeerGone",
    "PeerTimeout",
    "Proxy",
    "ProxyConfigError",
    "ProxyError",
    "ProxySettings",
    "TransferFailed",
]
