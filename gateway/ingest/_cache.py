"""The manifests this gateway read lately, so that a download costs one store request."""

from __future__ import annotations

import time
from collections import OrderedDict

from client.protocol import Manifest, MessageId


class ManifestCache:
    """Recently read manifests, so a download costs one store request instead of two.

    Manifests never change once written; only deletion matters. Entries live `ttl`
    seconds, a local delete evicts at once, and a delete by another replica or the sweeper
    shows as a missing payload (404) when it is read, unless the payload object is shared
    with another message of the account (gateway/retention): then a replica that read the
    deleted message serves it for up to `ttl` seconds more, never an expired one. Only
    hits are kept: an unknown id is always looked up again.
    """

    def __init__(self, size: int = 4096, ttl: float = 10.0) -> None:
        self._entries: OrderedDict[MessageId, tuple[float, Manifest]] = OrderedDict()
        self._size = size
        self._ttl = ttl

    def get(self, message_id: MessageId) -> Manifest | None:
        entry = self._entries.get(message_id)
        if entry is None:
            return None
        stamp, manifest = entry
        if time.monotonic() - stamp > self._ttl:
            del self._entries[message_id]
            return None
        self._entries.move_to_end(message_id)
        return manifest

    def put(self, manifest: Manifest) -> None:
        self._entries[manifest.id] = (time.monotonic(), manifest)
        self._entries.move_to_end(manifest.id)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def evict(self, message_id: MessageId) -> None:
        self._entries.pop(message_id, None)
