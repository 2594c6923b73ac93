"""The blocking client: publish any size, receive whole messages.

Threads and who may block:

* paho's network thread (:mod:`client._paho`) only converts and enqueues; discovery records
  are applied there because that is cheap and must not wait behind a slow fetch;
* one worker thread turns received messages into deliveries: placeholders are fetched (HTTP),
  chunks reassembled, chunk timeouts swept, the discovery subscription refreshed;
* the application's thread(s) publish and iterate :meth:`Client.messages`.

Publishing only waits on futures completed by paho's thread, which never waits on anything,
so publishing from inside the message loop cannot deadlock.

Shared subscriptions (`$share/group/...`) hand the chunks of one ADR-23 message to different
members, so no member can reassemble it: each member reports a :class:`ChunkTimeoutError`
after the first chunk's Message Expiry Interval (else `chunk_timeout`), never silence.
Offloaded messages have no such problem: the placeholder is one PUBLISH.

Every received message, discovery record and placeholder URL is untrusted (anyone who may
publish on a subscribed topic, or write the discovery topic, wrote it): nothing in one can
raise out of paho's thread or stop the worker. The worker's half lives in
:mod:`client._receive`, the discovery view in :mod:`client._discovery`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from types import TracebackType
from typing import Unpack

import httpx

from ._config import ClientSettings, SettingsOverrides, load_settings
from ._discovery import DiscoveryView
from ._exceptions import (
    ConnectionFailed,
    MessageTooLarge,
    ProtocolError,
    UploadError,
)
from ._http import HttpTransport
from ._message import Message, MessageError, PublishResult, Route
from ._paho import Incoming, MqttConnection
from ._receive import Delivery, FetchProgress, PlainHttpWarner, Receiver
from ._router import choose_route
from ._scram import gateway_auth
from ._source import PayloadLike, PayloadSource
from .protocol import (
    DiscoveryRecord,
    MessageId,
    PublishProperties,
    Topic,
    TopicFilter,
    _placeholder,
)
from .protocol._chunk import plan_chunks
from .protocol._size import MAX_PACKET_SIZE, publish_packet_size

UPLOAD_ATTEMPTS = 2  # per offloaded publish, same message id each time

log = logging.getLogger("client")

_CLOSED = object()
#: Chunk publishes outstanding at once: bounds what paho buffers for a huge chunked message.
CHUNK_WINDOW = 32


class Client:
    """An MQTT client that carries messages of any size (offload, else ADR-23 chunks).

    Use as a context manager (connects on enter, disconnects on exit)::

        with Client("mqtt://localhost:1883") as client:
            client.subscribe("sensors/#")
            client.publish("sensors/cam1", Path("frame.raw"), qos=1)
            for msg in client.messages(timeout=5):
                ...

    Args:
        broker: `mqtt[s]://[user:pass@]host[:port]`.
        settings: a complete settings object (e.g. from :func:`client.load_settings`);
            keyword overrides apply on top of it.
        transport: the HTTP transport to the gateway (default: a new :class:`HttpTransport`).
        http_auth: credentials for the gateway, sent only to the advertised endpoint
            (same scheme, host and port) under hop-client's rule. Default: a bearer token
            when `http_token` is set, else SCRAM-SHA-512 with the broker's user name and
            password when both are set (:mod:`client._scram`), else none.
        on_fetch_progress: called as `(topic, bytes received, total)` while a placeholder's
            payload downloads (from the client's worker thread: keep it quick).
        **overrides: any :class:`ClientSettings` field, e.g. `automatic_offload=False`,
            `chunking=False`, `endpoint="http://gw:8000"`, `max_packet_size=65536`.
    """

    def __init__(
        self,
        broker: str | None = None,
        *,
        settings: ClientSettings | None = None,
        transport: HttpTransport | None = None,
        http_auth: httpx.Auth | None = None,
        on_fetch_progress: FetchProgress | None = None,
        **overrides: Unpack[SettingsOverrides],
    ) -> None:
        base = settings or ClientSettings()
        changes: dict[str, object] = dict(overrides)
        if broker is not None:
            changes["broker"] = broker
        self.settings = dataclasses.replace(base, **changes)  # type: ignore[arg-type]
        s = self.settings
        self._owns_transport = transport is None
        self._transport = transport or HttpTransport(
            timeout=s.http_timeout,
            verify=ssl.create_default_context(cafile=s.ca_file) if s.ca_file else True,
        )
        broker_login = s.broker_url
        self._http_auth = http_auth or gateway_auth(
            username=broker_login.username, password=broker_login.password, token=s.http_token
        )
        self._filters: dict[str, TopicFilter] = {}
        self._discovery = DiscoveryView(s)
        self._use_discovery = s.endpoint is None and (s.automatic_offload or s.fetch_external)
        self._warn_plain_http = PlainHttpWarner()
        self._conn = MqttConnection(
            s.broker_url,
            on_message=self._on_message,
            on_connect=self._on_connect,
            client_id=s.client_id,
            protocol=s.protocol,
            keepalive=s.keepalive,
            ca_file=s.ca_file,
        )
        self._receiver = Receiver(
            settings=s,
            transport=self._transport,
            http_auth=self._http_auth,
            conn=self._conn,
            endpoint_in_force=self._endpoint_for_publish,
            warn_plain_http=self._warn_plain_http,
            use_discovery=self._use_discovery,
            on_fetch_progress=on_fetch_progress,
        )
        self._inbound = self._receiver.inbound
        self._deliveries = self._receiver.deliveries
        self._worker: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False

    @classmethod
    def from_config(
        cls,
        broker: str | None = None,
        *,
        config_file: str | os.PathLike[str] | None = None,
        transport: HttpTransport | None = None,
        http_auth: httpx.Auth | None = None,
        **overrides: Unpack[SettingsOverrides],
    ) -> Client:
        """A client configured from keyword arguments > environment > config file > defaults.

        This is the edge that reads `OFFLOAD_*` from `os.environ` (see :mod:`client._config`).

        Args:
            broker: broker URL; falls back to `OFFLOAD_BROKER` / the config file.
            config_file: TOML file instead of `$OFFLOAD_CONFIG` or the default path.
            transport: as for the constructor.
            http_auth: as for the constructor.
            **overrides: settings that win over every other layer.
        """
        explicit: dict[str, object] = {"broker": broker, **overrides}
        settings = load_settings(explicit, environ=os.environ, config_file=config_file)
        return cls(settings=settings, transport=transport, http_auth=http_auth)

    # -- lifecycle -------------------------------------------------------------------------

    def connect(self, timeout: float = 10.0) -> None:
        """Connect to the broker, start the worker and subscribe to discovery.

        Args:
            timeout: seconds to wait for CONNACK.

        Raises:
            ConnectionFailed: the broker is unreachable or refused the connection.
        """
        if self.settings.protocol != 5 and self.settings.max_packet_size is None:
            # 3.1.1 has no CONNACK limit: an oversize PUBLISH gets us disconnected, and paho
            # re-sends a QoS>0 one after every reconnect.
            log.warning("MQTT 3.1.1 brokers do not state a packet limit: set max_packet_size")
        self._stop.clear()
        self._worker = threading.Thread(
            target=self._receiver.run, args=(self._stop,), name="offload-worker", daemon=True
        )
        self._worker.start()
        try:
            self._conn.connect(timeout)
            self._receiver.packet_limit_known(self.max_packet_size)
            if self._use_discovery:
                self._conn.subscribe(self.settings.discovery_topic, 1)
        except BaseException:
            self._stop_worker()
            raise

    def close(self) -> None:
        """Disconnect, stop the worker and end :meth:`messages` iterators."""
        self._closed = True
        self._conn.close()
        self._stop_worker()
        self._receiver.chunk_store.close()
        self._deliveries.put(_CLOSED)
        if self._owns_transport:
            self._transport.close()

    def _stop_worker(self) -> None:
        self._stop.set()
        self._inbound.put(_CLOSED)
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(10)
        self._worker = None

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- state -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def max_packet_size(self) -> int:
        """The limit in force: CONNACK's Maximum Packet Size, else the configured one."""
        return self._conn.max_packet_size or self.settings.max_packet_size or MAX_PACKET_SIZE

    @property
    def endpoint(self) -> str | None:
        """The offload endpoint in force: configured, else the discovered one (or None)."""
        if self.settings.endpoint is not None:
            return self.settings.endpoint
        record = self._discovery.current()
        return record.endpoint if record else None

    @property
    def discovery_record(self) -> DiscoveryRecord | None:
        """The discovery record currently in force, if any."""
        return self._discovery.current()

    def wait_for_endpoint(self, timeout: float) -> str | None:
        """Wait up to `timeout` seconds for a discovery record; the endpoint or None.

        Args:
            timeout: seconds to wait.
        """
        record = self._discovery.wait(timeout)
        return record.endpoint if record else self.settings.endpoint

    # -- publishing ------------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        payload: PayloadLike,
        *,
        qos: int = 0,
        retain: bool = False,
        properties: PublishProperties | None = None,
        timeout: float | None = 60.0,
        message_id: MessageId | str | None = None,
    ) -> PublishResult:
        """Publish a message of any size: directly, offloaded, or in ADR-23 chunks.

        Args:
            topic: topic name (no wildcards).
            payload: bytes, text (UTF-8), a binary file object (read from its position) or a
                path; files are streamed, never loaded whole unless sent as one packet.
            qos: 0, 1 or 2; also used for the placeholder or every chunk.
            retain: retain flag (kept on a placeholder; chunks are never retained, since a
                broker would keep only the last chunk).
            properties: MQTT 5 properties (must be None or empty for MQTT 3.1.1).
            timeout: seconds to wait for the broker's acknowledgements; None waits forever.
            message_id: the id an offloaded payload is stored under (default: a new
                UUID). An application that retries a publish after a crash passes the same
                id: the gateway keeps one object and the placeholder is published once the
                upload is confirmed.

        Returns:
            How the message went: route, size, SHA-256, message id and URL.

        Raises:
            MessageTooLarge: it does not fit and neither offload nor chunking may be used.
            UploadError: the upload failed and chunking cannot take over.
            ConnectionFailed: not connected, or no acknowledgement within `timeout`.
            PublishRejected: the broker refused the PUBLISH.
            ProtocolError: an invalid topic or properties.
        """
        Topic(topic)
        if isinstance(message_id, str):
            message_id = MessageId.parse(message_id)
        s = self.settings
        if s.protocol != 5:
            if properties is not None and properties != PublishProperties():
                raise ProtocolError("MQTT 3.1.1 cannot carry publish properties")
            properties = None
        with PayloadSource(payload) as source:
            limit = self.max_packet_size
            try:
                packet = publish_packet_size(
                    topic, source.size, qos=qos, properties=properties, protocol=s.protocol
                )
            except MessageTooLarge as exc:
                packet = exc.size
            over_threshold = s.offload_threshold is not None and source.size > s.offload_threshold
            endpoint = None
            if s.automatic_offload and (packet > limit or over_threshold):
                endpoint = self._endpoint_for_publish()
            route = choose_route(
                packet_size=packet,
                payload_size=source.size,
                limit=limit,
                offload_threshold=s.offload_threshold,
                endpoint_known=endpoint is not None,
                automatic_offload=s.automatic_offload,
                chunking=s.chunking and s.protocol == 5,
            )
            if route is Route.OFFLOADED:
                assert endpoint is not None
                try:
                    return self._publish_offloaded(
                        endpoint,
                        topic,
                        source,
                        qos,
                        retain,
                        properties,
                        limit,
                        timeout,
                        message_id=message_id,
                    )
                except UploadError as exc:
                    if packet <= limit:
                        log.warning("offload failed (%s); publishing directly instead", exc)
                        route = Route.DIRECT
                    elif s.chunking and s.protocol == 5:
                        log.warning("offload failed (%s); falling back to chunking", exc)
                        route = Route.CHUNKED
                    else:
                        raise
            if route is Route.CHUNKED:
                return self._publish_chunked(topic, source, qos, retain, properties, limit, timeout)
            future = self._conn.publish(
                topic, source.read_all(), qos=qos, retain=retain, properties=properties
            )
            # Hash while the PUBACK travels: the small-message hot path (bench/small_messages.py).
            result = PublishResult(topic, Route.DIRECT, source.size, source.sha256)
            self._wait(future, timeout, topic)
            return result

    def _endpoint_for_publish(self) -> str | None:
        """The endpoint, waiting briefly for the retained record after a (re)subscribe.

        Also the trusted origin for fetches: a retained placeholder may arrive just before
        the retained discovery record it points at.
        """
        if self.settings.endpoint is not None:
            return self.settings.endpoint
        record = self._discovery.settled()
        return record.endpoint if record else None

    def _publish_offloaded(
        self,
        endpoint: str,
        topic: str,
        source: PayloadSource,
        qos: int,
        retain: bool,
        properties: PublishProperties | None,
        limit: int,
        timeout: float | None,
        *,
        message_id: MessageId | None = None,
    ) -> PublishResult:
        self._warn_plain_http(endpoint)
        message_id = message_id or MessageId.new()
        headers = [(k, v.encode()) for k, v in (properties.user_properties if properties else ())]
        attempt = 0
        while True:
            try:
                receipt = self._transport.upload(
                    endpoint,
                    topic,
                    source,
                    message_id=message_id,
                    headers=headers,
                    auth=self._http_auth,
                    # The payload need not outlive the placeholder that points at it.
                    ttl=properties.message_expiry_interval if properties else None,
                )
                break
            except UploadError as exc:
                # A dropped connection or a 5xx may have stored the payload or not: the
                # same id again is safe (the gateway answers an identical re-upload with
                # success and keeps one object), so retry before giving up.
                transient = exc.status is None or exc.status >= 500
                attempt += 1
                if not transient or attempt >= UPLOAD_ATTEMPTS:
                    raise
                log.info(
                    "upload attempt %d failed (%s); retrying with id %s", attempt, exc, message_id
                )
                time.sleep(0.2 * attempt)
        ref = _placeholder.Placeholder(receipt.url, source.size, source.sha256, message_id)
        body, props = ref.encode(properties, protocol=self.settings.protocol)
        size = publish_packet_size(
            topic, len(body), qos=qos, properties=props, protocol=self.settings.protocol
        )
        if size > limit:
            raise MessageTooLarge(size, limit, "even the placeholder does not fit")
        future = self._conn.publish(topic, body, qos=qos, retain=retain, properties=props)
        self._wait(future, timeout, topic)
        return PublishResult(
            topic, Route.OFFLOADED, source.size, source.sha256, str(message_id), receipt.url
        )

    def _publish_chunked(
        self,
        topic: str,
        source: PayloadSource,
        qos: int,
        retain: bool,
        properties: PublishProperties | None,
        limit: int,
        timeout: float | None,
    ) -> PublishResult:
        if retain:
            log.warning("retain flag dropped: a broker would retain only the last chunk")
        plan = plan_chunks(
            topic=topic,
            payload_size=source.size,
            sha256_hex=source.sha256,
            message_id=MessageId.new(),
            qos=qos,
            properties=properties,
            limit=limit,
        )
        window: list[Future[None]] = []
        for chunk in plan:
            data = source.read_at(chunk.offset, chunk.length)
            window.append(
                self._conn.publish(topic, data, qos=qos, retain=False, properties=chunk.properties)
            )
            if len(window) >= CHUNK_WINDOW:
                self._wait(window.pop(0), timeout, topic)
        for future in window:
            self._wait(future, timeout, topic)
        return PublishResult(
            topic, Route.CHUNKED, source.size, source.sha256, plan.message_id, None, plan.total
        )

    @staticmethod
    def _wait(future: Future[None], timeout: float | None, topic: str) -> None:
        try:
            future.result(timeout)
        except FutureTimeout as exc:
            raise ConnectionFailed(f"no acknowledgement for {topic!r} within {timeout}s") from exc

    # -- subscribing and receiving ---------------------------------------------------------

    def subscribe(self, topic_filter: str, qos: int = 1, *, timeout: float = 10.0) -> None:
        """Subscribe (restored after every reconnect) and wait for SUBACK.

        Args:
            topic_filter: MQTT topic filter.
            qos: maximum QoS to receive.
            timeout: seconds to wait for SUBACK.

        Raises:
            ConnectionFailed: the broker refused the subscription or did not answer.
        """
        parsed = TopicFilter(topic_filter)
        self._filters[topic_filter] = parsed
        future = self._conn.subscribe(topic_filter, qos)
        self._wait(future, timeout, topic_filter)

    def unsubscribe(self, topic_filter: str) -> None:
        """Stop receiving `topic_filter` (also after reconnects)."""
        self._filters.pop(topic_filter, None)
        if not (self._use_discovery and topic_filter == self.settings.discovery_topic):
            self._conn.unsubscribe(topic_filter)

    def next_message(self, timeout: float | None = None) -> Delivery | None:
        """The next delivery, or None when `timeout` passes first or the client closed.

        Args:
            timeout: seconds to wait; None waits until a delivery or close.
        """
        try:
            item = self._deliveries.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _CLOSED:
            self._deliveries.put(_CLOSED)  # let every other iterator end too
            return None
        assert isinstance(item, Message | MessageError)
        return item

    def messages(self, timeout: float | None = None) -> Iterator[Delivery]:
        """Received messages, and errors about messages that could not be delivered.

        Args:
            timeout: stop after this many seconds without a delivery; None: until close.

        Yields:
            :class:`Message` (whole, verified payload) or :class:`MessageError`.
        """
        while (item := self.next_message(timeout)) is not None:
            yield item

    # -- paho thread (never block) ---------------------------------------------------------

    def _on_connect(self) -> None:
        # paho re-subscribed: the retained record is on its way; let a large publish wait.
        self._discovery.resubscribed()

    def _on_message(self, incoming: Incoming) -> None:
        if self._use_discovery and incoming.topic == self.settings.discovery_topic:
            expiry = incoming.properties.message_expiry_interval
            self._discovery.feed(incoming.payload, expiry)  # never raises
            if not any(f.matches(incoming.topic) for f in list(self._filters.values())):
                return
        self._inbound.put(incoming)
