"""An independent ADR 23 reassembler, written from the ADR's text alone, for interop tests.

It deliberately imports nothing from the project: if our codec and this agree on the bytes,
both read the ADR the same way. Plain Python and hashlib, no buffering limits or timeouts.

ADR 23, as this file reads it: every chunk has a `__chunk` user property
``<messageId>:<chunkIndex>``, the first chunk (index 0)
``<messageId>:<chunkIndex>:<totalChunks>:<checksum>``; the message is the chunks' payloads
joined in index order, and its SHA-256 (hex) must equal `checksum`.
"""

from __future__ import annotations

import hashlib


class ReassemblyFailed(ValueError):
    """The chunks do not make one valid ADR 23 message."""


def reassemble(messages: list[tuple[bytes, list[tuple[str, str]]]]) -> bytes:
    """Rebuild one chunked message from its received chunks, in any order, duplicates allowed.

    Args:
        messages: (payload, user properties) of every received chunk of one message.

    Raises:
        ReassemblyFailed: no or several message ids, missing chunks, conflicting duplicates or a
            checksum mismatch.
    """
    ids: set[str] = set()
    total: int | None = None
    checksum: str | None = None
    chunks: dict[int, bytes] = {}
    for payload, user_properties in messages:
        values = [value for name, value in user_properties if name == "__chunk"]
        if len(values) != 1:
            raise ReassemblyFailed(f"expected one __chunk property, got {values!r}")
        fields = values[0].split(":")
        if len(fields) == 4:
            if total is not None and (total, checksum) != (int(fields[2]), fields[3].lower()):
                raise ReassemblyFailed("two different first chunks")
            total, checksum = int(fields[2]), fields[3].lower()
        elif len(fields) != 2:
            raise ReassemblyFailed(f"bad __chunk value {values[0]!r}")
        ids.add(fields[0].lower())
        index = int(fields[1])
        if chunks.setdefault(index, payload) != payload:
            raise ReassemblyFailed(f"two different payloads for chunk {index}")
    if len(ids) != 1:
        raise ReassemblyFailed(f"expected chunks of one message, got ids {sorted(ids)}")
    if total is None or checksum is None:
        raise ReassemblyFailed("the first chunk is missing")
    if sorted(chunks) != list(range(total)):
        raise ReassemblyFailed(f"have chunks {sorted(chunks)}, expected 0..{total - 1}")
    whole = b"".join(chunks[i] for i in range(total))
    actual = hashlib.sha256(whole).hexdigest()
    if actual != checksum:
        raise ReassemblyFailed(f"checksum mismatch: expected {checksum}, got {actual}")
    return whole
