"""The blocking client: publish any size, receive whole messages.

Threads and who may block:

* paho's network thread (:mod:`client.mqtt._paho`) only converts and enqueues, never waits
  (:mod:`client.receive._inbound`); discovery records are applied there because that is cheap and
  must not wait behind a slow fetch;
* one worker thread turns received messages into deliveries: chunks reassembled, chunk
  timeouts swept, the discovery subscription refreshed; placeholders are handed to a pool of
  `fetch_concurrency` fetch threads, and deliveries leave in order per topic
  (:mod:`client.receive._ordering`), so a slow fetch never holds up another topic;
* the application's thread(s) publish and iterate :meth:`Client.messages`.

Publishing only waits on futures completed by paho's thread, which never waits on anything,
so publishing from inside the message loop cannot deadlock.

Shared subscriptions (`$share/group/...`) hand the chunks of one ADR-23 message to different
members, so no member can reassemble it: each member reports a :class:`ChunkTimeoutError`
after the first chunk's Message Expiry Interval (else `chunk_timeout` of quiet, at most
`max_chunk_timeout`) or a :class:`ChunkBufferOverflow` when newer ones need the room, never
silence.
Offloaded messages have no such problem: the placeholder is one PUBLISH.

Every received message, discovery record and placeholder URL is untrusted (anyone who may
publish on a subscribed topic, or write the discovery topic, wrote it): nothing in one can
raise out of paho's thread or stop the worker.

This class is a facade: it merges the settings and wires four parts it owns, each in its
own module: the MQTT connection (:mod:`client.mqtt._paho`, injectable as `connection=`), the
publisher (:mod:`client.publish._publish`), the receiver with its worker
(:mod:`client.receive._receive`) and the discovery watcher (:mod:`client._discovery`); what
they are made with by default is :mod:`client._parts`. The credential-origin rule is
:func:`client.http._scram.gateway_auth` plus
:meth:`client.receive._fetcher.PlaceholderFetcher.auth_for`. The application takes its
deliveries from :mod:`client.receive._handout`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Unpack

import httpx

from ._discovery import DiscoveryView
from ._parts import default_connection, default_http_auth, default_transport, receive_path
from .config._load import load_settings, merge_settings
from .config._overrides import SettingsOverrides
from .config._settings import ClientSettings
from .core._message import Message, MessageError, PublishResult
from .core._source import PayloadLike
from .core._tracers import tracing_for
from .core._tracing import TracerProviderLike, Tracing
from .http._range import as_placeholder
from .http._transport import HttpTransport
from .mqtt._paho import Incoming, MqttConnection
from .protocol import DiscoveryRecord, MessageId, Placeholder, PublishProperties, TopicFilter
from .publish._publish import Publisher
from .publish._send import wait_ack
from .publish._will import Will
from .publish._will import arm as arm_will
from .receive._fetcher import FetchProgress, PlainHttpWarner
from .receive._handout import Handout
from .receive._receive import Delivery

log = logging.getLogger("client")


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
        connection: the MQTT connection to use (default: a new :class:`MqttConnection` from
            the settings), as httpx takes a `transport=`. Its broker, client id, protocol,
            keep-alive and CA file are then in force; the client connects and closes it.
        transport: the HTTP transport to the gateway (default: a new :class:`HttpTransport`).
        http_auth: credentials for the gateway, sent only to the advertised endpoint
            (same scheme, host and port) under hop-client's rule. Default: a bearer token
            when `http_token` is set, else SCRAM-SHA-512 with the broker's user name and
            password when both are set (:mod:`client.http._scram`), else none.
        on_fetch_progress: called as `(topic, bytes received, total)` while a placeholder's
            payload downloads (from a fetch thread, `fetch_concurrency` at once: keep it quick).
        tracer_provider: the OpenTelemetry `TracerProvider` spans are made with (docs/
            tracing.md). Default: OpenTelemetry's global one when `opentelemetry` is
            installed (the application's own; without one, contexts are only carried on),
            else none at all. A :class:`client.tracing.Tracing` is used as it is
            (`client.tracing.DISABLED`: no spans).
        **overrides: any :class:`ClientSettings` field, e.g. `automatic_offload=False`,
            `chunking=False`, `endpoint="http://gw:8000"`, `max_packet_size=65536`.
    """

    def __init__(
        self,
        broker: str | None = None,
        *,
        settings: ClientSettings | None = None,
        connection: MqttConnection | None = None,
        transport: HttpTransport | None = None,
        http_auth: httpx.Auth | None = None,
        on_fetch_progress: FetchProgress | None = None,
        tracer_provider: TracerProviderLike | Tracing | None = None,
        **overrides: Unpack[SettingsOverrides],
    ) -> None:
        if connection is not None:  # the connection's protocol is the one spoken
            overrides["protocol"] = connection.protocol
        s = merge_settings(settings, broker, dict(overrides))
        self.settings = s
        self._tracing = tracing_for(tracer_provider)
        self._owns_transport = transport is None
        self._transport = transport or default_transport(s)
        self._conn = connection or default_connection(s)
        self._conn.set_message_handler(self._on_message)
        self._http_auth = http_auth or default_http_auth(s, self._conn.broker)
        self._filters: dict[str, TopicFilter] = {}
        self._discovery = DiscoveryView(s)
        self._conn.on_connected(self._discovery.resubscribed)
        self._use_discovery = s.endpoint is None and (s.automatic_offload or s.fetch_external)
        warner = PlainHttpWarner()
        self._publisher = Publisher(
            settings=s,
            conn=self._conn,
            transport=self._transport,
            http_auth=self._http_auth,
            endpoint=self._discovery.settled_endpoint,
            warn_plain_http=warner,
            direct_store=self._discovery.direct_store,
            tracing=self._tracing,
        )
        self._receiver = receive_path(
            s,
            conn=self._conn,
            transport=self._transport,
            http_auth=self._http_auth,
            endpoint_in_force=self._discovery.settled_endpoint,
            direct_store=self._discovery.direct_store,
            warn_plain_http=warner,
            on_fetch_progress=on_fetch_progress,
            use_discovery=self._use_discovery,
            tracing=self._tracing,
        )
        self._handout = Handout(self._receiver.deliveries, self._receiver.sequencer, self._tracing)
        self._will = Will.from_settings(s)
        self._worker: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False

    @classmethod
    def from_config(
        cls,
        broker: str | None = None,
        *,
        config_file: str | os.PathLike[str] | None = None,
        connection: MqttConnection | None = None,
        transport: HttpTransport | None = None,
        http_auth: httpx.Auth | None = None,
        on_fetch_progress: FetchProgress | None = None,
        tracer_provider: TracerProviderLike | Tracing | None = None,
        **overrides: Unpack[SettingsOverrides],
    ) -> Client:
        """A client configured from keyword arguments > environment > config file > defaults.

        This is the edge that reads `OFFLOAD_*` from `os.environ`
        (see :mod:`client.config._load`).

        Args:
            broker: broker URL; falls back to `OFFLOAD_BROKER` / the config file.
            config_file: TOML file instead of `$OFFLOAD_CONFIG` or the default path.
            connection: as for the constructor.
            transport: as for the constructor.
            http_auth: as for the constructor.
            on_fetch_progress: as for the constructor.
            tracer_provider: as for the constructor.
            **overrides: settings that win over every other layer.
        """
        explicit: dict[str, object] = {"broker": broker, **overrides}
        return cls(
            settings=load_settings(explicit, environ=os.environ, config_file=config_file),
            connection=connection,
            transport=transport,
            http_auth=http_auth,
            on_fetch_progress=on_fetch_progress,
            tracer_provider=tracer_provider,
        )

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
                answer = self._conn.subscribe(self.settings.discovery_topic, 1)
                answer.add_done_callback(self._discovery.subscribed)
            if self._will is not None:  # now that CONNACK told the limit (client/publish/_will.py)
                try:
                    arm_will(self._will, self._conn, self._publisher, self.settings, timeout)
                except BaseException:
                    self._conn.close()  # not left connected without the Will it asked for
                    raise
        except BaseException:
            self._stop_worker()
            raise

    def close(self) -> None:
        """Disconnect, stop the worker and end :meth:`messages` iterators.

        QoS 0 messages still queued are written first (waiting at most 5 s).
        """
        self._closed = True
        self._publisher.flush()  # paho's disconnect may stop its loop before writing them
        self._conn.close()
        self._stop_worker()
        self._receiver.chunk_store.close()
        self._handout.close()
        if self._owns_transport:
            self._transport.close()

    def _stop_worker(self) -> None:
        self._stop.set()
        self._receiver.inbound.wake()
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
    def connection(self) -> MqttConnection:
        """The MQTT connection in use (given as `connection=` or made from the settings)."""
        return self._conn

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def max_packet_size(self) -> int:
        """The limit in force: CONNACK's Maximum Packet Size, else the configured one."""
        return self._publisher.max_packet_size

    @property
    def endpoint(self) -> str | None:
        """The offload endpoint in force: configured, else the discovered one (or None)."""
        return self._discovery.endpoint()

    @property
    def discovery_record(self) -> DiscoveryRecord | None:
        """The discovery record currently in force, if any."""
        return self._discovery.current()

    @property
    def discovery_refused(self) -> str | None:
        """Why the broker refused the subscription to the discovery topic, if it did (the
        client then discovers no gateway)."""
        return self._discovery.refused

    def wait_for_endpoint(self, timeout: float) -> str | None:
        """Wait up to `timeout` seconds for a discovery record; the endpoint or None.

        Args:
            timeout: seconds to wait.
        """
        return self._discovery.wait_endpoint(timeout)

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
            timeout: seconds to wait for the broker's acknowledgements (QoS 0: for room
                among the messages queued and not yet written); None waits forever.
            message_id: the id an offloaded payload is stored under (default: a new
                UUID). An application that retries a publish after a crash passes the same
                id: the gateway keeps one object and the placeholder is published once the
                upload is confirmed.

        Returns:
            How the message went: route, size, SHA-256, message id and URL. A QoS 1/2
            message was acknowledged; a QoS 0 one is queued (up to 256 of them, 4 MiB,
            wait to be written; lost if the connection drops first: at most once).

        Raises:
            MessageTooLarge: it does not fit and neither offload nor chunking may be used.
            AccessRefused: the gateway refused the login or the access (401/403) and
                `fallback_on_auth_failure` is off (the default).
            UploadError: the upload failed and chunking cannot take over.
            ConnectionFailed: not connected, or no acknowledgement within `timeout`.
            PublishRejected: the broker refused the PUBLISH.
            ProtocolError: an invalid topic or properties.
        """
        return self._publisher.publish(
            topic,
            payload,
            qos=qos,
            retain=retain,
            properties=properties,
            timeout=timeout,
            message_id=message_id,
        )

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
        wait_ack(self._conn.subscribe(topic_filter, qos), timeout, topic_filter)

    def unsubscribe(self, topic_filter: str) -> None:
        """Stop receiving `topic_filter` (also after reconnects).

        Args:
            topic_filter: a filter given to :meth:`subscribe`.
        """
        self._filters.pop(topic_filter, None)
        if not (self._use_discovery and topic_filter == self.settings.discovery_topic):
            self._conn.unsubscribe(topic_filter)

    def next_message(self, timeout: float | None = None) -> Delivery | None:
        """The next delivery, or None when `timeout` passes first or the client closed.

        With tracing, a message the library resolved (offloaded, chunked) is handed over in
        a `receive {topic}` span: a child of the caller's current span, else of the
        message's creation context, and linked to the latter (docs/tracing.md). A direct
        message gets none (it is a plain PUBLISH); :attr:`Message.trace_context` is the
        creation context of either.

        Args:
            timeout: seconds to wait; None waits until a delivery or close.
        """
        return self._handout.take(timeout)

    def fetch_range(self, placeholder: Placeholder | Message, start: int, end: int) -> bytes:
        """Bytes `[start, end)` of an offloaded payload, reading only the stored bytes
        that hold them (docs/encryption.md, "Ranges").

        For placeholders delivered as they are (`fetch_external=False`) or made elsewhere.
        A plain payload is one HTTP Range request; an encrypted one reads its age header,
        then only the 64 KiB chunks that hold the range, each authenticated and decrypted
        on its own with `identity_files`. The origin and credential rules of a whole fetch
        apply. A plain range is not checked against the placeholder's SHA-256 (it covers
        the whole object); an encrypted one is authenticated chunk by chunk.

        Args:
            placeholder: a :class:`~client.protocol.Placeholder`, or a message that is one.
            start: the first byte (0-based).
            end: one past the last byte; past the payload's end reads up to its end.

        Returns:
            The bytes (fewer than asked at the payload's end, none past it).

        Raises:
            ValueError: `start < 0`, `end < start`, or more than `max_fetch_bytes` asked.
            MalformedPlaceholder: the message is not a placeholder.
            UntrustedEndpoint: its origin may not be fetched from (see `discovery_allowlist`).
            PayloadDecodeError: a compressed payload (fetch it whole), no matching identity
                (:class:`NoMatchingIdentity`), a damaged or truncated object.
            FetchError: no answer, an error status, a redirect refused, an answer that is
                not the range asked for (a server that ignores Range is refused, not read).
        """
        if start < 0 or end < start or end - start > self.settings.max_fetch_bytes:
            raise ValueError(f"range [{start}, {end}) is not 0 <= start <= end, max_fetch_bytes")
        topic, creation = None, None
        if isinstance(placeholder, Message):  # its topic and creation context name the span
            topic, creation = placeholder.topic, placeholder.trace_context
        return self._receiver.fetcher.fetch_range(
            as_placeholder(placeholder), start, end, topic=topic, creation=creation
        )

    def messages(
        self, timeout: float | None = None, *, report_unfinished: bool = False
    ) -> Iterator[Delivery]:
        """Received messages, and errors about messages that could not be delivered.

        Args:
            timeout: stop after this many seconds without a delivery; None: until close.
            report_unfinished: when `timeout` ends the iteration, first yield a
                :class:`MessageError` (a :class:`FetchError`) naming each placeholder whose
                payload is still being fetched (it is still delivered later, if read).

        Yields:
            :class:`Message` (whole, verified payload) or :class:`MessageError`.
        """
        while (item := self.next_message(timeout)) is not None:
            yield item
        if report_unfinished:
            yield from unfinished_errors(self, timeout)

    def _unfinished(self, waited: float | None) -> list[MessageError]:
        return [] if self._closed else self._handout.unfinished(waited)

    # -- paho thread (never block) ---------------------------------------------------------

    def _on_message(self, incoming: Incoming) -> None:
        if self._use_discovery and incoming.topic == self.settings.discovery_topic:
            expiry = incoming.properties.message_expiry_interval
            self._discovery.feed(incoming.payload, expiry)  # never raises
            if not any(f.matches(incoming.topic) for f in list(self._filters.values())):
                self._conn.ack(incoming)
                return
        # Never waits (client/receive/_inbound.py): QoS 0 beyond the bound is shed.
        if not self._receiver.inbound.put(
            incoming, len(incoming.payload), sheddable=not incoming.qos
        ):
            self._receiver.note_shed(incoming.topic)


def unfinished_errors(client: Client, waited: float | None) -> list[MessageError]:
    """One error per placeholder of `client` still being fetched (`report_unfinished`).

    Args:
        client: the client.
        waited: the seconds waited without a delivery (for the error's text).
    """
    return client._unfinished(waited)
