"""Chunked messages and shared subscriptions: the limitation is visible, never silent."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest

from client import ChunkTimeoutError, Client, Message, MessageError, Route

from _servers import Mosquitto

pytestmark = pytest.mark.servers


def test_chunks_split_across_a_shared_group_surface_as_timeouts(
    mosquitto_factory: Callable[..., Mosquitto],
) -> None:
    broker = mosquitto_factory(max_packet_size=65536)
    members = [Client(broker.url, chunk_timeout=2.0, discovery_wait=0) for _ in range(2)]
    for member in members:
        member.connect()
        member.subscribe("$share/workers/jobs/big", qos=1)
    try:
        with Client(broker.url, discovery_wait=0) as producer:
            result = producer.publish("jobs/big", os.urandom(500_000), qos=1)
        assert result.route == Route.CHUNKED
        deadline = time.monotonic() + 10
        seen: list[Message | MessageError] = []
        while time.monotonic() < deadline and not any(isinstance(x, MessageError) for x in seen):
            for member in members:
                item = member.next_message(timeout=0.5)
                if item is not None:
                    seen.append(item)
        # Each member holds only part of the chunks: nobody can deliver the message, and
        # the members report a chunk timeout instead of dropping the chunks silently.
        assert not any(isinstance(x, Message) for x in seen)
        errors = [x for x in seen if isinstance(x, MessageError)]
        assert errors
        assert all(isinstance(e.error, ChunkTimeoutError) for e in errors)
    finally:
        for member in members:
            member.close()
