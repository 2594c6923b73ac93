"""Encrypted tus uploads (issue 30): `offload upload` of an `encrypt_to` topic seals the file,
uploads the ciphertext and names `enc`/`kid`/`cmp` in `Upload-Metadata`; the gateway copies
them, checked as hostile input, into the placeholder it publishes. Real servers throughout."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pyrage
import pytest
from minio import Minio

from client import Client, Message
from client.commands._http import _sealing
from client.config._settings import ClientSettings
from client.http._upload import TusUploader
from client.protocol._age_keys import Identity

from _gateway import GatewayServer
from _servers import SeaweedFS

pytestmark = pytest.mark.servers

OFFLOAD = shutil.which("offload") or "offload"
MiB = 1024 * 1024
MARKER = b"PLAINTEXT-MARKER-tus-51c2"
TUS = {"Tus-Resumable": "1.0.0"}


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    return subprocess.run(
        [OFFLOAD, *args], capture_output=True, timeout=120,
        env={**base, "OFFLOAD_CONFIG": os.devnull, **env},
    )  # fmt: skip


def _key(tmp_path: Path) -> tuple[Identity, Path]:
    identity = Identity.generate()
    path = tmp_path / "key.txt"
    path.write_text(f"# public key: {identity.recipient}\n{identity}\n")
    return identity, path


def _objects(seaweed: SeaweedFS, bucket: str) -> dict[str, bytes]:
    s3 = Minio(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, secure=False)
    out = {}
    for obj in s3.list_objects(bucket, recursive=True):
        response = s3.get_object(bucket, obj.object_name)
        try:
            out[str(obj.object_name)] = response.read()
        finally:
            response.close()
            response.release_conn()
    return out


def _half_upload(gateway: GatewayServer, file: Path, topic: str, recipient: str,
                 state_dir: Path) -> None:  # fmt: skip
    """Upload the first segment of the sealed file and stop, as a killed process would."""

    class Stop(Exception):
        pass

    def stop(n: int) -> None:
        raise Stop

    sealing = _sealing(ClientSettings(encrypt_to=f"{topic}={recipient}"), topic)
    with httpx.Client(timeout=60) as http:
        uploader = TusUploader(http, gateway.url, state_dir=state_dir, segment=MiB)
        with pytest.raises(Stop):
            uploader.upload(file, topic, on_bytes=stop, sealing=sealing)


def _next(client: Client) -> Message:
    item = client.next_message(60)
    assert isinstance(item, Message), item
    return item


def test_upload_of_an_encrypted_topic_sends_ciphertext_and_resumes_the_same_one(
    gateway: GatewayServer,
    seaweed: SeaweedFS,
    bucket_name: str,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = unique_topic("tus-enc")
    identity, key_file = _key(tmp_path)
    recipient = str(identity.recipient)
    reader = clients(identity_files=(str(key_file),))
    raw = clients(fetch_external=False)
    reader.subscribe(topic)
    raw.subscribe(topic)
    payload = MARKER * 1000 + os.urandom(3 * MiB)
    file = tmp_path / "secret.bin"
    file.write_bytes(payload)
    state_dir = tmp_path / "state"
    env = {"OFFLOAD_ENCRYPT_TO": f"{topic}={recipient}"}
    args = ("upload", "--endpoint", gateway.url, "-t", topic, "-f", str(file),
            "--state-dir", str(state_dir), "--segment-size", str(MiB))  # fmt: skip

    # Stopped after one segment: the sealed spool stays beside the state, ciphertext only.
    _half_upload(gateway, file, topic, recipient, state_dir)
    (spool,) = state_dir.glob("*.sealed")
    sealed = spool.read_bytes()
    assert sealed.startswith(b"age-encryption.org/v1\n") and MARKER not in sealed
    resumed = _run(*args, env=env)
    assert resumed.returncode == 0, resumed.stderr
    line = json.loads(resumed.stdout)
    assert line["resumed_from"] == MiB  # the rest of the same ciphertext, not a new seal
    assert line["sha256"] == hashlib.sha256(sealed).hexdigest() and line["size"] == len(sealed)
    assert list(state_dir.iterdir()) == []  # state and spool removed once published

    got = _next(reader)
    assert got.payload == payload
    placeholder = json.loads(_next(raw).payload)
    assert placeholder["enc"] == "age-v1" and placeholder["kid"] == [identity.recipient.key_id]
    assert placeholder["size"] == len(sealed) and placeholder["sha256"] == line["sha256"]
    assert "cmp" not in placeholder

    stored = _objects(seaweed, bucket_name)
    assert not any(MARKER in body for body in stored.values())
    (obj,) = [b for b in stored.values() if hashlib.sha256(b).hexdigest() == line["sha256"]]
    assert obj == sealed
    assert pyrage.decrypt(obj, [pyrage.x25519.Identity.from_str(str(identity))]) == payload
    if shutil.which("age"):
        out = subprocess.run(["age", "-d", "-i", str(key_file)], input=obj, capture_output=True)
        assert out.returncode == 0 and out.stdout == payload

    # Without its spool an encrypted upload is never resumed: it starts over, sealed afresh.
    _half_upload(gateway, file, topic, recipient, state_dir)
    next(state_dir.glob("*.sealed")).unlink()
    again = _run(*args, "--encrypt-to", recipient, env={})  # the flag, as the variable
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["resumed_from"] == 0
    assert _next(reader).payload == payload
    assert json.loads(_next(raw).payload)["enc"] == "age-v1"


def _meta(items: dict[str, str]) -> str:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in items.items()}
    return ",".join(f"{k} {v}" if v else k for k, v in encoded.items())  # tus: a bare key


KID = "0123456789abcdef"
HOSTILE: list[dict[str, str]] = [
    {"enc": "age-v2"},
    {"enc": "AGE-V1"},
    {"enc": ""},
    {"enc": "age-v1" * 5000},
    {"cmp": "gzip"},
    {"cmp": ""},
    {"kid": KID},  # kid without enc
    {"enc": "age-v1", "kid": KID.upper()},
    {"enc": "age-v1", "kid": KID[:15]},
    {"enc": "age-v1", "kid": ""},
    {"enc": "age-v1", "kid": f"{KID},,{KID}"},
    {"enc": "age-v1", "kid": f"{KID} "},
    {"enc": "age-v1", "kid": ",".join([KID] * 65)},
    {"enc": "age-v1", "kid": "a" * 40000},
]


def test_hostile_encoding_metadata_is_400_and_valid_is_copied_into_the_placeholder(
    gateway: GatewayServer,
    seaweed: SeaweedFS,
    bucket_name: str,
    clients: Callable[..., Client],
    unique_topic: Callable[[str], str],
) -> None:
    topic = unique_topic("tus-meta")
    raw = clients(fetch_external=False)
    raw.subscribe(topic)
    before = set(_objects(seaweed, bucket_name))
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        for fields in HOSTILE:
            r = http.post("/uploads/", headers={**TUS, "Upload-Length": "5",
                          "Upload-Metadata": _meta({"topic": topic, **fields})})  # fmt: skip
            assert r.status_code == 400, (fields, r.status_code, r.text)
            assert "Upload-Metadata" in r.json()["detail"] and "location" not in r.headers
        assert set(_objects(seaweed, bucket_name)) == before  # nothing was created

        # Valid fields, the upload created and finished in separate requests (the state
        # keeps them), reach the placeholder as the client library writes them.
        kids = f"{KID},{KID[::-1]}"
        meta = _meta({"topic": topic, "enc": "age-v1", "kid": kids, "cmp": "zstd"})
        r = http.post("/uploads/", headers={**TUS, "Upload-Length": "5", "Upload-Metadata": meta})
        assert r.status_code == 201, r.text
        segment = {**TUS, "Upload-Offset": "0", "Content-Type": "application/offset+octet-stream"}
        r = http.patch(r.headers["location"], content=b"bytes", headers=segment)
        assert r.status_code == 204, r.text
    doc = json.loads(_next(raw).payload)
    assert (doc["enc"], doc["kid"], doc["cmp"]) == ("age-v1", [KID, KID[::-1]], "zstd")
    assert doc["size"] == 5 and doc["sha256"] == hashlib.sha256(b"bytes").hexdigest()
