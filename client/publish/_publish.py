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
from collections.abc import Callable
from dataclasses import replace

import httpx

from ..config._settings import ClientSettings
from ..core._exceptions import (
    AccessRefused,
    ConfigError,
    MessageTooLarge,
    ProtocolError,
    UploadError,
)
from ..core._message import PublishResult, Route
from ..core._source import PayloadLike, PayloadSource
from ..core._tracing import DISABLED, Tracing
from ..http._transport import HttpTransport
from ..mqtt._paho import MqttConnection
from ..protocol import MessageId, PublishProperties, Topic, _placeholder
from ..protocol._size import MAX_PACKET_SIZE, publish_packet_size
from ..receive._fetcher import PlainHttpWarner
from ..seal._seal import Sealer, tagged
from . import _spans
from ._chunked import publish_chunks
from ._router import choose_route
from ._send import Send, wait_ack
from ._uploader import PayloadUploader
from ._window import FLUSH_TIMEOUT, Qos0Window

log = logging.getLogger("client")

TOO_LARGE = 413  # the gateway's answer to a body over OFFLOAD_MAX_BODY_BYTES: never chunked
#: The gateway refused the login, its absence or the access: a configuration error, never
#: hidden by a fallback unless `fallback_on_auth_failure` asks for one.
REFUSED = frozenset({401, 403})


def _refusal(exc: UploadError) -> str:
    """The refusal's words, without the URL (AccessRefused adds it again)."""
    return str(exc).removeprefix(f"{exc.url}: ")


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
        self._uploader = PayloadUploader(
            transport=transport,
            http_auth=http_auth,
            direct_store=direct_store,
            dedup=settings.dedup,
            tracing=tracing,
        )
        self._conn = conn
        self._endpoint = endpoint
        self._warn_plain_http = warn_plain_http
        self._window = Qos0Window()
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
            send = Send(topic, qos, retain, properties, self.max_packet_size, timeout)
            return self._route(send, source, message_id)

    def _route(
        self, send: Send, source: PayloadSource, message_id: MessageId | None
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

    def _direct_properties(self, send: Send) -> PublishProperties | None:
        """A direct PUBLISH's properties with the caller's context (`trace_direct`), unless
        its publisher set a `traceparent` itself."""
        ambient = self._tracing.ambient()
        if ambient is None:
            return send.properties
        custom = _spans.custom_context(send.properties)
        return _spans.injected(send.properties, _spans.direct_context(ambient, custom))

    def _choose(self, send: Send, source: PayloadSource, packet: int) -> tuple[Route, str | None]:
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
        send: Send,
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
            return publish_chunks(self._conn, send, source)
        return self._as_is(send, source, send.carrying(send.properties))

    def _as_is(
        self, send: Send, source: PayloadSource, properties: PublishProperties | None
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
            self._window.written_later(future, source.size, send.timeout, send.topic)
        else:  # acknowledged, or refused at once (not connected, invalid): said now
            wait_ack(future, send.timeout, send.topic)
        return result

    def _encrypted(
        self,
        send: Send,
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
            result = publish_chunks(self._conn, replace(send, properties=props), stored.source)
        return replace(result, size=source.size, sha256=stored.plain_sha256)

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Wait, at most `timeout` seconds, until every queued QoS 0 PUBLISH is written
        (or lost with the connection)."""
        self._window.flush(timeout)

    def _packet_size(
        self, send: Send, payload_size: int, properties: PublishProperties | None = None
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

    def _offloaded(
        self, endpoint: str, send: Send, source: PayloadSource, message_id: MessageId | None
    ) -> PublishResult:
        self._warn_plain_http(endpoint)
        message_id = message_id or MessageId.new()
        # Through the gateway an encrypted payload is sealed while it is sent.
        stream = self._direct_store() is None
        with self._sealer.seal(send.topic, source, stream=stream) as stored:
            linkable = not stored.encoding.encrypted
            url = self._uploader.upload(
                endpoint, send, stored.source, message_id, linkable=linkable
            )
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
        self, send: Send, ref: _placeholder.Placeholder, properties: PublishProperties | None
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
        send = Send(topic, qos, False, properties, self.max_packet_size, None)
        message_id = MessageId.new()
        with (
            PayloadSource(payload, spool_dir=self._settings.spool_dir) as source,
            self._sealer.seal(topic, source) as stored,  # an encrypt_to topic's Will too
        ):
            url = self._uploader.upload(endpoint, send, stored.source, message_id)
            ref = _placeholder.Placeholder(
                url, stored.source.size, stored.source.sha256, message_id, stored.encoding
            )
        body, props = ref.encode(properties, protocol=self._settings.protocol)
        return body, props, url
