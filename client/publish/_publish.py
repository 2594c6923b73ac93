"""The publish path: route a message (direct, offloaded, ADR-23 chunks) and wait for acks.

Runs on the application's thread and only waits on futures that paho's thread completes
(:mod:`client.mqtt._paho`), which never waits on anything: publishing from inside the message loop
cannot deadlock. Offloaded uploads are retried once with the same message id (the gateway
keeps one object for an identical re-upload); an upload that still fails falls back to a
direct publish when the message fits, else to chunking when that is allowed; never when
the gateway refused the login or the access (401/403): that raises AccessRefused, unless
`fallback_on_auth_failure` is set.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, replace

import httpx

from ..config._settings import ClientSettings
from ..core._exceptions import (
    AccessRefused,
    ConfigError,
    ConnectionFailed,
    MessageTooLarge,
    ProtocolError,
    UploadError,
)
from ..core._message import PublishResult, Route
from ..core._source import PayloadLike, PayloadSource
from ..core._tracing import DISABLED, Span, Tracing
from ..http._direct import DirectUnsupported, DirectUploader
from ..http._retention import link_payload
from ..http._transport import HttpTransport, UploadReceipt
from ..mqtt._paho import MqttConnection
from ..protocol import MessageId, PublishProperties, Topic, _placeholder, http_origin
from ..protocol._chunk import plan_chunks
from ..protocol._size import MAX_PACKET_SIZE, publish_packet_size
from ..protocol._tracecontext import TraceContext
from ..receive._fetcher import PlainHttpWarner
from ..seal._seal import SealedStream, Sealer, tagged
from . import _spans
from ._router import choose_route

log = logging.getLogger("client")

UPLOAD_ATTEMPTS = 2  # per offloaded publish, same message id each time
TOO_LARGE = 413  # the gateway's answer to a body over OFFLOAD_MAX_BODY_BYTES: never chunked
#: The gateway refused the login, its absence or the access: a configuration error, never
#: hidden by a fallback unless `fallback_on_auth_failure` asks for one.
REFUSED = frozenset({401, 403})
#: Chunk publishes outstanding at once: bounds what paho buffers for a huge chunked message.
CHUNK_WINDOW = 32
#: QoS 0 PUBLISHes that `publish` calls may leave queued and not yet written (at most this
#: many, and at most QOS0_WINDOW_BYTES of payload) before a call waits until half of them
#: are written. MQTT promises no more for QoS 0 (at most once), and waiting for each write
#: cost a round trip to paho's thread: 7,000 delivered messages per second against plain
#: paho's 50,000 (bench/RESULTS.md, "QoS 0 publishes"). The window keeps what paho buffers
#: bounded; `Client.close` waits for the rest to be written (`flush`): paho's own
#: disconnect may stop its loop before it writes them.
QOS0_WINDOW = 256
QOS0_WINDOW_BYTES = 4 * 1024 * 1024
#: Most seconds `flush` waits for the QoS 0 PUBLISHes still queued to be written.
FLUSH_TIMEOUT = 5.0


def _refusal(exc: UploadError) -> str:
    """The refusal's words, without the URL (AccessRefused adds it again)."""
    return str(exc).removeprefix(f"{exc.url}: ")


def endpoint_host(endpoint: str) -> str:
    """The host of an endpoint URL (`server.address`), "" when it has none."""
    try:
        return http_origin(endpoint).host
    except ValueError:
        return ""


def wait_ack(future: Future[None], timeout: float | None, topic: str) -> None:
    """Wait for a PUBACK / SUBACK future; a timeout is a :class:`ConnectionFailed`."""
    try:
        future.result(timeout)
    except FutureTimeout as exc:
        raise ConnectionFailed(f"no acknowledgement for {topic!r} within {timeout}s") from exc


@dataclass(frozen=True, slots=True)
class _Send:
    """One publish's fixed parts, passed down the route taken."""

    topic: str
    qos: int
    retain: bool
    properties: PublishProperties | None
    limit: int
    timeout: float | None
    #: The publish span (None: not traced) and the context the message carries with it
    #: (None: none, or the publisher's own `traceparent` user property).
    span: Span | None = None
    trace: TraceContext | None = None

    def carrying(self, properties: PublishProperties | None) -> PublishProperties | None:
        """`properties` with this message's trace context as user properties."""
        return _spans.injected(properties, self.trace)


class Publisher:
    """Sends one message of any size the way :func:`client.publish._router.choose_route` says.

    Args:
        settings: the client's settings.
        conn: the MQTT connection.
        transport: the HTTP transport to the gateway.
        http_auth: credentials for the endpoint in force.
        endpoint: the configured or discovered endpoint (may wait briefly for discovery).
        warn_plain_http: the client's plain-http warner.
        direct_store: the store origin the discovery record advertises for direct
            transfers (:mod:`client.http._direct`), None when it advertises none.
        tracing: where spans come from (:mod:`client.publish._spans` says which).
    """

    def __init__(
        self,
        *,
        settings: ClientSettings,
        conn: MqttConnection,
        transport: HttpTransport,
        http_auth: httpx.Auth | None,
        endpoint: Callable[[], str | None],
        warn_plain_http: PlainHttpWarner,
        direct_store: Callable[[], str | None] = lambda: None,
        tracing: Tracing = DISABLED,
    ) -> None:
        self._settings = settings
        self._tracing = tracing
        self._direct_store = direct_store
        self._direct = DirectUploader(transport.client)
        self._conn = conn
        self._transport = transport
        self._http_auth = http_auth
        self._endpoint = endpoint
        self._warn_plain_http = warn_plain_http
        self._unwritten: deque[tuple[Future[None], int]] = deque()  # QoS 0, oldest first
        self._unwritten_bytes = 0
        self._unwritten_lock = threading.Lock()
        self._sealer = Sealer(settings)

    @property
    def max_packet_size(self) -> int:
        """The limit in force: CONNACK's Maximum Packet Size, else the configured one."""
        return self._conn.max_packet_size or self._settings.max_packet_size or MAX_PACKET_SIZE

    def publish(
        self,
        topic: str,
        payload: PayloadLike,
        *,
        qos: int,
        retain: bool,
        properties: PublishProperties | None,
        timeout: float | None,
        message_id: MessageId | str | None,
    ) -> PublishResult:
        """See :meth:`client.Client.publish`."""
        Topic(topic)
        if isinstance(message_id, str):
            message_id = MessageId.parse(message_id)
        s = self._settings
        if s.protocol != 5:
            if properties is not None and properties != PublishProperties():
                raise ProtocolError("MQTT 3.1.1 cannot carry publish properties")
            properties = None
        with PayloadSource(payload, spool_dir=s.spool_dir) as source:
            send = _Send(topic, qos, retain, properties, self.max_packet_size, timeout)
            return self._route(send, source, message_id)

    def _route(
        self, send: _Send, source: PayloadSource, message_id: MessageId | None
    ) -> PublishResult:
        s = self._settings
        tracing = self._tracing
        encrypted = self._sealer.encrypts(send.topic)
        packet = 0
        # What a direct PUBLISH carries: its own properties; with `trace_direct`, and the
        # caller's context (a child of the caller's span has its tracestate and a
        # traceparent of the same length: sized as it would go).
        outgoing = self._direct_properties(send) if s.trace_direct else send.properties
        if encrypted:  # offloaded, else chunks of the ciphertext: never direct
            route = Route.OFFLOADED
            endpoint = self._endpoint() if s.automatic_offload else None
        else:
            packet = self._packet_size(send, source.size, outgoing)
            if packet > send.limit and outgoing is not send.properties:
                outgoing = send.properties  # the context only where it fits: not a reroute
                packet = self._packet_size(send, source.size, outgoing)
            route, endpoint = self._choose(send, source, packet)
        if route is Route.DIRECT:  # one PUBLISH: no span of the library's (_spans.py)
            return self._as_is(send, source, outgoing)
        ambient = tracing.ambient()
        custom = _spans.custom_context(send.properties) if tracing.enabled or ambient else False
        span = _spans.start_publish(
            tracing, topic=send.topic, size=source.size, route=route, ambient=ambient, custom=custom
        )
        if span is None:
            return self._routed(send, source, message_id, route, endpoint, packet, encrypted)
        with span:
            send = replace(send, span=span, trace=None if custom else span.context)
            result = self._routed(send, source, message_id, route, endpoint, packet, encrypted)
            if span.recording:
                span.set("offload.route", str(result.route))
                if result.message_id is not None:
                    span.set("messaging.message.id", result.message_id)
            return result

    def _direct_properties(self, send: _Send) -> PublishProperties | None:
        """A direct PUBLISH's properties with the caller's context (`trace_direct`), unless
        its publisher set a `traceparent` itself."""
        ambient = self._tracing.ambient()
        if ambient is None:
            return send.properties
        custom = _spans.custom_context(send.properties)
        return _spans.injected(send.properties, _spans.direct_context(ambient, custom))

    def _choose(self, send: _Send, source: PayloadSource, packet: int) -> tuple[Route, str | None]:
        """The route of a message that may go direct, and the endpoint when it is offloaded."""
        s = self._settings
        over_threshold = s.offload_threshold is not None and source.size > s.offload_threshold
        endpoint = None
        if s.automatic_offload and (packet > send.limit or over_threshold):
            endpoint = self._endpoint()
        route = choose_route(
            packet_size=packet,
            payload_size=source.size,
            limit=send.limit,
            offload_threshold=s.offload_threshold,
            endpoint_known=endpoint is not None,
            automatic_offload=s.automatic_offload,
            chunking=s.chunking and s.protocol == 5,
        )
        return route, endpoint

    def _routed(
        self,
        send: _Send,
        source: PayloadSource,
        message_id: MessageId | None,
        route: Route,
        endpoint: str | None,
        packet: int,
        encrypted: bool,
    ) -> PublishResult:
        if encrypted:
            return self._encrypted(send, source, message_id, endpoint)
        s = self._settings
        chunking = s.chunking and s.protocol == 5
        if route is Route.OFFLOADED:
            assert endpoint is not None
            try:
                return self._offloaded(endpoint, send, source, message_id)
            except UploadError as exc:
                if exc.status in REFUSED and not s.fallback_on_auth_failure:
                    # A wrong or missing password is the user's to fix: chunking would hide
                    # it until the broker's limits or a consumer's bounds bite.
                    raise AccessRefused(exc.url, _refusal(exc), exc.status) from exc
                if send.trace is not None and self._packet_size(send, source.size) > send.limit:
                    send = replace(send, trace=None)  # it fits only without its context
                if packet <= send.limit:
                    log.warning("offload failed (%s); publishing directly instead", exc)
                    route = Route.DIRECT
                elif chunking and exc.status != TOO_LARGE:
                    # Never past the gateway's own size limit: chunks would carry through the
                    # broker what its operator refused, often more than a consumer reassembles.
                    log.warning("offload failed (%s); falling back to chunking", exc)
                    route = Route.CHUNKED
                else:
                    raise
        if route is Route.CHUNKED:
            return self._chunked(send, source)
        return self._as_is(send, source, send.carrying(send.properties))

    def _as_is(
        self, send: _Send, source: PayloadSource, properties: PublishProperties | None
    ) -> PublishResult:
        """The message as one PUBLISH with `properties` (the trace context included)."""
        future = self._conn.publish(
            send.topic,
            source.read_all(),
            qos=send.qos,
            retain=send.retain,
            properties=properties,
        )
        # Hash while the PUBACK travels: the small-message hot path (bench/small_messages.py).
        result = PublishResult(send.topic, Route.DIRECT, source.size, source.sha256)
        if send.qos == 0 and not future.done():
            self._written_later(future, send, source.size)
        else:  # acknowledged, or refused at once (not connected, invalid): said now
            wait_ack(future, send.timeout, send.topic)
        return result

    def _encrypted(
        self,
        send: _Send,
        source: PayloadSource,
        message_id: MessageId | None,
        endpoint: str | None,
    ) -> PublishResult:
        """An `encrypt_to` topic: offloaded whatever its size, else ADR-23 chunks of the
        ciphertext; never direct, so no byte of its plaintext crosses the broker."""
        s = self._settings
        chunking = s.chunking and s.protocol == 5
        if endpoint is not None:
            try:
                return self._offloaded(endpoint, send, source, message_id)
            except UploadError as exc:
                if not chunking or exc.status == TOO_LARGE:
                    raise
                log.warning("offload failed (%s); falling back to chunks of the ciphertext", exc)
        elif not chunking:
            raise ConfigError(
                f"{send.topic!r} is encrypted (encrypt_to): its payloads are offloaded or "
                "chunked, and no offload endpoint is known (endpoint, discovery, "
                "automatic_offload) and chunking is off"
            )
        with self._sealer.seal(send.topic, source) as stored:
            assert isinstance(stored.source, PayloadSource)  # not a stream: chunks seek
            props = tagged(send.properties, stored.encoding)
            result = self._chunked(replace(send, properties=props), stored.source)
        return replace(result, size=source.size, sha256=stored.plain_sha256)

    def _written_later(self, future: Future[None], send: _Send, size: int) -> None:
        """Leave a QoS 0 PUBLISH to paho's thread; past the window, wait for half of it.

        A queued QoS 0 message lost with the connection before it was written is not
        reported to anyone: MQTT's at-most-once (paho drops such messages at the reconnect).
        """
        with self._unwritten_lock:
            pending = self._unwritten
            pending.append((future, size))
            self._unwritten_bytes += size
            while pending and pending[0][0].done():
                self._unwritten_bytes -= pending.popleft()[1]
            full = len(pending) > QOS0_WINDOW or self._unwritten_bytes > QOS0_WINDOW_BYTES
            # Wait for the middle one: one wait per half window, not one per message.
            target = pending[len(pending) // 2][0] if full else None
        if target is not None and not wait_futures([target], send.timeout).done:
            raise ConnectionFailed(
                f"queued QoS 0 messages not written within {send.timeout}s; "
                f"{send.topic!r} is queued behind them"
            )

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Wait, at most `timeout` seconds, until every queued QoS 0 PUBLISH is written
        (or lost with the connection)."""
        with self._unwritten_lock:
            pending = [future for future, _ in self._unwritten]
            self._unwritten.clear()
            self._unwritten_bytes = 0
        wait_futures(pending, timeout)

    def _packet_size(
        self, send: _Send, payload_size: int, properties: PublishProperties | None = None
    ) -> int:
        """The exact size of the message as one PUBLISH (with the trace context it
        carries, or `properties`), even beyond MQTT's own cap."""
        try:
            return publish_packet_size(
                send.topic,
                payload_size,
                qos=send.qos,
                properties=send.carrying(send.properties) if properties is None else properties,
                protocol=self._settings.protocol,
            )
        except MessageTooLarge as exc:
            return exc.size

    def _upload(
        self,
        endpoint: str,
        send: _Send,
        source: PayloadSource | SealedStream,
        message_id: MessageId,
        *,
        linkable: bool = False,
    ) -> str:
        """Upload the payload; the URL it is stored at. Retries a transient failure once.

        A :class:`SealedStream` (sealed while sent) goes through the gateway only: a direct
        transfer hashes every part before it starts. A `linkable` payload (not encrypted:
        an age file differs every time) is first asked for by SHA-256 and size (`dedup`):
        when the account stores it already, no byte of it is sent.
        """
        props = send.properties
        headers = [(k, v.encode()) for k, v in (props.user_properties if props else ())]
        attempt = 0
        while True:
            span = _spans.start_upload(
                self._tracing,
                send.span,
                topic=send.topic,
                size=source.size,
                message_id=str(message_id),
                server=endpoint_host(endpoint),
            )
            try:
                with span:
                    if linkable and isinstance(source, PayloadSource) and self._settings.dedup:
                        linked = self._link(endpoint, send, source, message_id, headers, span)
                        if linked is not None:
                            return linked
                    return self._upload_once(endpoint, send, source, message_id, headers, span)
            except UploadError as exc:
                # A dropped connection or a 5xx may have stored the payload or not: the
                # same id again is safe (the gateway answers an identical re-upload with
                # success and keeps one object), so retry before giving up. Not a timeout:
                # a gateway that did not answer within http_timeout would cost it twice.
                timed_out = isinstance(exc.__cause__, httpx.TimeoutException | TimeoutError)
                transient = (exc.status is None and not timed_out) or (exc.status or 0) >= 500
                attempt += 1
                if not transient or attempt >= UPLOAD_ATTEMPTS:
                    raise
                log.info(
                    "upload attempt %d failed (%s); retrying with id %s", attempt, exc, message_id
                )
                time.sleep(0.2 * attempt)

    def _link(
        self,
        endpoint: str,
        send: _Send,
        source: PayloadSource,
        message_id: MessageId,
        headers: list[tuple[str, bytes]],
        span: Span,
    ) -> str | None:
        """The message linked to the account's stored copy of the payload; None: upload."""
        props = send.properties
        url = link_payload(
            self._transport.client,
            endpoint,
            send.topic,
            sha256=source.sha256,
            size=source.size,
            message_id=message_id,
            headers=headers,
            auth=self._http_auth,
            ttl=props.message_expiry_interval if props else None,
            trace=span.context,
        )
        if url is not None and span.recording:
            span.set("offload.linked", True)
        return url

    def _upload_once(
        self,
        endpoint: str,
        send: _Send,
        source: PayloadSource | SealedStream,
        message_id: MessageId,
        headers: list[tuple[str, bytes]],
        span: Span,
    ) -> str:
        """One upload attempt: direct when the store is advertised, else through the
        gateway; its span's context goes with every request to the gateway."""
        props = send.properties
        try:
            if isinstance(source, PayloadSource):
                receipt = self._direct_upload(endpoint, send, source, message_id, span.context)
                if receipt is not None:
                    return receipt.url
            return self._transport.upload(
                endpoint,
                send.topic,
                source,
                message_id=message_id,
                headers=headers,
                auth=self._http_auth,
                # The payload need not outlive the placeholder that points at it.
                ttl=props.message_expiry_interval if props else None,
                trace=span.context,
            ).url
        except UploadError as exc:
            if exc.status is not None and span.recording:
                span.set("http.response.status_code", exc.status)
            raise

    def _direct_upload(
        self,
        endpoint: str,
        send: _Send,
        source: PayloadSource,
        message_id: MessageId,
        trace: TraceContext | None,
    ) -> UploadReceipt | None:
        """Upload straight to the store when the endpoint advertises it; None: use the proxy."""
        store = self._direct_store()
        if store is None:
            return None
        props = send.properties
        try:
            return self._direct.upload(
                endpoint,
                store,
                send.topic,
                source,
                message_id=message_id,
                headers=props.user_properties if props else (),
                auth=self._http_auth,
                ttl=props.message_expiry_interval if props else None,
                trace=trace,
            )
        except DirectUnsupported as exc:  # an older gateway, or a store out of reach
            log.info("direct upload unavailable (%s); uploading through the gateway", exc)
            return None

    def _offloaded(
        self, endpoint: str, send: _Send, source: PayloadSource, message_id: MessageId | None
    ) -> PublishResult:
        self._warn_plain_http(endpoint)
        message_id = message_id or MessageId.new()
        # Through the gateway an encrypted payload is sealed while it is sent.
        stream = self._direct_store() is None
        with self._sealer.seal(send.topic, source, stream=stream) as stored:
            linkable = not stored.encoding.encrypted
            url = self._upload(endpoint, send, stored.source, message_id, linkable=linkable)
            ref = _placeholder.Placeholder(
                url, stored.source.size, stored.source.sha256, message_id, stored.encoding
            )
        body, props, size = self._placeholder(send, ref, send.carrying(send.properties))
        if size > send.limit and send.trace is not None:  # the context only where it fits
            body, props, size = self._placeholder(send, ref, send.properties)
        if size > send.limit:
            raise MessageTooLarge(size, send.limit, "even the placeholder does not fit")
        future = self._conn.publish(
            send.topic, body, qos=send.qos, retain=send.retain, properties=props
        )
        wait_ack(future, send.timeout, send.topic)
        return PublishResult(
            send.topic, Route.OFFLOADED, source.size, stored.plain_sha256, str(message_id), url
        )

    def _placeholder(
        self, send: _Send, ref: _placeholder.Placeholder, properties: PublishProperties | None
    ) -> tuple[bytes, PublishProperties | None, int]:
        """The placeholder's body and properties, and the size of its PUBLISH."""
        protocol = self._settings.protocol
        body, props = ref.encode(properties, protocol=protocol)
        size = publish_packet_size(
            send.topic, len(body), qos=send.qos, properties=props, protocol=protocol
        )
        return body, props, size

    def encrypts(self, topic: str) -> bool:
        """Whether `topic`'s payloads are encrypted (`encrypt_to`): never sent in the clear."""
        return self._sealer.encrypts(topic)

    def upload_placeholder(
        self, topic: str, payload: bytes, *, qos: int, properties: PublishProperties | None
    ) -> tuple[bytes, PublishProperties | None, str] | None:
        """Upload `payload` as a message on `topic` without publishing anything; the
        placeholder (body, properties, URL) that points at it, None without an endpoint.
        A Will that is too large for the broker travels as this (:mod:`client.publish._will`).
        """
        endpoint = self._endpoint()
        if endpoint is None or not self._settings.automatic_offload:
            return None
        self._warn_plain_http(endpoint)
        send = _Send(topic, qos, False, properties, self.max_packet_size, None)
        message_id = MessageId.new()
        with (
            PayloadSource(payload, spool_dir=self._settings.spool_dir) as source,
            self._sealer.seal(topic, source) as stored,  # an encrypt_to topic's Will too
        ):
            url = self._upload(endpoint, send, stored.source, message_id)
            ref = _placeholder.Placeholder(
                url, stored.source.size, stored.source.sha256, message_id, stored.encoding
            )
        body, props = ref.encode(properties, protocol=self._settings.protocol)
        return body, props, url

    def _chunked(self, send: _Send, source: PayloadSource) -> PublishResult:
        if send.retain:
            log.warning("retain flag dropped: a broker would retain only the last chunk")
        plan = plan_chunks(
            topic=send.topic,
            payload_size=source.size,
            sha256_hex=source.sha256,
            message_id=MessageId.new(),
            qos=send.qos,
            properties=send.carrying(send.properties),  # the context: on the first chunk
            limit=send.limit,
        )
        window: list[Future[None]] = []
        for chunk in plan:
            data = source.read_at(chunk.offset, chunk.length)
            window.append(
                self._conn.publish(
                    send.topic, data, qos=send.qos, retain=False, properties=chunk.properties
                )
            )
            if len(window) >= CHUNK_WINDOW:
                wait_ack(window.pop(0), send.timeout, send.topic)
        for future in window:
            wait_ack(future, send.timeout, send.topic)
        return PublishResult(
            send.topic, Route.CHUNKED, source.size, source.sha256, plan.message_id, None, plan.total
        )
