"""What the gateway holds for a placeholder, asked with the receiving device's own login
before any byte of the payload is written to it: `HEAD /msg/<id>/payload`.

The answer says three things at once: that this device may read the payload (the gateway
checks its login and read ACL, as for the GET it could have made itself), the stored size
(`Content-Length`) and the stored SHA-256 (`X-Offload-Sha256`, which the gateway takes from
the message's manifest). A placeholder whose size or digest is not the stored one is a lie
of its publisher: it is found out here, before the PUBLISH's header is written, so it never
costs the subscriber its connection (:mod:`proxy._outbound`). The gateway answers a HEAD
itself even with direct transfers (only a GET is redirected to the store).

Run on a worker thread, as every gateway call is (:mod:`proxy._gateway_calls`), within the
fetches' pace: an answer that trickles in is cut off `fetch_deadline` seconds after the
HEAD began, whatever each read's timeout.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from client import FetchError, Pace, Watchdog

from ._exceptions import CutOff, TransferFailed

#: The gateway's header naming the stored payload's SHA-256 (gateway/http/_routes.py).
SHA256_HEADER = "x-offload-sha256"


@dataclass(frozen=True, slots=True)
class Stat:
    """What the gateway holds: the stored size, and its SHA-256 (None: not said)."""

    size: int
    sha256: str | None


def payload_stat(
    http: httpx.Client,
    url: str,
    auth: httpx.Auth | None,
    peer: str,
    traced: tuple[tuple[str, str], ...] = (),
    pace: Pace | None = None,
) -> Stat:
    """(worker thread) `HEAD url` with the device's login; what the gateway holds.

    Args:
        http: the fetches' client (its timeouts hold for each read).
        url: the payload's URL (`Placeholder.payload_url`).
        auth: the device's login for the gateway (None: anonymous).
        peer: the device's address, forwarded (`X-Forwarded-For`).
        traced: `traceparent` / `tracestate`.
        pace: the fetches' pace: with no body, the whole exchange (a login's legs
            included) is due within its floor; None: per-read timeouts only.

    Raises:
        TransferFailed: no answer, or another answer than 200 with a length (404: gone;
            401/403: this device may not read it); CutOff: no whole answer within the pace.
    """
    headers = {"Accept-Encoding": "identity", "X-Forwarded-For": peer, **dict(traced)}
    try:
        with Watchdog(url, pace) as watchdog:
            response = http.send(
                watchdog.timing(http.build_request("HEAD", url, headers=headers)),
                auth=auth or httpx.USE_CLIENT_DEFAULT,
            )
    except FetchError as exc:  # behind the pace: cut off
        raise CutOff(f"HEAD {exc}") from exc
    except httpx.HTTPError as exc:
        raise TransferFailed(f"HEAD {url} failed: {type(exc).__name__}") from exc
    except Exception as exc:  # an auth flow's own error: never a dead thread
        raise TransferFailed(f"HEAD {url} failed: {exc!r}") from exc
    if response.status_code != 200:
        raise TransferFailed(f"HEAD {url}: HTTP {response.status_code}", response.status_code)
    length = response.headers.get("content-length", "")
    if not length.isascii() or not length.isdigit():
        raise TransferFailed(f"HEAD {url}: no Content-Length")
    sha256 = response.headers.get(SHA256_HEADER)
    return Stat(int(length), sha256.lower() if sha256 is not None else None)
