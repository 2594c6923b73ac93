"""The Will (`will_topic`, `will_payload`, `will_qos`, `will_retain`, `will_delay`): one larger
than the broker takes is offloaded first and the Will is its placeholder; delivered and
resolved when its client process is SIGKILLed (real mosquitto, gateway, SeaweedFS)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from client import Client, ConfigError, Message, MessageTooLarge, Route

from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

ROOT = Path(__file__).resolve().parent.parent

# A client process with a Will, read from a file; says "ready" once connected, then waits.
CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from client import Client
    broker, topic, path, qos = sys.argv[1:5]
    client = Client(
        broker, will_topic=topic, will_payload=Path(path).read_bytes(), will_qos=int(qos),
        discovery_wait=30.0,
    )
    client.connect(timeout=30)
    print("ready", client.connection.connections, flush=True)
    time.sleep(600)
    """
)


def _will_process(broker: Mosquitto, topic: str, payload_file: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, broker.url, topic, str(payload_file), "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        proc.kill()
        raise AssertionError(f"will client did not start: {line!r} {proc.communicate()[1]}")
    return proc


@pytest.mark.parametrize(
    ("size", "route"),
    [(600 * 1024, Route.OFFLOADED), (1024, Route.DIRECT)],
    ids=["oversized", "fits"],
)
def test_will_of_a_killed_client_is_delivered_and_resolved(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
    size: int,
    route: Route,
) -> None:
    broker: Mosquitto = gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("will")
    payload = os.urandom(size)  # the broker takes 256 KiB packets
    (tmp_path / "will").write_bytes(payload)
    watcher = clients()
    watcher.subscribe(topic, qos=1)
    proc = _will_process(broker, topic, tmp_path / "will")
    try:
        proc.send_signal(signal.SIGKILL)  # no DISCONNECT: the broker sends the Will
        proc.wait(10)
        got = watcher.next_message(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert isinstance(got, Message), got
    assert got.route is route
    assert got.qos == 1
    assert hashlib.sha256(got.payload).digest() == hashlib.sha256(payload).digest()


def test_will_not_sent_on_a_normal_close(
    gateway: GatewayServer, clients: Callable[..., Client], unique_topic: Callable[[str], str]
) -> None:
    broker: Mosquitto = gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("will/closed")
    watcher = clients()
    watcher.subscribe(topic, qos=1)
    with Client(broker.url, will_topic=topic, will_payload=os.urandom(600 * 1024), will_qos=1):
        pass
    with Client(broker.url) as marker:  # everything before this has been delivered
        marker.publish(topic, b"after", qos=1)
    got = watcher.next_message(timeout=30)
    assert isinstance(got, Message) and got.payload == b"after"


@pytest.mark.parametrize(
    "kw",
    [
        {"will_payload": "x"},  # no topic
        {"will_topic": "a/#", "will_payload": "x"},
        {"will_topic": "a", "will_qos": 3},
        {"will_topic": "a", "will_delay": -1},
    ],
)
def test_bad_will_settings_are_config_errors(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Client("mqtt://127.0.0.1:1", **kw)  # type: ignore[arg-type]


def test_oversized_will_without_an_endpoint_fails_connect_and_leaves_no_connection(
    mosquitto_factory: Callable[..., Mosquitto],
) -> None:
    broker = mosquitto_factory(max_packet_size=262144)  # no gateway advertises itself here
    client = Client(
        broker.url, will_topic="w/t", will_payload=os.urandom(600 * 1024), discovery_wait=0.5
    )
    with pytest.raises(MessageTooLarge, match="Will"):
        client.connect()
    assert not client.connection.connected
    client.close()


# A client process whose Will's topic is encrypted (encrypt_to), to the recipient given.
ENCRYPTED_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from client import Client
    broker, topic, path, recipient = sys.argv[1:5]
    client = Client(
        broker, will_topic=topic, will_payload=Path(path).read_bytes(), will_qos=1,
        discovery_wait=30.0, encrypt_to={topic: [recipient]},
    )
    client.connect(timeout=30)
    print("ready", client.connection.connections, flush=True)
    time.sleep(600)
    """
)


def test_a_will_on_an_encrypted_topic_is_offloaded_as_ciphertext_however_small(
    gateway: GatewayServer,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    import httpx

    from client.protocol._age_keys import Identity

    broker: Mosquitto = gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("will-enc")
    identity = Identity.generate()
    (tmp_path / "key").write_text(f"{identity}\n")
    payload = b"WILL-PLAINTEXT-MARKER " * 40  # fits the broker: would go in the clear
    (tmp_path / "will").write_bytes(payload)
    watcher = clients(identity_files=(str(tmp_path / "key"),))
    watcher.subscribe(topic, qos=1)
    proc = subprocess.Popen(
        [sys.executable, "-c", ENCRYPTED_CHILD, broker.url, topic, str(tmp_path / "will"),
         str(identity.recipient)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ready"), (line, proc.stderr.read() if proc.stderr else "")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        got = watcher.next_message(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert isinstance(got, Message), got
    assert got.route is Route.OFFLOADED and got.payload == payload
    assert got.message_id is not None
    stored = httpx.get(f"{gateway.url}/msg/{got.message_id}/payload", timeout=30).content
    assert stored.startswith(b"age-encryption.org/v1\n") and b"MARKER" not in stored
