"""A lying endpoint: declares 10 bytes, sends 300 MiB. The subscriber hangs up early.

Real mosquitto, the real `Client` and the real `offload subscribe` CLI; the endpoint is a
tiny HTTP server of the test's own (:mod:`_hostile`) that counts what it managed to send
before the subscriber closed the connection.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from client import Client, FetchError, Message, MessageError
from client.protocol import MessageId, Placeholder

from _hostile import LyingEndpoint, PeakRss, RawPublisher
from _servers import Mosquitto

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
TEN = b"0123456789"
OFFLOAD = shutil.which("offload") or "offload"


@pytest.fixture
def spool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the client's temporary (spool) files go during the test."""
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    return spool


@pytest.fixture(params=[True, False], ids=["content-length", "chunked"])
def liar(request: pytest.FixtureRequest) -> Iterator[LyingEndpoint]:
    endpoint = LyingEndpoint(body_bytes=300 * MiB, content_length=request.param).start()
    yield endpoint
    endpoint.stop()


def _placeholder(liar: LyingEndpoint, size: int = len(TEN)) -> tuple[bytes, list[tuple[str, str]]]:
    mid = MessageId.new()
    ref = Placeholder(f"{liar.url}/msg/{mid}", size, hashlib.sha256(TEN).hexdigest(), mid)
    body, props = ref.encode(None)
    assert props is not None
    return body, list(props.user_properties)


def test_client_hangs_up_on_a_body_past_the_declared_size(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    liar: LyingEndpoint,
    spool_dir: Path,
) -> None:
    broker = mosquitto_factory()
    topic = unique_topic("liar")
    pub = RawPublisher(broker.url)
    with Client(broker.url, endpoint=liar.url) as sub:
        sub.subscribe(topic)
        body, user_props = _placeholder(liar)
        tracemalloc.start()
        try:
            pub.publish(topic, body, user_properties=user_props)
            pub.publish(topic, b"after the liar")
            err = sub.next_message(60)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        after = sub.next_message(30)
    pub.close()
    assert isinstance(err, MessageError) and isinstance(err.error, FetchError), err
    if liar.content_length:
        assert "refused before the body" in str(err.error)
    else:
        assert "runs past the declared size of 10 bytes" in str(err.error)
    # The next message is delivered: one lie costs one error line, not the client.
    assert isinstance(after, Message) and after.payload == b"after the liar"
    [served] = liar.wait_finished(1, 30)
    print(f"liar sent {served.sent} bytes; client peak allocations {peak} bytes")  # with -s
    assert served.hung_up and not served.finished
    assert served.sent < 64 * MiB, f"the client read {served.sent} bytes of a 10-byte payload"
    assert peak < 16 * MiB, f"{peak} bytes allocated for a 10-byte payload"
    assert [p for p in spool_dir.iterdir() if p.name.startswith("offload-")] == []


def test_declared_size_over_max_fetch_bytes_is_never_requested(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    liar: LyingEndpoint,
) -> None:
    broker = mosquitto_factory()
    topic = unique_topic("liar-big")
    pub = RawPublisher(broker.url)
    with Client(broker.url, endpoint=liar.url, max_fetch_bytes=100 * MiB) as sub:
        sub.subscribe(topic)
        body, user_props = _placeholder(liar, size=300 * MiB)
        pub.publish(topic, body, user_properties=user_props)
        err = sub.next_message(30)
    pub.close()
    assert isinstance(err, MessageError) and isinstance(err.error, FetchError)
    assert "max_fetch_bytes" in str(err.error)
    assert liar.served == []


def test_cli_reports_the_liar_and_carries_on(
    mosquitto_factory: Callable[..., Mosquitto],
    unique_topic: Callable[[str], str],
    liar: LyingEndpoint,
    tmp_path: Path,
) -> None:
    broker = mosquitto_factory()
    topic = unique_topic("liar-cli")
    pub = RawPublisher(broker.url)
    body, user_props = _placeholder(liar)
    # Retained: the CLI gets it as soon as it subscribes, no guessing when that is.
    pub.publish(topic, body, user_properties=user_props, retain=True)
    spool = tmp_path / "spool"
    spool.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env.update(OFFLOAD_CONFIG=os.devnull, OFFLOAD_ENDPOINT=liar.url, TMPDIR=str(spool))
    proc = subprocess.Popen(
        [OFFLOAD, "subscribe", "--broker", broker.url, "--topic", topic, "--count", "2",
         "--timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    peak = PeakRss(proc.pid)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        pub.publish(topic, b"after the liar")
        second = json.loads(proc.stdout.readline())
        proc.wait(timeout=60)
    finally:
        peak_kib = peak.stop()
        if proc.returncode is None:
            proc.kill()
            proc.wait()
        pub.publish(topic, b"", retain=True)  # clear the retained placeholder
        pub.close()
    assert first["error"] == "fetch failed" and first["topic"] == topic
    assert second["topic"] == topic and second["size"] == len(b"after the liar")
    assert proc.returncode == 1  # an error line was printed
    [served] = liar.wait_finished(1, 30)
    print(f"liar sent {served.sent} bytes; CLI peak RSS {peak_kib} KiB")  # with -s
    assert served.hung_up and served.sent < 64 * MiB
    # The whole CLI process, far below the 300 MiB on offer.
    assert 0 < peak_kib < 200 * 1024, f"CLI peaked at {peak_kib} KiB"
    assert list(spool.iterdir()) == []
