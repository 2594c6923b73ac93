"""The store a configured gateway redirects payload downloads to, learned from its `GET /`.

A gateway with direct transfers answers a payload fetch with a redirect to a presigned URL at
its object store; the client follows it only to an origin the gateway itself declared
(`DirectStore`), never to one a redirect merely names. A discovered gateway declares it in
its discovery record; a gateway the user configured as `endpoint` (no discovery topic)
serves the same record at `GET /` (gateway/http/_routes_info.py). It is read here once, lazily,
when a redirect to an origin not yet known arrives, bounded like a record off the topic
(:meth:`DiscoveryRecord.from_json`), without credentials and without following redirects,
and kept: trusted because the user named that gateway. A failure is a :class:`FetchError`
saying why the redirect was refused; it is asked again only after :data:`RETRY_AFTER`
seconds, so an old gateway without the route costs one request per spell, not one per fetch.
"""

from __future__ import annotations

import threading
import time

import httpx

from ..core._exceptions import FetchError
from ..protocol import DiscoveryRecord, MalformedDiscoveryRecord
from ..protocol._bounded import Origin
from ..protocol._discovery import MAX_RECORD_BYTES
from ._answers import _detail
from ._deadline import ON_SOCKET, Pace, Watchdog

#: Seconds before a gateway whose record could not be read is asked again.
RETRY_AFTER = 30.0
#: Seconds the record may take to arrive, whole (one more at most for its bytes): it is
#: read inside a fetch and under the lock every redirected fetch waits on, so an answer
#: that trickles in must not hold them past any fetch_deadline.
RECORD_DEADLINE = 10.0


def read_gateway_record(client: httpx.Client, endpoint: str) -> DiscoveryRecord:
    """The discovery record the gateway at `endpoint` serves at `GET /`.

    Args:
        client: the httpx client to ask with (its own auth, if any, is not sent).
        endpoint: the gateway's base URL.

    Raises:
        FetchError: no answer, not 200, larger than a record may be, not whole within
            about :data:`RECORD_DEADLINE` seconds, or not a record.
    """
    url = endpoint.rstrip("/") + "/"
    with Watchdog(url, Pace(RECORD_DEADLINE, MAX_RECORD_BYTES)) as watchdog:
        count = watchdog.counting(None)
        try:
            with client.stream(
                "GET",
                url,
                headers={"Accept": "application/json", "Accept-Encoding": "identity"},
                auth=None,
                follow_redirects=False,
                extensions={ON_SOCKET: watchdog.attach},  # the head is timed too
            ) as response:
                watchdog.watch(response)
                if response.status_code != 200:
                    raise FetchError(url, _detail(response), response.status_code)
                body = b""
                for piece in response.iter_raw():
                    body += piece
                    count(len(body), None)
                    if len(body) > MAX_RECORD_BYTES:
                        raise FetchError(url, f"answer is larger than {MAX_RECORD_BYTES} bytes")
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            raise FetchError(url, f"no answer: {exc!r}") from exc
    try:
        return DiscoveryRecord.from_json(body)
    except MalformedDiscoveryRecord as exc:
        raise FetchError(url, f"not a discovery record: {exc}") from exc


class ConfiguredStore:
    """Whether a redirect may lead to an origin: the store the configured gateway declared.

    Args:
        endpoint: the configured gateway URL.
        client: the httpx client its record is read with.
    """

    def __init__(self, endpoint: str, client: httpx.Client) -> None:
        self._endpoint = endpoint
        self._client = client
        self._lock = threading.Lock()
        self._record: DiscoveryRecord | None = None
        self._failed: tuple[float, FetchError] | None = None

    def declares(self, origin: Origin) -> bool:
        """Whether the gateway's record names `origin` as its store (learned on first need).

        Args:
            origin: where a redirect leads.

        Raises:
            FetchError: the record could not be read (now, or less than RETRY_AFTER ago).
        """
        with self._lock:  # one fetch thread asks; the others wait for its answer
            if self._record is None:
                self._record = self._learn(origin)
            return self._record.direct_store == str(origin)

    def _learn(self, origin: Origin) -> DiscoveryRecord:
        now = time.monotonic()
        if self._failed is None or now - self._failed[0] >= RETRY_AFTER:
            try:
                return read_gateway_record(self._client, self._endpoint)
            except FetchError as exc:
                self._failed = (now, exc)
        error = self._failed[1]
        raise FetchError(
            error.url,
            f"redirect to {origin} refused: the store the configured gateway advertises "
            f"could not be learned ({str(error).removeprefix(error.url + ': ')})",
            error.status,
        ) from error
