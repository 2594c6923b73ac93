"""One request at a time per resumable upload on this replica (tusd's upload locks).

A client that loses a PATCH often knows before the server does, and resumes at once: HEAD
for the offset, then PATCH from there, while the server is still reading or storing the
old PATCH. Without a lock the HEAD answers the offset from before the old PATCH, the old
PATCH then moves the upload on, and the resumed PATCH gets 409 (tus-js-client after a page
reload: its parallel parts' PATCHes were still in flight at the gateway). So each request
on an upload holds its lock, and a newer request asks the holder to let go, as tusd does
(https://tus.github.io/tusd/advanced-topics/locks):

* a holder still receiving or storing its segment is interrupted: the segment is discarded
  (a PATCH keeps all of its bytes or none) and it answers 400, so its client, if it is still
  there, resumes from the offset;
* a holder past that point (saving the state, assembling and publishing the payload) is
  waited for, at most `wait` seconds; then the newer request is answered 423 Locked, which
  tus clients retry.

Per replica: requests for one upload at two replicas at once are caught only by the offset
re-read in `ResumableUploads.append` (409), as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ._errors import BadRequest, GatewayError

#: How long a request waits for another one on the same upload to finish (tusd's
#: default lock acquisition timeout is 20 seconds too).
LOCK_WAIT = 20.0


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
        self._wanted = False
        self._timer: asyncio.Timeout | None = None

    def request_release(self) -> None:
        """A newer request wants the upload: interrupt the interruptible part, if running."""
        self._wanted = True
        if self._timer is not None and not self._timer.expired():
            self._timer.reschedule(asyncio.get_running_loop().time())

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
        wait: seconds a request waits for the one before it (see the module docstring).
    """

    def __init__(self, wait: float = LOCK_WAIT) -> None:
        self.wait = wait
        self._held: dict[str, Hold] = {}  # one event loop: plain dict updates cannot interleave

    @asynccontextmanager
    async def hold(self, upload_id: str) -> AsyncIterator[Hold]:
        """Hold the upload for one request, taking it over from an earlier one.

        Authorize first: whoever may hold an upload may stop a request of its owner.

        Raises:
            UploadLocked: the earlier request did not let go within `wait` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait
        took_over = False
        while (current := self._held.get(upload_id)) is not None:
            took_over = True
            current.request_release()
            try:
                async with asyncio.timeout_at(deadline):
                    await current.done.wait()
            except TimeoutError:
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
