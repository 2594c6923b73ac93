"""The application's end of the receive path: deliveries taken one at a time.

The worker (:mod:`client.receive._receive`) puts deliveries on a queue in the order the
:class:`~client.receive._ordering.Sequencer` keeps; the application's thread(s) take them
here: each taken one frees its room, a message the library resolved gets its `receive
{topic}` span as it is handed over, and a close ends every iterator waiting on the queue.
"""

from __future__ import annotations

import queue

from ..core._exceptions import FetchError
from ..core._message import Message, MessageError, Route
from ..core._tracing import Tracing, message_attributes
from ._ordering import Sequencer
from ._receive import Delivery

_CLOSED = object()


class Handout:
    """Where the application takes deliveries from (:meth:`client.Client.next_message`).

    Args:
        deliveries: the worker's queue of deliveries, in order.
        sequencer: told of each delivery taken, and asked which are still being fetched.
        tracing: where the `receive` spans come from.
    """

    def __init__(
        self,
        deliveries: queue.SimpleQueue[Delivery | object],
        sequencer: Sequencer,
        tracing: Tracing,
    ) -> None:
        self._deliveries = deliveries
        self._sequencer = sequencer
        self._tracing = tracing

    def take(self, timeout: float | None) -> Delivery | None:
        """The next delivery, or None when `timeout` passes first or the handout closed."""
        deliveries = self._deliveries
        try:
            item = deliveries.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _CLOSED:
            deliveries.put(_CLOSED)  # let every other iterator end too
            return None
        assert isinstance(item, Message | MessageError)
        self._sequencer.consumed(item)
        if self._tracing.enabled and isinstance(item, Message):
            received(self._tracing, item)
        return item

    def close(self) -> None:
        """End every :meth:`take` waiting now or later (after the deliveries queued)."""
        self._deliveries.put(_CLOSED)

    def unfinished(self, waited: float | None) -> list[MessageError]:
        """One error per placeholder still being fetched (`report_unfinished`).

        Args:
            waited: the seconds waited without a delivery (for the error's text).
        """
        errors = []
        for slot in self._sequencer.unfinished():
            assert slot.url is not None  # unfinished() lists placeholders only
            stuck = FetchError(slot.url, f"still being fetched after {waited} s without a delivery")
            errors.append(MessageError(slot.topic, stuck, slot.message_id))
        return errors


def received(tracing: Tracing, message: Message) -> None:
    """The `receive {topic}` span of a message handed to the application (see
    :meth:`Client.next_message`)."""
    if message.route is Route.DIRECT:
        return  # a plain PUBLISH: nothing of the library's (client/publish/_spans.py)
    creation = message.trace_context
    attributes = message_attributes(
        message.topic, message.size, "receive", "receive", message.message_id
    )
    attributes["offload.route"] = str(message.route)
    links = (creation,) if creation is not None else ()
    tracing.start(
        f"receive {message.topic}",
        "client",
        parent=creation,
        use_ambient=True,
        links=links,
        attributes=attributes,
    ).end()
