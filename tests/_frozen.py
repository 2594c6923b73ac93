"""A peer that accepts and never answers, and a watch on how long a call waits for it.

:func:`frozen` stops a real process with SIGSTOP (its kernel still accepts connections and
takes bytes until the socket buffers are full, then nothing: what a wedged gateway looks
like to its callers) and resumes it with SIGCONT. :func:`ends_within` runs a call on a
thread of its own and fails the test if the call is still waiting past its bound, so a
call that would wait for ever fails instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

#: What a call may take beyond its timeout: thread start, a loaded machine's scheduling.
SLACK = 1.5


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[None]:
    """The process `pid` stopped (SIGSTOP) inside the block, resumed (SIGCONT) after it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@dataclass
class Ended:
    """How a call ended: its result or its exception, and the seconds it took."""

    seconds: float = 0.0
    result: Any = None
    error: BaseException | None = None


def ends_within(call: Callable[[], Any], timeout: float, slack: float = SLACK) -> Ended:
    """Run `call`; it must end within `timeout` + `slack` seconds (not necessarily raise).

    Raises:
        AssertionError: still waiting then (the thread is left to its daemon fate), or
            it took longer.
    """
    ended = Ended()

    def run() -> None:
        start = time.monotonic()
        try:
            ended.result = call()
        except BaseException as exc:
            ended.error = exc
        ended.seconds = time.monotonic() - start

    thread = threading.Thread(target=run, name="ends-within", daemon=True)
    thread.start()
    thread.join(timeout + slack + 10)
    assert not thread.is_alive(), (
        f"still waiting {timeout + slack + 10:.0f} s on (timeout {timeout} s)"
    )
    assert ended.seconds <= timeout + slack, (
        f"took {ended.seconds:.1f} s, timeout {timeout} s: {ended.error!r}"
    )
    return ended
