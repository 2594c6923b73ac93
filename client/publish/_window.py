"""The QoS 0 window: PUBLISHes left to paho's thread to write, bounded in count and bytes.

MQTT promises no more for QoS 0 (at most once), and waiting for each write cost a round
trip to paho's thread: 7,000 delivered messages per second against plain paho's 50,000
(bench/RESULTS.md, "QoS 0 publishes"). The window keeps what paho buffers bounded;
`Client.close` waits for the rest to be written (:meth:`Qos0Window.flush`): paho's own
disconnect may stop its loop before it writes them.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures

from ..core._exceptions import ConnectionFailed

#: QoS 0 PUBLISHes that `publish` calls may leave queued and not yet written (at most this
#: many, and at most QOS0_WINDOW_BYTES of payload) before a call waits until half of them
#: are written.
QOS0_WINDOW = 256
QOS0_WINDOW_BYTES = 4 * 1024 * 1024
#: Most seconds `flush` waits for the QoS 0 PUBLISHes still queued to be written.
FLUSH_TIMEOUT = 5.0


class Qos0Window:
    """The QoS 0 PUBLISHes queued and not yet written, oldest first. Thread-safe."""

    def __init__(self) -> None:
        self._unwritten: deque[tuple[Future[None], int]] = deque()  # QoS 0, oldest first
        self._unwritten_bytes = 0
        self._unwritten_lock = threading.Lock()

    def written_later(
        self, future: Future[None], size: int, timeout: float | None, topic: str
    ) -> None:
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
        if target is not None and not wait_futures([target], timeout).done:
            raise ConnectionFailed(
                f"queued QoS 0 messages not written within {timeout}s; "
                f"{topic!r} is queued behind them"
            )

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Wait, at most `timeout` seconds, until every queued QoS 0 PUBLISH is written
        (or lost with the connection)."""
        with self._unwritten_lock:
            pending = [future for future, _ in self._unwritten]
            self._unwritten.clear()
            self._unwritten_bytes = 0
        wait_futures(pending, timeout)
