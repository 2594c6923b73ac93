"""The receive path: the worker thread that turns received PUBLISHes into deliveries.

Everything it reads is untrusted: anyone who may publish on a subscribed topic wrote the
message, its `__chunk` value and its placeholder. So a message can only ever become one
:class:`Message` or one :class:`MessageError` (an unexpected failure included, as a
:class:`ReceiveError` with its traceback logged), and the next message is always delivered.
Which origins a placeholder may be fetched from, and with which credentials, is
:class:`client.receive._fetcher.PlaceholderFetcher`'s rule.

Placeholders are fetched by a pool of `fetch_concurrency` threads, and deliveries leave
in order per topic (or in strict arrival order with `ordering = "arrival"`) through a
:class:`client.receive._ordering.Sequencer`, which also bounds how many messages and bytes are
outstanding. A transient fetch failure (no connection, a reset, a timeout, a 5xx) is
retried with backoff for `fetch_retry_for` seconds, its topic's later messages waiting.

A partial chunked message waits for its next chunk as long as the session is still
delivering: `chunk_timeout` counts only while the client is connected and idle (nothing
received and not handled, nothing waiting for the application), from the latest moment it
was not (:meth:`Reassembler.keep_waiting`). MQTT keeps one publisher's messages in order per
topic, so a chunk sent after the first one is behind whatever the broker delivers
meanwhile: a slow consumer's backlog, a reconnect, the DUP resends after a broker restart.
With a persistent session the chunks' acknowledgements wait for the whole message too
(:class:`client.receive._session_acks.ChunkAcks`).
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable

from ..config._settings import ClientSettings
from ..core._exceptions import (
    MalformedPlaceholder,
    OffloadError,
    PayloadNotFound,
    ReceiveError,
)
from ..core._message import Message, MessageError, Payload, Route
from ..mqtt._paho import Incoming, MqttConnection
from ..protocol import PublishProperties, _placeholder
from ..protocol._chunk import CHUNK_PROPERTY
from ..protocol._reassembly import Error, Pending, Reassembler, chunk_bounds
from ..protocol._size import MAX_PACKET_SIZE
from ..seal._unseal import Unsealer, chunk_encoding, untagged
from ._chunkstore import SpoolingChunkStore
from ._fetcher import PlaceholderFetcher
from ._inbound import InboundQueue
from ._ordering import FetchPool, Sequencer, Slot
from ._session_acks import ChunkAcks, acknowledge_taken, combined

log = logging.getLogger("client")

Delivery = Message | MessageError
#: seconds between two warnings about shed QoS 0 messages.
SHED_WARNING_EVERY = 10.0


class Receiver:
    """Reassembles chunks, resolves placeholders and hands out deliveries, on one thread.

    Args:
        settings: the client's settings.
        conn: the MQTT connection (for the periodic discovery re-subscription).
        fetcher: resolves placeholders (on the fetch pool's threads).
        unsealer: decodes the payloads of encrypted or compressed chunked messages.
        use_discovery: whether the discovery topic is followed.
    """

    def __init__(
        self,
        *,
        settings: ClientSettings,
        conn: MqttConnection,
        fetcher: PlaceholderFetcher,
        unsealer: Unsealer,
        use_discovery: bool,
    ) -> None:
        s = settings
        self._settings = s
        self._conn = conn
        self._use_discovery = use_discovery
        self._unsealer = unsealer
        self.fetcher = fetcher
        self.inbound: InboundQueue[Incoming] = InboundQueue(
            s.max_pending_deliveries, s.max_pending_bytes
        )
        self._last_shed_warning = -SHED_WARNING_EVERY
        self.deliveries: queue.SimpleQueue[Delivery | object] = queue.SimpleQueue()
        self.sequencer = Sequencer(
            self.deliveries,
            max_pending=s.max_pending_deliveries,
            max_pending_bytes=s.max_pending_bytes,
            max_spool_bytes=s.max_spool_bytes,
            arrival_order=s.ordering == "arrival",
        )
        self._stop = threading.Event()
        # The ack of the message being processed, for its delivery's slot (_session_acks).
        self._ack: Callable[[], None] | None = None
        # Held chunk acks: at most half the broker's window (Receive Maximum), so that it
        # can always send the next chunk.
        self.chunk_acks = ChunkAcks(min(s.max_pending_deliveries, 65535) // 2)
        # Reassembly keeps at most spool_threshold bytes of chunks in RAM; bigger messages
        # are spooled to temporary files and delivered as spooled payloads (issue 3).
        self.chunk_store = SpoolingChunkStore(memory_limit=s.spool_threshold, directory=s.spool_dir)
        per_message, tracked = chunk_bounds(
            max_buffered_bytes=s.max_buffered_bytes,
            packet_limit=s.max_packet_size or MAX_PACKET_SIZE,
            ram_budget=s.spool_threshold,
        )
        self._reassembler = Reassembler(
            default_timeout=s.chunk_timeout,
            max_partial_messages=s.max_partial_messages,
            max_buffered_bytes=s.max_buffered_bytes,
            store=self.chunk_store,
            max_chunks_per_message=per_message,
            max_tracked_chunks=tracked,
            max_timeout=s.max_chunk_timeout,
        )

    def packet_limit_known(self, limit: int) -> None:
        """CONNACK told the packet limit: a smaller one allows more (smaller) chunks.

        Args:
            limit: the Maximum Packet Size in force.
        """
        s = self._settings
        # An int attribute the worker reads: one assignment, no lock needed.
        self._reassembler.max_chunks_per_message = chunk_bounds(
            max_buffered_bytes=s.max_buffered_bytes,
            packet_limit=limit,
            ram_budget=s.spool_threshold,
        )[0]

    def run(self, stop: threading.Event) -> None:
        """The worker thread's loop, until `stop` is set."""
        self._stop = stop
        s = self._settings
        pool = FetchPool(s.fetch_concurrency, per_key=s.fetches_per_origin)
        try:
            self._loop(stop, pool)
        finally:
            pool.close()

    def _busy(self) -> bool:
        """Whether a chunk still on its way may be held up by this client, not its sender.

        Disconnected: the broker keeps a persistent session's messages until the reconnect.
        Messages received and not yet handled, or deliveries the application has not taken:
        the broker's backlog for this client (Receive Maximum) waits for them.
        """
        return (
            not self._conn.connected or len(self.inbound) > 0 or self.sequencer.outstanding[0] > 0
        )

    def _expire(self, now: float) -> None:
        for error in self._reassembler.expire(now):
            self._emit_error(error)

    def _loop(self, stop: threading.Event, pool: FetchPool) -> None:
        last_refresh = time.monotonic()
        reassembler = self._reassembler
        while not stop.is_set():
            now = time.monotonic()
            busy = self._busy()
            if busy:
                reassembler.keep_waiting(now)
            deadline = reassembler.next_deadline
            wait = 0.5 if deadline is None else min(0.5, max(deadline - now, 0.0) + 0.01)
            item = self.inbound.get(timeout=wait)
            now = time.monotonic()
            if busy or self._busy():  # busy at either end of the wait: counted busy throughout
                reassembler.keep_waiting(now)
            if item is not None:
                # A partial whose quiet spell ran out before this message came fails first;
                # the rest wait on: the session delivers again.
                self._expire(now)
                reassembler.keep_waiting(now)
                self._ack = acknowledge_taken(self._conn, item, self._settings)
                try:
                    self._process(item, pool)
                except OffloadError as exc:  # an error about one message, never fatal
                    self._emit(item.topic, MessageError(item.topic, exc))
                except Exception as exc:  # a bug or the disk: still one message, not the client
                    log.exception("could not handle a message on %r", item.topic)
                    failure = ReceiveError(f"could not handle the message: {exc!r}"[:500])
                    self._emit(item.topic, MessageError(item.topic, failure))
                self._ack = None
                now = time.monotonic()
                reassembler.keep_waiting(now)  # busy until now (perhaps waiting for room)
            self._open_window()
            self._expire(now)
            refresh = self._settings.discovery_refresh
            if self._use_discovery and refresh > 0 and now - last_refresh > refresh:
                last_refresh = now
                if self._conn.connected:
                    self._conn.resubscribe(self._settings.discovery_topic)

    def _open_window(self) -> None:
        """Held chunk acknowledgements never shut the broker's window: acknowledgements go
        out in arrival order, so a held one holds back every later one (_session_acks)."""
        acks = self.chunk_acks
        while self._conn.ack_backlog > acks.limit and acks.release_oldest():
            pass

    def _take_ack(self) -> Callable[[], None] | None:
        ack, self._ack = self._ack, None
        return ack

    def note_shed(self, topic: str) -> None:
        """A QoS 0 message was shed at the bound (paho's thread): say so once per spell."""
        now = time.monotonic()
        if now - self._last_shed_warning > SHED_WARNING_EVERY:
            self._last_shed_warning = now
            log.warning(
                "QoS 0 message on %r dropped: the application is not keeping up "
                "(%d dropped so far; max_pending_deliveries, max_pending_bytes)",
                topic,
                self.inbound.shed,
            )

    def _emit(
        self, topic: str, delivery: Delivery, on_consumed: Callable[[], None] | None = None
    ) -> None:
        """Queue a ready delivery behind every earlier message on its topic.

        Its acknowledgement: `on_consumed` with the current message's, when not taken yet.
        """
        spooled = isinstance(delivery, Message) and delivery.body.path is not None
        size = delivery.body.size if isinstance(delivery, Message) else 0
        slot = self.sequencer.reserve(
            topic,
            0 if spooled else size,
            self._stop,
            disk=size if spooled else 0,
            on_consumed=combined((on_consumed, self._take_ack())),
        )
        if slot is not None:
            self.sequencer.fill(slot, delivery)

    def _emit_error(self, error: Error) -> None:
        """A chunked message failed: its error, acknowledging the chunks held for it."""
        key = None if error.message_id is None else (error.topic, error.message_id)
        self._emit(
            error.topic,
            MessageError(error.topic, error.error, error.message_id),
            self.chunk_acks.done(key, None),
        )

    def _process(self, incoming: Incoming, pool: FetchPool) -> None:
        props = incoming.properties
        if self._settings.protocol == 5 and chunk_header_present(props):
            self._process_chunk(incoming)
            return
        if self._settings.fetch_external and _placeholder.is_tagged(incoming.payload, props):
            try:
                ref = _placeholder.parse(incoming.payload, incoming.properties)
            except MalformedPlaceholder as exc:
                self._emit(incoming.topic, MessageError(incoming.topic, exc))
                return
            threshold = self._settings.spool_threshold
            slot = self.sequencer.reserve(
                incoming.topic,
                min(ref.size, threshold),
                self._stop,
                disk=ref.size if ref.size > threshold else 0,  # what the fetch spools
                message_id=str(ref.message_id),
                url=ref.url,
                on_consumed=self._take_ack(),
            )
            if slot is not None:
                pool.submit(lambda: self._fetch_into(slot, incoming, ref), str(ref.origin))
            return
        self._emit(
            incoming.topic,
            Message(
                incoming.topic,
                Payload(incoming.payload),
                hashlib.sha256(incoming.payload).hexdigest(),
                incoming.qos,
                incoming.retain,
                props,
            ),
        )

    def _fetch_into(self, slot: Slot, incoming: Incoming, ref: _placeholder.Placeholder) -> None:
        """A pool job: fetch a placeholder's payload and fill its slot, whatever happens."""
        if self._stop.is_set():  # closing: jobs still queued are dropped, not fetched
            self.sequencer.fill(slot, None)
            return
        try:
            delivery: Delivery | None = self.fetcher.resolve(incoming, ref, self._stop)
        except Exception as exc:  # a bug or the disk: still one message, not the client
            log.exception("could not fetch a message on %r", incoming.topic)
            failure = ReceiveError(f"could not handle the message: {exc!r}"[:500])
            delivery = MessageError(incoming.topic, failure, str(ref.message_id))
        if (
            self._settings.ignore_payload_not_found
            and isinstance(delivery, MessageError)
            and isinstance(delivery.error, PayloadNotFound)
        ):
            # The SQS extended client's ignorePayloadNotFound: expired or deleted objects
            # are skipped, visibly in the log only.
            log.warning(
                "skipped message %s on %r: %s", delivery.message_id, incoming.topic, delivery.error
            )
            delivery = None
        self.sequencer.fill(slot, delivery)

    def _process_chunk(self, incoming: Incoming) -> None:
        outcome = self._reassembler.feed(incoming, time.monotonic())
        ack = self._take_ack()  # this chunk's: held, or with its message's delivery
        for dropped in outcome.dropped:
            self._emit_error(dropped)
        if isinstance(outcome, Pending):
            key = (outcome.topic, outcome.message_id)
            if outcome.duplicate and not outcome.received:  # its message is done already
                self.chunk_acks.late(key, ack)
            else:
                self.chunk_acks.hold(key, outcome.index, ack, outcome.total)
            return
        # Done: the delivery (or the error replacing it, see _loop) carries every chunk's ack.
        done = None if outcome.message_id is None else (outcome.topic, outcome.message_id)
        self._ack = self.chunk_acks.done(done, ack)
        if isinstance(outcome, Error):
            self._emit(
                outcome.topic, MessageError(outcome.topic, outcome.error, outcome.message_id)
            )
        else:
            body = outcome.payload
            payload = Payload(body) if isinstance(body, bytes) else Payload(path=body)
            sha256, props = outcome.sha256, outcome.properties
            encoding = chunk_encoding(props)  # chunks of an encrypted/compressed payload
            if encoding is not None:
                payload, sha256 = self._unsealer.decode(encoding, payload)
                props = untagged(props)
            self._emit(
                outcome.topic,
                Message(
                    outcome.topic,
                    payload,
                    sha256,
                    outcome.qos,
                    False,
                    props,
                    Route.CHUNKED,
                    outcome.message_id,
                ),
            )


def chunk_header_present(props: PublishProperties) -> bool:
    """Whether a message claims to be an ADR-23 chunk (a malformed value still fails loudly)."""
    return props.user_property(CHUNK_PROPERTY) is not None
