"""Whether a client has left while nothing reads its socket.

While a PUBLISH is offloaded the proxy reads nothing else of that client (its packets keep
their order), so a client that gives up waiting for its PUBACK and closes is not seen by a
read: its message would be stored and published when the gateway answers, long after it
left (issue 51: a frozen gateway, mosquitto_pub killed after 119 s, the placeholder
published when the gateway resumed). The kernel knows, though: the connection has left
ESTABLISHED once the client's FIN or RST came. :func:`departure` looks, every
:data:`POLL` seconds, for as long as such an upload lasts.

It knows only once the FIN came: a client that dies with part of its PUBLISH unsent (the
proxy stopped reading it, the upload's channel full while the gateway takes nothing) has
its FIN sent after that part, which the proxy reads only once the gateway takes the upload
again. Such a departure shows at the upload's end, so :func:`left` is looked at once more
before anything is published for the client (:func:`proxy._inbound._unless_left`).
"""

from __future__ import annotations

import asyncio
import socket

#: Seconds between two looks at a client's connection while its upload waits.
POLL = 0.25
#: `tcpi_state`, the first byte of Linux's `struct tcp_info`: TCP_ESTABLISHED.
_ESTABLISHED = 1


def left(writer: asyncio.StreamWriter) -> bool:
    """Whether the client of `writer` has closed or reset its connection.

    Where the kernel does not say (no `TCP_INFO`: not Linux, not TCP), only a transport
    already closed counts.
    """
    if writer.transport.is_closing():
        return True
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "TCP_INFO"):
        return False
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)
    except OSError:  # not a TCP socket (a WebSocket bridge's), or already closed
        return bool(sock.fileno() == -1)
    return bool(info) and info[0] != _ESTABLISHED


async def departure(writer: asyncio.StreamWriter) -> None:
    """Return once the client of `writer` has left (:func:`left`), looked at every
    :data:`POLL` seconds."""
    while not left(writer):
        await asyncio.sleep(POLL)
