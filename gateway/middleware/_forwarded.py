"""The client's own address behind a trusted hop: `X-Forwarded-For`, believed only from
`OFFLOAD_TRUSTED_PROXIES`.

Every per-address rule of the gateway (uploads per client address, the failed-login limits,
the logs, uvicorn's access log) keys on the ASGI `client`. Behind offload-proxy or a load
balancer that is the hop's address, shared by every device behind it: one device's failures
or stalled uploads would count against all of them. So, outermost, this middleware puts in
`client` the address the trusted hop forwarded: the right-most entry of `X-Forwarded-For`
that is not itself a trusted hop (each hop appends the address it got the request from;
what lies to the left of a trusted hop's entry was written by whoever sent the request:
anyone).

uvicorn's own handling of the header is turned off (`proxy_headers=False`, gateway/cli.py):
it trusts 127.0.0.1 by default, so any process on the gateway's host could claim any
address. RFC 7239 `Forwarded` is not read: a hop that sets one header could otherwise be
bypassed through the other.

The header is hostile input: its lines are joined as one list (RFC 9110, 5.3), at most
:data:`MAX_HOPS` entries are looked at from the right, and an entry that is not an IP
address (garbage, `unknown`, an RFC 7239 obfuscated name) ends the walk: the hop that wrote
it is taken for the client.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from ..core import IPNetwork

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Entries of `X-Forwarded-For` looked at, from the right: more trusted hops than this in
#: a row are not a deployment, and the walk stops at the last one.
MAX_HOPS = 16
_HEADER = b"x-forwarded-for"


def address(text: str) -> IPAddress | None:
    """An address as a hop writes it: `192.0.2.7`, `2001:db8::1`, `[2001:db8::1]`, with a
    port after `:` (IPv4) or `]:` (IPv6) ignored; None when it is none of these. An
    IPv4-mapped IPv6 address is its IPv4 address (a dual-stack socket's peer)."""
    text = text.strip()
    if text.startswith("["):
        text, bracket, _ = text[1:].partition("]")
        if not bracket:
            return None
    elif text.count(":") == 1:  # IPv4 with a port
        text = text.partition(":")[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def client_address(peer: str, forwarded: Sequence[str], trusted: Iterable[IPNetwork]) -> str:
    """The client's address: `peer`, or what trusted hops forwarded (see the module).

    Args:
        peer: the connection's peer address.
        forwarded: the `X-Forwarded-For` header lines, in order.
        trusted: the networks whose hops are believed.
    """
    networks = tuple(trusted)

    def believed(ip: IPAddress | None) -> bool:
        return ip is not None and any(ip in network for network in networks)

    current = address(peer)
    if not believed(current):
        return peer
    entries = [e for line in forwarded for e in line.split(",")][-MAX_HOPS:]
    for entry in reversed(entries):
        hop = address(entry)
        if hop is None:
            break  # the trusted hop that wrote it is the client
        current = hop
        if not believed(hop):
            break
    return str(current)


class TrustedProxies:
    """ASGI middleware: `client` becomes the address trusted hops forwarded.

    Args:
        app: the application to wrap.
        networks: the hops whose `X-Forwarded-For` is believed.
    """

    def __init__(self, app: ASGIApp, *, networks: Sequence[IPNetwork]) -> None:
        self.app = app
        self.networks = tuple(networks)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        if scope["type"] == "http" and client:
            lines = [v.decode("latin-1") for k, v in scope["headers"] if k.lower() == _HEADER]
            host = client_address(client[0], lines, self.networks)
            if host != client[0]:
                # In place, as uvicorn's own proxy-headers middleware does: its access log
                # reads the scope it made, and names the device then, refusals included (a
                # copy left it naming the hop for every request).
                scope["client"] = (host, 0)
        await self.app(scope, receive, send)
