"""One request at a time per resumable upload on this replica (tusd's upload locks).

A client that loses a PATCH often knows before the server does, and resumes at once: HEAD
for the offset, then PATCH from there, while the server is still reading or storing the
old PATCH. Without a lock the HEAD answers the offset from before the old PATCH, the old
PATCH then moves the upload on, and the resumed PATCH gets 409 (tus-js-client after a page
reload: its parallel parts' PATCHes were still in flight at the gateway). So each request
on an upload holds it, and a newer request waits for the one before, as tusd's locks make
it (https://tus.github.io/tusd/advanced-topics/locks):

* the newer request waits for the earlier one to finish: a PATCH whose body has arrived is
  being stored and ends in moments, one whose client went away ends when the connection
  drops. So a HEAD answers the offset the next PATCH will find, and a HEAD that polls the
  progress of a live upload never breaks it;
* a PATCH that has waited `stall` seconds for its client's next body bytes while another
  request waits (a connection that died without a word) is stopped: its segment is
  discarded (a PATCH keeps all of its bytes or none) and it answers 400. Time spent on the
  store is not the client's: a PATCH storing what it received is waited for. A DELETE stops
  a PATCH at once: the owner ends the upload;
* past `wait` seconds the newer request is answered 423 Locked with `Retry-After`, which
  tus clients retry.

Per replica: requests for one upload at two replicas at once are caught only by the offset
re-read in `ResumableUploads.append` (409), as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ..core import BadRequest, GatewayError

#: How long a request waits for another one on the same upload to finish (tusd's
#: default lock acquisition timeout is 20 seconds too).
LOCK_WAIT = 20.0
#: A PATCH that received no body bytes for this long while another request waits is
#: taken for dead (a live one sends a segment back to back).
STALL = 2.0


class UploadLocked(GatewayError):
    """423: another request for the upload did not finish within the wait."""

    status = 423


class UploadInterrupted(BadRequest):
    """400: a newer request for the upload took over while this one was receiving."""


class Hold:
    """One request's hold on an upload."""

    def __init__(self, upload_id: str, *, took_over: bool) -> None:
        self.upload_id = upload_id
        #: Whether an earlier request held the upload first (what it loaded may be stale).
        self.took_over = took_over
        self.done = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._awaiting_since: float | None = None  # waiting for the next body piece since
        self._wanted = False
        self._timer: asyncio.Timeout | None = None

    def idle(self) -> float | None:
        """How long the interruptible part has been waiting for the client's next body
        bytes; None when it is not (not receiving, or busy with what it received)."""
        since = self._awaiting_since
        return None if self._timer is None or since is None else self._loop.time() - since

    async def feed(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """`chunks`, timing each wait for the next one (see :meth:`idle`)."""
        pieces = aiter(chunks)
        while True:
            self._awaiting_since = self._loop.time()
            try:
                chunk = await anext(pieces)
            except StopAsyncIteration:
                return
            finally:
                self._awaiting_since = None
            yield chunk

    def request_release(self) -> None:
        """A newer request wants the upload: stop the interruptible part, now or at entry."""
        self._wanted = True
        if self._timer is not None and not self._timer.expired():
            self._timer.reschedule(self._loop.time())

    @asynccontextmanager
    async def interruptible(self) -> AsyncIterator[None]:
        """The part of the request a newer one may stop (receiving and storing a segment).

        Raises:
            UploadInterrupted: a newer request asked for the upload meanwhile.
        """
        if self._wanted:
            raise self._interrupted()
        timer = asyncio.timeout(None)
        try:
            async with timer:
                self._timer = timer
                yield
        except TimeoutError:
            if timer.expired():
                raise self._interrupted() from None
            raise
        finally:
            self._timer = None

    def _interrupted(self) -> UploadInterrupted:
        return UploadInterrupted(
            f"a newer request for upload {self.upload_id} took over; this segment was "
            "discarded, resume from Upload-Offset",
            # The rest of the body is never read: the connection cannot serve another request.
            {"Connection": "close"},
        )


class UploadLocks:
    """Each upload's current request on this replica.

    Args:
        wait: seconds a request waits for the one before it (then 423).
        stall: seconds without body bytes after which a waiting request stops a PATCH.
    """

    def __init__(self, wait: float = LOCK_WAIT, stall: float = STALL) -> None:
        self.wait = wait
        self.stall = stall
        self._held: dict[str, Hold] = {}  # one event loop: plain dict updates cannot interleave

    @asynccontextmanager
    async def hold(self, upload_id: str, *, take_over: bool = False) -> AsyncIterator[Hold]:
        """Hold the upload for one request, after the one before it (see the module).

        Authorize first: whoever may hold an upload may stop a request of its owner.

        Args:
            upload_id: the upload.
            take_over: stop an earlier PATCH at once rather than wait for it (DELETE).

        Raises:
            UploadLocked: the earlier request did not let go within `wait` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait
        took_over = False
        while (current := self._held.get(upload_id)) is not None:
            took_over = True
            idle = current.idle()
            if take_over or (idle is not None and idle >= self.stall):
                current.request_release()
                until = deadline
            else:  # look again when it could have stalled (it may not be receiving yet)
                until = min(deadline, loop.time() + self.stall - (idle or 0.0))
            try:
                async with asyncio.timeout_at(until):
                    await current.done.wait()
            except TimeoutError:
                if loop.time() >= deadline:
                    raise UploadLocked(
                        f"another request for upload {upload_id} is still in progress; retry",
                        {"Retry-After": "1"},
                    ) from None
        hold = Hold(upload_id, took_over=took_over)
        self._held[upload_id] = hold
        try:
            yield hold
        finally:
            if self._held.get(upload_id) is hold:
                del self._held[upload_id]
            hold.done.set()

    def __len__(self) -> int:
        return len(self._held)
