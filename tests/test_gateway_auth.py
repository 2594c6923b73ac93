"""One identity for broker and gateway: mosquitto's password and ACL files, the real
hop-client's HTTP SCRAM, and our own client end to end."""

from __future__ import annotations

import base64
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import bson
import httpx
import pytest
import requests
from hop.auth import Auth
from hop.http_scram import SCRAMAuth
from scramp import ScramClient
from scramp.utils import ScramException

from _auth import broker_readable_dir, secured_pair, write_acl_file, write_password_file
from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

USERS = {"writer": "w-secret-1", "reader": "r-secret-2", "nobody": "n-secret-3"}
ACL = """\
user writer
topic readwrite data/#
user reader
topic read data/#
user gateway
topic readwrite sys/metadata
topic readwrite data/#
"""


@pytest.fixture
def shared_files() -> Iterator[Path]:
    path = broker_readable_dir("offload-auth-")
    users = {**USERS, "gateway": "g-secret-4"}
    write_password_file(path / "passwd", [(u, p, 4096) for u, p in users.items()])
    write_acl_file(path / "acl", ACL)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def secured(
    shared_files: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    gateway_factory: Callable[..., GatewayServer],
) -> tuple[Mosquitto, GatewayServer]:
    return secured_pair(
        shared_files, mosquitto_factory, gateway_factory, gateway_password="g-secret-4"
    )


def hop(user: str, password: str) -> SCRAMAuth:
    return SCRAMAuth(Auth(user, password, method="SCRAM-SHA-512"), shortcut=True)


def scram_by_hand(url: str, body: bytes, user: str, password: str) -> int:
    """RFC 7804 with scramp's client: the status of the final request."""
    scram = ScramClient(["SCRAM-SHA-512"], user, password)
    first = base64.b64encode(scram.get_client_first().encode()).decode()
    challenge = httpx.post(
        url, content=body, headers={"Authorization": f"SCRAM-SHA-512 data={first}"}
    )
    assert challenge.status_code == 401
    params = dict(
        part.strip().split("=", 1)
        for part in challenge.headers["www-authenticate"].split(" ", 1)[1].split(",")
    )
    scram.set_server_first(base64.b64decode(params["data"]).decode())
    final = base64.b64encode(scram.get_client_final().encode()).decode()
    answer = httpx.post(
        url,
        content=body,
        headers={"Authorization": f"SCRAM-SHA-512 sid={params['sid']}, data={final}"},
    )
    return answer.status_code


def upload_body(msg_id: uuid.UUID) -> bytes:
    return bson.encode({"message": b"payload", "headers": [["_id", bson.Binary(msg_id.bytes)]]})


def test_shared_identity_with_the_real_hop_client(secured: tuple[Mosquitto, GatewayServer]) -> None:
    _, gw = secured
    url = f"{gw.url}/topic/data/x+oversized"
    msg_id = uuid.uuid4()
    ok = requests.post(url, data=upload_body(msg_id), auth=hop("writer", USERS["writer"]))
    assert ok.status_code == 201, ok.text
    # hop-client turns the 401's `e=invalid-proof` server-final into an exception ...
    with pytest.raises(ScramException, match="invalid-proof"):
        requests.post(url, data=upload_body(uuid.uuid4()), auth=hop("writer", "bad"))
    # ... and on the wire the answer is a 401.
    assert scram_by_hand(url, upload_body(uuid.uuid4()), "writer", "bad") == 401
    assert scram_by_hand(url, upload_body(uuid.uuid4()), "writer", USERS["writer"]) == 201
    reader_up = requests.post(
        url, data=upload_body(uuid.uuid4()), auth=hop("reader", USERS["reader"])
    )
    assert reader_up.status_code == 403
    fetch = requests.get(f"{gw.url}/msg/{msg_id}", auth=hop("reader", USERS["reader"]))
    assert fetch.status_code == 200
    assert bson.decode(fetch.content)["message"] == b"payload"
    nobody = requests.get(f"{gw.url}/msg/{msg_id}", auth=hop("nobody", USERS["nobody"]))
    assert nobody.status_code == 403
    anonymous = httpx.post(url, content=upload_body(uuid.uuid4()))
    assert anonymous.status_code == 401
    assert "SCRAM-SHA-512" in anonymous.headers["www-authenticate"]


@pytest.mark.parametrize(
    "header",
    [
        "SCRAM-SHA-512 data=!!!notbase64",
        "SCRAM-SHA-512 sid=forged, data=Yz1iaXdzLHI9eA==",
        "SCRAM-SHA-1 data=eA==",
        "Basic " + "A" * 5000,
        "Bearer nope",
        "garbage",
    ],
)
def test_junk_authorization_is_401_not_5xx(
    secured: tuple[Mosquitto, GatewayServer], header: str
) -> None:
    _, gw = secured
    r = httpx.post(
        f"{gw.url}/topic/data/x+oversized",
        content=upload_body(uuid.uuid4()),
        headers={"Authorization": header},
    )
    assert r.status_code == 401


def test_gateway_advertises_with_its_own_broker_credentials(
    secured: tuple[Mosquitto, GatewayServer],
) -> None:
    broker, _ = secured
    out = subprocess.run(
        [
            "mosquitto_sub",
            "-p",
            str(broker.port),
            "-u",
            "reader",
            "-P",
            USERS["reader"],
            "-t",
            "sys/metadata",
            "-C",
            "1",
            "-W",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    # The reader may not read sys/metadata by the ACL: nothing arrives; the gateway user may.
    assert out.stdout == ""
    got = subprocess.run(
        [
            "mosquitto_sub",
            "-p",
            str(broker.port),
            "-u",
            "gateway",
            "-P",
            "g-secret-4",
            "-t",
            "sys/metadata",
            "-C",
            "1",
            "-W",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert "LargeMessageUploadEndpoint" in got.stdout
    assert "SCRAM-SHA-512" in got.stdout
