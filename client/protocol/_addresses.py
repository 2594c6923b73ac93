"""What a peer's address counts as, for every share kept per address.

A share per address (uploads, fetches, connections, failed logins) is only a bound if one
peer cannot show up as many addresses. An IPv6 subscriber is routed a whole prefix: a home,
a device or a cloud instance holds a /64, 2^64 addresses to rotate through. So an IPv6
address counts by its /64, as HAProxy's `ipv6_mask` and nginx's `limit_req` setups
recommend; an IPv4-mapped IPv6 address (a dual-stack socket's peer) is its IPv4 address.
The offload-proxy and the gateway key their shares with the same function.
"""

from __future__ import annotations

import functools
import ipaddress

#: An IPv6 address counts by this prefix: what one subscriber (a home, a device) gets.
IPV6_SHARE_PREFIX = 64


@functools.lru_cache(maxsize=4096)  # parsed for every share a connection takes: once each
def address_key(address: str) -> str:
    """What an address's share is counted under: an IPv4 address itself, an IPv6 address's
    /64 (anything else, as it is).

    Args:
        address: a peer's address as a socket or a trusted hop gives it.
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_SHARE_PREFIX), strict=False))
    return address


__all__ = ["IPV6_SHARE_PREFIX", "address_key"]
