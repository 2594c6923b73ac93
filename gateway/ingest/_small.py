"""A small payload taken whole on the event loop and stored with one PUT from it.

A streaming upload (`_pipe.StreamingUpload`) hands its body to a transfer thread, which
fills a part buffer, hashes it and sends it through the MinIO SDK. That is what a payload
of many megabytes needs; for one of a few hundred kilobytes, the thread hand-overs and the
SDK's Python were most of the gateway's CPU per upload (bench/RESULTS.md, "Round 16"). A
payload whose length is known and at most `SMALL_PAYLOAD` is therefore gathered on the
event loop, hashed as its pieces arrive (SHA-256 and CRC-32C: at most a millisecond of the
loop's time per MiB, and the bytes are still in cache), and stored with one presigned PUT
(`SupportsAsyncWrite`) whose CRC-32C the store verifies. It takes a transfer slot like any
upload (503 when none is free), and nothing reaches the store before its last byte is in.
"""

from __future__ import annotations

import hashlib

from ..core import BadRequest, Transfers
from ..storage import SupportsAsyncWrite
from ._pipe import Buffer, _frozen, crc32c_text, crc32c_update

#: Largest payload taken whole: the size of one read of a request body
#: (`gateway.middleware.READ_SIZE`), so most arrive in one or two pieces.
SMALL_PAYLOAD = 1024 * 1024


class SmallUpload:
    """`StreamingUpload`'s interface for a payload of known length up to SMALL_PAYLOAD.

    Args:
        store: where the payload goes (`writes_now()` is the caller's to check).
        key: its object key.
        length: bytes expected.
        content_type: stored with the object.
        transfers: the admission-controlled transfers (a slot is taken at once).
    """

    def __init__(
        self,
        store: SupportsAsyncWrite,
        key: str,
        length: int,
        content_type: str | None,
        *,
        transfers: Transfers,
    ) -> None:
        self.key = key
        self.length = length
        self._store = store
        self._content_type = content_type or "application/octet-stream"
        self._slot = transfers.admit()
        self._pieces: list[bytes | memoryview] = []
        self._count = 0
        self._sha256 = hashlib.sha256()
        self._crc32c = 0

    async def write(self, data: Buffer) -> None:
        if not data:
            return
        if self._count + len(data) > self.length:
            raise BadRequest(f"the payload has more than the {self.length} bytes announced")
        self._pieces.append(_frozen(data))  # kept as it is unless it may change
        self._count += len(data)
        self._sha256.update(data)
        self._crc32c = crc32c_update(self._crc32c, data)
        self._slot.touch()

    async def finish(self) -> tuple[str, int]:
        """Store the payload; its SHA-256 hex and size.

        Raises:
            BadRequest: fewer bytes came than announced.
            StoreError: the store is unreachable, failed or refused.
        """
        try:
            if self._count != self.length:
                raise BadRequest(f"the payload has {self._count} bytes, not {self.length}")
            body, self._pieces = b"".join(self._pieces), []
            await self._store.write(self.key, body, self._content_type, only_new=False)
        finally:
            self._end()
        return self._sha256.hexdigest(), self._count

    @property
    def crc32c(self) -> str | None:
        """The payload's CRC-32C (8 hex digits) once `finish` returned; None without C."""
        return crc32c_text(self._crc32c)

    async def abort(self, reason: BaseException) -> None:
        """Drop what came. Nothing was stored unless `finish` got as far as its PUT (as a
        streaming upload's store call, whose object the clean-up removes)."""
        self._end()

    def _end(self) -> None:
        self._pieces = []
        self._slot.release()
