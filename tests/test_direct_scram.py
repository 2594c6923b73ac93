"""Direct transfers with the default login: SCRAM over plain HTTP, a password file and an ACL.

Real mosquitto and gateway sharing the password and ACL files, real SeaweedFS, the real
`offload` CLI and client.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from minio import Minio

from client import Client, Message

from _auth import broker_readable_dir, secured_pair, write_acl_file, write_password_file
from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS, free_port

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
USERS = {"alice": "a-secret-1", "bob": "b-secret-2", "gateway": "g-secret-3"}
ACL = """\
pattern read sys/metadata
user alice
topic readwrite scram/#
user bob
topic read scram/#
user gateway
topic readwrite sys/metadata
topic readwrite scram/#
"""


@pytest.fixture
def files() -> Iterator[Path]:
    path = broker_readable_dir("offload-direct-scram-")
    write_password_file(path / "passwd", [(u, p, 4096) for u, p in USERS.items()])
    write_acl_file(path / "acl", ACL)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def store(seaweed: SeaweedFS) -> Minio:
    return Minio(
        seaweed.endpoint,
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
        secure=False,
    )


def secured_direct(
    files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
    public_url: str,
) -> tuple[Mosquitto, GatewayServer]:
    """Broker and gateway on one password file, the gateway on plain HTTP, direct on."""

    def factory(broker: Mosquitto, **kw: object) -> GatewayServer:
        return gateway_factory(broker, s3_public_url=public_url, **kw)

    return secured_pair(files, mosquitto_factory, factory, gateway_password=USERS["gateway"])


def received_bytes(gw: GatewayServer) -> float:
    """Request body bytes the gateway has counted (its /metrics)."""
    text = httpx.get(gw.metrics_url).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.split("{", 1)[0] == "offload_http_received_bytes_total"
    )


def objects(store: Minio, bucket: str) -> list[str]:
    return sorted(
        o.object_name
        for o in store.list_objects(bucket, recursive=True)
        if o.object_name and not o.object_name.startswith(("probes/", "blobs/"))
    )


def open_multipart_uploads(store: Minio, bucket: str) -> list[str]:
    """Keys of the bucket's unfinished multipart uploads."""
    result = store._list_multipart_uploads(bucket, prefix="data/")
    return [u.object_name for u in result.uploads]


def offload(*args: str) -> list[str]:
    return [sys.executable, "-m", "client.cli", *args]


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env["OFFLOAD_CONFIG"] = os.devnull
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    return env


def test_cli_publish_with_scram_goes_direct_over_plain_http(
    files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
    seaweed: SeaweedFS,
    store: Minio,
    bucket_name: str,
    tmp_path: Path,
) -> None:
    s3 = f"http://{seaweed.endpoint}"
    broker, gw = secured_direct(files, mosquitto_factory, gateway_factory, s3)
    topic = "scram/direct"
    source = tmp_path / "payload.bin"
    payload = os.urandom(12 * MiB)
    source.write_bytes(payload)
    sub = Client(broker.url, username="bob", password=USERS["bob"], discovery_wait=10.0)
    sub.connect()
    try:
        sub.subscribe(topic)
        before = received_bytes(gw)
        args = ["--broker", broker.url, "--topic", topic, "--discovery-wait", "10", "--no-chunk"]
        login = ["--username", "alice", "--password", USERS["alice"]]
        done = subprocess.run(
            offload("publish", *args, *login, "--file", str(source)),
            capture_output=True,
            text=True,
            env=cli_env(),
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "falling back" not in done.stderr, done.stderr
        assert json.loads(done.stdout)["route"] == "offloaded", done.stdout
        # Direct: the 12 MiB went to the store, not through the gateway.
        assert received_bytes(gw) - before < MiB
        msg = sub.next_message(60)
        assert isinstance(msg, Message), msg
        assert msg.payload == payload
    finally:
        sub.close()
    assert open_multipart_uploads(store, bucket_name) == []
    assert len(objects(store, bucket_name)) == 3  # payload, sidecar, index


def test_a_failed_direct_upload_with_scram_leaves_nothing_behind(
    files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
    store: Minio,
    bucket_name: str,
    tmp_path: Path,
) -> None:
    """The parts cannot reach the store: the client abandons the grant, then chunks.

    The abandon is a commit with SCRAM too: it must authenticate, and the gateway must
    abort the multipart upload it had started.
    """
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    broker, gw = secured_direct(files, mosquitto_factory, gateway_factory, nobody)
    pub = Client(broker.url, username="alice", password=USERS["alice"], discovery_wait=10.0)
    pub.connect()
    try:
        assert pub.wait_for_endpoint(10) == gw.url
        result = pub.publish("scram/failed", os.urandom(9 * MiB), qos=1)  # a multipart grant
        assert result.message_id is not None
    finally:
        pub.close()
    assert open_multipart_uploads(store, bucket_name) == []
    assert len(objects(store, bucket_name)) == 3  # only the proxied copy


def test_a_grant_committed_by_a_user_who_may_not_write_its_topic_is_403(
    files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
    seaweed: SeaweedFS,
    store: Minio,
    bucket_name: str,
) -> None:
    """A grant is not a credential (issue 43 item 9): every other direct test commits as the
    user who got the grant, so the commit's own ACL check could go unnoticed."""
    from client import ScramAuth

    _, gw = secured_direct(files, mosquitto_factory, gateway_factory, f"http://{seaweed.endpoint}")
    payload = os.urandom(100_000)
    sha256 = hashlib.sha256(payload).hexdigest()
    request = {"size": len(payload), "sha256": sha256, "part_size": len(payload), "parts": [sha256]}
    alice, bob = (ScramAuth(user, USERS[user]) for user in ("alice", "bob"))
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        granted = http.post("/direct/grant/scram/acl", json=request, auth=alice)
        assert granted.status_code == 201, granted.text
        (url,) = granted.json()["urls"]
        etag = httpx.put(url, content=payload, timeout=30).headers["ETag"]
        body = {"grant": granted.json()["grant"], "etags": [etag]}
        refused = http.post("/direct/commit", json=body, auth=bob)  # bob may only read scram/#
        assert refused.status_code == 403, refused.text
        assert not [k for k in objects(store, bucket_name) if k.startswith("ids/")]  # no message
        done = http.post("/direct/commit", json=body, auth=alice)  # the grant is still alice's
        assert done.status_code == 201, done.text
        assert done.json()["sha256"] == sha256
