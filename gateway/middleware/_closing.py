"""A connection the server closes ends when its peer has taken the answer, not 30 s later.

`transport.close()` leaves a connection open until what is buffered has gone out, and over
TLS until the peer's close_notify has come in too (up to the TLS shutdown timeout, 30 s).
Meanwhile a TLS connection reads, decrypts and discards all the peer sends: a client that
went on sending after its 413 had 11.8 GB taken off it in 12 s. Over plain TCP a peer that
stops reading holds a closed connection for as long as it likes.

So after `close()` the connection is watched, every CLOSE_GRACE seconds, through the
kernel's TCP counters (`TCP_INFO`, Linux), and dropped (`abort()`) when:

- nothing of the answer is left to deliver: the peer has had it all for a grace period
  without closing its side;
- the peer took none of the answer in the last period but sent more: it is not reading
  what it is sent (a flood after a refusal);
- the peer sent more than FLOOD_BYTES in the last period, whatever it took: a client
  waiting for its answer has no more to say, so reading a little to keep the connection
  while it floods does not buy 30 s of decryption;
- the peer took none of the answer, quietly, for the stall limit (the send idle timeout):
  a client that stopped reading.

A slow reader that keeps taking its answer keeps its connection (over TLS, until the TLS
shutdown timeout), so `Connection: close` never cuts an answer short the way an abort a
fixed time after `close()` would. Where the counters cannot be read (not Linux, a Unix
socket) only the stall limit applies.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import termios
from typing import Any

#: Seconds between two looks at a closing connection.
CLOSE_GRACE = 1.0
#: Bytes a peer may send in one such period after the close (see the module).
FLOOD_BYTES = 1 << 20
#: `struct tcp_info` (linux/tcp.h): tcpi_bytes_acked, tcpi_bytes_received (Linux 4.1+).
_COUNTERS = struct.Struct("=QQ")
_COUNTERS_AT = 120
_TCP_INFO_SIZE = _COUNTERS_AT + _COUNTERS.size


def _counters(sock: Any) -> tuple[int, int, int] | None:
    """Bytes of ours the peer has acknowledged, bytes it has sent, and bytes still in the
    kernel's send queue; None where the kernel does not say."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
        queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (AttributeError, OSError, ValueError):
        return None
    if len(info) < _TCP_INFO_SIZE:
        return None
    acked, received = _COUNTERS.unpack_from(info, _COUNTERS_AT)
    return acked, received, struct.unpack("i", queued)[0]


class ClosingTransport(asyncio.Transport):
    """The transport an HTTP protocol is handed: `transport`, whose `close()` is watched
    as the module says. The protocol calls `lost()` from its `connection_lost`."""

    def __init__(
        self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, stall: float
    ) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._stall = stall
        self._watch: asyncio.TimerHandle | None = None
        self._gone = False

    def close(self) -> None:
        self._transport.close()
        if self._watch is None and not self._gone:
            sock = self._transport.get_extra_info("socket")
            self._watch = self._loop.call_later(CLOSE_GRACE, self._look, sock, _counters(sock), 0.0)

    def lost(self) -> None:
        self._gone = True
        if self._watch is not None:
            self._watch.cancel()

    def _look(self, sock: Any, before: tuple[int, int, int] | None, stalled: float) -> None:
        if self._gone:
            return
        now = _counters(sock)
        stalled += CLOSE_GRACE
        if now is not None and before is not None:
            acked, received, queued = now
            if not queued and not self._transport.get_write_buffer_size():
                self._transport.abort()  # the peer has it all: a grace to close was enough
                return
            if received - before[1] > FLOOD_BYTES:
                self._transport.abort()  # floods a connection that is closing
                return
            if acked != before[0]:
                stalled = 0.0  # still taking its answer
            elif received != before[1]:
                self._transport.abort()  # sends on without taking what it is sent
                return
        if stalled >= self._stall:
            self._transport.abort()
            return
        self._watch = self._loop.call_later(CLOSE_GRACE, self._look, sock, now, stalled)

    # The rest is the transport's own.

    def abort(self) -> None:
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self._transport.writelines(list_of_data)

    def write_eof(self) -> None:
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


__all__ = ["CLOSE_GRACE", "ClosingTransport"]
