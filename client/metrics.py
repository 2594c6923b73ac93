"""What the gateway's and the proxy's Prometheus metrics share.

Public (`client.metrics`), for the processes built on the library (the gateway, the proxy),
as :mod:`client.malloc` and :mod:`client.tracing` are: the library itself keeps no metrics,
and `prometheus_client` is the servers' dependency, imported here only when
:func:`exposition` is called.

* :func:`exemplar`: the exemplar a latency observation carries, naming its sampled trace;
* :func:`exposition`: the encoder a scraper's `Accept` asks for (OpenMetrics shows the
  exemplars, the Prometheus text format does not);
* :func:`certificate_expiry`: when a certificate chain a server presents stops being valid
  (`offload_tls_certificate_expiry_timestamp_seconds`, which an alert watches).


* :func:`serve`: the small HTTP port that serves them, apart from any API: exemplars name
  other requests' trace ids, for the operator's eyes only (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
from typing import TYPE_CHECKING

from .protocol import address_key as _address_key

if TYPE_CHECKING:  # annotations only: the module's namespace is what __all__ lists
    import socket
    from collections.abc import Callable
    from pathlib import Path

    from prometheus_client import CollectorRegistry

    from .protocol import TraceContext

__all__ = ["OPENMETRICS", "certificate_expiry", "exemplar", "exposition", "serve"]

#: The OpenMetrics version served to a scraper that asks for OpenMetrics.
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def exemplar(context: TraceContext | None) -> dict[str, str] | None:
    """A Prometheus exemplar for a latency observation: the sampled trace it belongs to."""
    if context is None or not context.sampled:
        return None
    return {"trace_id": context.trace_id_hex, "span_id": context.span_id_hex}


def exposition(accept: str) -> tuple[Callable[[CollectorRegistry], bytes], str]:
    """prometheus_client's encoder and media type for a scraper's `Accept`: OpenMetrics
    1.0.0 (with the exemplars) when it asks for `application/openmetrics-text`, else the
    text format. The header is read for that alone: prometheus_client's own reading of it
    fails on a version it cannot compare (`version=x`: TypeError, a 500) and writes the
    version it was sent back into `Content-Type`."""
    from prometheus_client.exposition import choose_encoder

    ranges = (part.split(";", 1)[0].strip().lower() for part in accept.split(","))
    return choose_encoder(OPENMETRICS if "application/openmetrics-text" in ranges else "")


def certificate_expiry(path: str | Path) -> float:
    """The end of validity (seconds since the epoch) of a PEM certificate chain: its
    earliest `notAfter`, since a client refuses the chain once any certificate in it has
    expired. Read with `cryptography` (the servers' dependency), imported when called.

    Raises:
        OSError: the file cannot be read.
        ValueError: it holds no PEM certificate.
    """
    from cryptography import x509

    with open(path, "rb") as file:
        chain = x509.load_pem_x509_certificates(file.read())
    return min(cert.not_valid_after_utc.timestamp() for cert in chain)


#: The longest request head read (request line and headers); a longer one is not answered.
_MAX_HEAD = 8192
#: Seconds one connection may take, from its first byte to the answer's last.
_EXCHANGE_TIMEOUT = 10.0
#: Connections served at once; one more is closed unanswered (a scraper needs one).
_MAX_CONNECTIONS = 16
#: Of those, what one address (an IPv6 /64) may hold: one peer that sends nothing held
#: every slot for the exchange's time, again after each reconnect, and no scrape got in.
_PER_ADDRESS = _MAX_CONNECTIONS // 4


async def serve(
    render: Callable[[str], tuple[bytes, str]],
    host: str | None = None,
    port: int | None = None,
    *,
    sock: socket.socket | None = None,
    health: Callable[[], tuple[bool, str]] | None = None,
) -> asyncio.Server:
    """`GET /metrics` on `host:port` (and `/healthz`, `/readyz` when `health` is given):
    one answer per connection, everything else 404.

    Every connection is bounded: its head (8 KiB), the whole exchange (10 s, a scraper that
    stops reading included) and how many are served at once (16, at most 4 from one
    address).

    Args:
        render: the exposition and its media type for a scraper's `Accept`.
        host: the address to listen on.
        port: the port (0: a free one: the server's sockets say which).
        sock: a listening socket bound already, instead of `host` and `port`.
        health: whether the process is healthy, and a line saying so.

    Raises:
        OSError: the address cannot be bound (its message names it).
    """
    active = 0
    held: collections.Counter[str] = collections.Counter()  # by address

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal active
        peer = writer.get_extra_info("peername")
        key = _address_key(str(peer[0])) if isinstance(peer, tuple) and peer else ""
        if active >= _MAX_CONNECTIONS or held[key] >= _PER_ADDRESS:
            writer.close()
            return
        active += 1
        held[key] += 1
        try:
            async with asyncio.timeout(_EXCHANGE_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
                writer.write(_answer(head.split(b"\r\n"), render, health))
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a head over the limit, cut short or too slow gets nothing
        finally:
            active -= 1
            held[key] -= 1
            if not held[key]:
                del held[key]
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    try:
        return await asyncio.start_server(handle, host, port, sock=sock, limit=_MAX_HEAD)
    except OSError as exc:  # asyncio's words name the address as a tuple: say it plainly
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        raise OSError(exc.errno, f"cannot serve metrics on {host}:{port}: {reason}") from exc


def _answer(
    lines: list[bytes],
    render: Callable[[str], tuple[bytes, str]],
    health: Callable[[], tuple[bool, str]] | None,
) -> bytes:
    """The whole HTTP answer to a request head's `lines`."""
    words = lines[0].split()
    path = words[1] if len(words) >= 2 else b""
    status = "200 OK"
    if path == b"/metrics":
        body, kind = render(_accept(lines[1:]))
    elif health is not None and path in (b"/healthz", b"/readyz"):
        ok, text = health()
        status = "200 OK" if ok else "503 Service Unavailable"
        body, kind = text.encode() + b"\n", "text/plain"
    else:
        status, body, kind = "404 Not Found", b"not found\n", "text/plain"
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


def _accept(lines: list[bytes]) -> str:
    """The request's Accept header (the exposition the scraper takes), "" without one."""
    for raw in lines:
        name, _, value = raw.partition(b":")
        if name.strip().lower() == b"accept":
            return value.strip().decode("latin-1")
    return ""
