"""Placeholders reusing one large payload cannot fill the subscriber's disk (issue 26 item 6).

One 70 MiB upload and 15 placeholders naming it spooled 1,051 MiB while the application read
nothing: spooled payloads counted against no bound. Now `max_spool_bytes` bounds the spool
files that received, not yet taken, messages hold: at the bound the client waits for the
application (and says so once). Real gateway on SeaweedFS, real mosquitto.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest

from client import Client, Message
from client.core._source import PayloadSource
from client.http._transport import HttpTransport
from client.protocol import MessageId, Placeholder

from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
SIZE = 2 * MiB
COPIES = 15


def _spooled(directory: Path) -> list[int]:
    return [p.stat().st_size for p in directory.glob("offload-*.payload")]


def test_placeholders_for_one_payload_spool_no_more_than_the_bound(
    gateway: GatewayServer,
    broker: Mosquitto,
    unique_topic: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="client")
    topic = unique_topic("spool")
    data = os.urandom(SIZE)
    digest = hashlib.sha256(data).hexdigest()
    mid = MessageId.new()
    with HttpTransport(timeout=60) as http, PayloadSource(data) as source:
        http.upload(gateway.url, topic, source, message_id=mid)
    body, props = Placeholder(f"{gateway.url}/msg/{mid}", SIZE, digest, mid).encode(None)
    bound = 3 * SIZE
    with Client(
        broker.url,
        endpoint=gateway.url,
        spool_threshold=MiB,
        spool_dir=str(tmp_path),
        max_spool_bytes=bound,
    ) as sub:
        sub.subscribe(topic)
        for _ in range(COPIES):  # a publisher names the same payload again and again
            sub.connection.publish(topic, body, qos=1, properties=props).result(10)
        # The application reads nothing until the client says it waits for it.
        deadline = time.monotonic() + 60
        while "spool full" not in caplog.text:
            assert time.monotonic() < deadline, (caplog.text, _spooled(tmp_path))
            time.sleep(0.05)
        assert sum(_spooled(tmp_path)) <= bound and len(_spooled(tmp_path)) == 3
        got = []
        for _ in range(COPIES):
            item = sub.next_message(60)
            assert isinstance(item, Message), item
            assert item.sha256 == digest and item.body.path is not None
            assert hashlib.sha256(item.body.path.read_bytes()).hexdigest() == digest
            got.append(item.message_id)
            item.body.discard()  # the application is done with it
            assert sum(_spooled(tmp_path)) <= bound
    assert got == [str(mid)] * COPIES
