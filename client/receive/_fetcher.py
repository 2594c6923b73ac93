"""Resolving placeholders: which origin may be fetched, with which credentials, and the fetch.

Every placeholder is untrusted: anyone who may publish on a subscribed topic wrote it. So a
placeholder is fetched only from the endpoint in force (with credentials, hop-client's rule)
or an origin in `discovery_allowlist`; other origins need `untrusted_endpoint = "anonymous"`
(and get no credentials), else a placeholder could make every subscriber send requests to
any host and port inside its network. The transport never reads more than the placeholder's
declared size (:meth:`client.http._transport.HttpTransport.fetch`). A transient failure (no
connection, a reset, a timeout, a 5xx) is retried with backoff for `fetch_retry_for` seconds.

Used by the receive worker's fetch pool (:mod:`client.receive._receive`) for whole payloads
and by :meth:`client.Client.fetch_range` for ranges, under the same rules.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import httpx

from ..config._settings import ClientSettings
from ..core._exceptions import OffloadError, UntrustedEndpoint
from ..core._message import Message, MessageError, Payload, Route
from ..core._tracing import DISABLED, Span, Tracing, message_attributes
from ..http._answers import TransientFetchError
from ..http._deadline import Pace
from ..http._range import RangeReader, payload_range
from ..http._retention import confirm_payload
from ..http._store_origin import ConfiguredStore
from ..http._transport import HttpTransport
from ..mqtt._paho import Incoming
from ..protocol import _placeholder
from ..protocol._bounded import Origin, http_origin
from ..protocol._tracecontext import TraceContext
from ..seal._unseal import Unsealer

log = logging.getLogger("client")

#: on_fetch_progress(topic, bytes received, total or None), from the fetching thread.
FetchProgress = Callable[[str, int, int | None], None]


def origin_of(url: str | None) -> Origin | None:
    """The origin of a URL, None when there is none or it is not a usable http(s) URL."""
    if url is None:
        return None
    try:
        return http_origin(url)
    except ValueError:
        return None


def _loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host in ("::1", "[::1]")


class PlainHttpWarner:
    """Warns once per origin that payloads travel over plain http (a bounded set of them).

    Never for loopback, where nothing travels over a network.
    """

    def __init__(self, limit: int = 64) -> None:
        self._warned: set[Origin] = set()
        self._limit = limit
        self._lock = threading.Lock()

    def __call__(self, url: str) -> None:
        origin = origin_of(url)
        if origin is None or origin.scheme != "http" or _loopback(origin.host):
            return
        with self._lock:
            # Origins may come from placeholders (with the anonymous opt-in): keep it bounded.
            if origin in self._warned or len(self._warned) >= self._limit:
                return
            self._warned.add(origin)
        log.warning(
            "offload endpoint %s:%s uses plain http: payloads travel unencrypted",
            origin.host,
            origin.port,
        )


class PlaceholderFetcher:
    """Fetches a placeholder's payload (whole, or a range) under the origin rules.

    Args:
        settings: the client's settings.
        transport: the HTTP transport the payloads are fetched with.
        http_auth: credentials for the endpoint in force.
        unsealer: decodes encrypted and compressed payloads (the client's identities).
        endpoint_in_force: the configured or discovered endpoint.
        warn_plain_http: the client's plain-http warner.
        on_fetch_progress: called as `(topic, bytes received, total)` while fetching.
        direct_store: the store origin the discovery record advertises: a fetch may follow
            the gateway's redirect there (without credentials), or to an allowlisted origin.
        configured_store: with a configured endpoint, the store that gateway declares at
            `GET /` (:mod:`client.http._store_origin`): a redirect may lead there too.
        tracing: the fetch spans' source (:meth:`resolve`).
    """

    def __init__(
        self,
        *,
        settings: ClientSettings,
        transport: HttpTransport,
        http_auth: httpx.Auth | None,
        unsealer: Unsealer,
        endpoint_in_force: Callable[[], str | None],
        warn_plain_http: PlainHttpWarner,
        on_fetch_progress: FetchProgress | None = None,
        direct_store: Callable[[], str | None] = lambda: None,
        configured_store: ConfiguredStore | None = None,
        tracing: Tracing = DISABLED,
    ) -> None:
        self._settings = settings
        self._tracing = tracing
        self._transport = transport
        self._http_auth = http_auth
        self._unsealer = unsealer
        self._endpoint_in_force = endpoint_in_force
        self._warn_plain_http = warn_plain_http
        self._on_fetch_progress = on_fetch_progress
        self._direct_store = direct_store
        self._configured_store = configured_store
        self._pace = Pace(settings.fetch_deadline, settings.fetch_min_rate)

    def resolve(
        self, incoming: Incoming, ref: _placeholder.Placeholder, stop: threading.Event
    ) -> Message | MessageError:
        """Fetch a placeholder's payload, retrying transient failures; errors become MessageError.

        A transient failure (see :class:`client.http._answers.TransientFetchError`) is retried with
        exponential backoff (0.25 s doubling to 5 s) until `fetch_retry_for` seconds have
        passed since the first attempt, or `stop` is set (the client closes).

        Each attempt is a `fetch {topic}` span (CLIENT), a child of the placeholder's
        creation context (its `traceparent` user property: the publisher's trace goes on,
        as OpenTelemetry's messaging conventions allow for one message), else the first of
        a trace; its context goes with the GET, so the gateway's spans are its children.
        """
        retry_until = time.monotonic() + self._settings.fetch_retry_for
        backoff = 0.25
        creation = TraceContext.from_pairs(incoming.properties.user_properties)
        while True:
            try:
                with self._fetch_span(incoming.topic, ref, creation) as span:
                    return self._fetch_once(incoming, ref, span.context)
            except TransientFetchError as exc:
                left = retry_until - time.monotonic()
                if left <= 0 or stop.is_set():
                    return MessageError(incoming.topic, exc, str(ref.message_id))
                log.info("fetch of %s failed (%s): retrying", ref.message_id, exc)
                if stop.wait(min(backoff, left)):
                    return MessageError(incoming.topic, exc, str(ref.message_id))
                backoff = min(backoff * 2, 5.0)
            except OffloadError as exc:
                return MessageError(incoming.topic, exc, str(ref.message_id))

    def fetch_range(
        self,
        ref: _placeholder.Placeholder,
        start: int,
        end: int,
        *,
        topic: str | None = None,
        creation: TraceContext | None = None,
    ) -> bytes:
        """Bytes `[start, end)` of a placeholder's payload (:meth:`client.Client.fetch_range`),
        in a `fetch` span: a child of the caller's current span, else of the message's
        creation context (`creation`), linked to the latter; its context goes with the
        requests to the payload's URL."""
        name = f"fetch {topic}" if topic is not None else "fetch"
        attributes = message_attributes(
            topic or "", ref.size, "fetch", "receive", str(ref.message_id)
        )
        if topic is None:
            del attributes["messaging.destination.name"]
        attributes["server.address"] = ref.origin.host
        links = (creation,) if creation is not None else ()
        with self._tracing.start(
            name, "client", parent=creation, use_ambient=True, links=links, attributes=attributes
        ) as span:
            reader = RangeReader(
                self._transport.reader,
                ref.payload_url,
                ref.size,
                auth=self.auth_for(ref),
                redirect_ok=self.redirect_ok,
                trace=span.context,
            )
            return payload_range(reader, ref, start, end, self._unsealer.identities)

    def _fetch_span(
        self, topic: str, ref: _placeholder.Placeholder, creation: TraceContext | None
    ) -> Span:
        attributes = message_attributes(topic, ref.size, "fetch", "receive", str(ref.message_id))
        attributes["server.address"] = ref.origin.host
        return self._tracing.start(
            f"fetch {topic}", "client", parent=creation, attributes=attributes
        )

    def _fetch_once(
        self, incoming: Incoming, ref: _placeholder.Placeholder, trace: TraceContext | None
    ) -> Message:
        auth = self.auth_for(ref)
        self._warn_plain_http(ref.url)
        progress = self._on_fetch_progress
        payload, sha256 = fetch_payload(
            self._transport,
            ref,
            settings=self._settings,
            unsealer=self._unsealer,
            auth=auth,
            redirect_ok=self.redirect_ok,
            pace=self._pace,
            topic=incoming.topic,
            on_bytes=(lambda done, total: progress(incoming.topic, done, total))
            if progress is not None
            else None,
            trace=trace,
        )
        group = self._settings.group
        if group is not None:  # verified (fetch_payload returns nothing else): it counts
            confirm_payload(self._transport.client, ref.url, group, auth=auth, trace=trace)
        return Message(
            incoming.topic,
            payload,
            sha256,
            incoming.qos,
            incoming.retain,
            _placeholder.original_properties(incoming.properties),
            Route.OFFLOADED,
            str(ref.message_id),
        )

    def redirect_ok(self, origin: Origin) -> bool:
        """Where a payload redirect may lead: the advertised store, or an allowlisted origin.

        The advertised store is the discovery record's, or with a configured endpoint the
        one that gateway declares at `GET /` (read when first needed; a failure to read it
        is a FetchError saying so).
        """
        if str(origin) == self._direct_store() or self._settings.allowlisted(origin):
            return True
        return self._configured_store is not None and self._configured_store.declares(origin)

    def auth_for(self, ref: _placeholder.Placeholder) -> httpx.Auth | None:
        """Whether a placeholder may be fetched, and with which credentials.

        Fetched: the endpoint in force (configured or discovered), with credentials
        (hop-client's rule); origins in `discovery_allowlist`, without them (e.g. presigned
        links). Any other origin only with `untrusted_endpoint = "anonymous"`, without
        them: else a placeholder could make every subscriber send requests to any host and
        port inside its network.

        Raises:
            UntrustedEndpoint: the origin is none of those, naming the settings that allow it.
        """
        origin = ref.origin
        trusted = self._endpoint_in_force()
        if origin == origin_of(trusted):
            return self._http_auth
        if self._settings.allowlisted(origin) or self._settings.untrusted_endpoint == "anonymous":
            return None
        raise UntrustedEndpoint(
            ref.url,
            f"origin {origin} is not the offload endpoint ({trusted or 'none known'}): add it "
            "to discovery_allowlist, or set untrusted_endpoint=anonymous to fetch from any "
            "origin without credentials",
        )


def fetch_payload(
    transport: HttpTransport,
    ref: _placeholder.Placeholder,
    *,
    settings: ClientSettings,
    unsealer: Unsealer | None,
    auth: httpx.Auth | None,
    redirect_ok: Callable[[Origin], bool] | None,
    url: str | None = None,
    pace: Pace | None = None,
    topic: str | None = None,
    on_bytes: Callable[[int, int | None], None] | None = None,
    trace: TraceContext | None = None,
) -> tuple[Payload, str]:
    """A placeholder's payload and its SHA-256 (the receive path's, `offload fetch
    --placeholder`'s): the stored bytes checked against the placeholder's `size` and
    `sha256` as they stream in (never more read), then decoded as its `enc` and `cmp` say.

    Args:
        transport: the HTTP transport; `auth`, `redirect_ok`, `pace`, `topic` and
            `on_bytes` are its :meth:`HttpTransport.fetch`'s, and `trace` (the context the
            GET carries).
        ref: the placeholder.
        settings: `max_fetch_bytes`, `spool_threshold` and `spool_dir`.
        unsealer: decodes an encrypted or compressed payload; None: the stored bytes.
        url: where the stored bytes are (default: the placeholder's `/payload`).

    Raises:
        FetchError: as :meth:`HttpTransport.fetch` (a checksum mismatch included).
        PayloadDecodeError: no identity opens it (before any request), or it is damaged.
    """
    # An encrypted / compressed payload is decoded while it arrives; handed out only
    # after the fetch has checked the stored bytes (client/seal/_unseal.py, Decoding).
    decoding = None
    if unsealer is not None and not ref.encoding.plain:
        decoding = unsealer.decoding(ref.encoding, ref.size)
    try:
        payload = transport.fetch(
            url or ref.payload_url,
            expected_sha256=ref.sha256,
            expected_size=ref.size,
            max_bytes=settings.max_fetch_bytes,
            spool_threshold=settings.spool_threshold,
            spool_dir=settings.spool_dir,
            auth=auth,
            redirect_ok=redirect_ok,
            pace=pace,
            topic=topic,
            on_bytes=on_bytes,
            tap=decoding.feed if decoding is not None else None,
            keep=decoding is None or decoding.keeps_stored,
            trace=trace,
        )
    except BaseException:
        if decoding is not None:
            decoding.discard()
        raise
    if decoding is None:
        return payload, ref.sha256
    return decoding.result(payload)
