"""`offload keygen`, `publish --encrypt-to`, `subscribe/fetch --identity`, `fetch --raw`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pyrage
import pytest

from _gateway import GatewayServer
from _servers import Mosquitto

pytestmark = pytest.mark.servers

OFFLOAD = shutil.which("offload") or "offload"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env["OFFLOAD_CONFIG"] = os.devnull
    return env


def run(
    *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [OFFLOAD, *args], capture_output=True, timeout=120, env={**_env(), **(env or {})},
        input=stdin,
    )  # fmt: skip


def _json(out: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


def test_keygen_writes_a_private_identity_and_prints_its_recipient(tmp_path: Path) -> None:
    key = tmp_path / "key.txt"
    done = run("keygen", "-o", str(key))
    assert done.returncode == 0, done.stderr
    recipient = done.stdout.decode().strip()
    assert recipient.startswith("age1")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    identity = pyrage.x25519.Identity.from_str(key.read_text().splitlines()[-1])
    assert str(identity.to_public()) == recipient
    again = run("keygen", "-o", str(key))  # never over an existing identity
    assert again.returncode != 0 and b"exists" in again.stderr
    if shutil.which("age"):  # Debian's age reads the file as an identity
        sealed = pyrage.encrypt(b"hello", [pyrage.x25519.Recipient.from_str(recipient)])
        out = subprocess.run(["age", "-d", "-i", str(key)], input=sealed, capture_output=True)
        assert out.stdout == b"hello"
    to_stdout = run("keygen")
    assert to_stdout.stdout.startswith(b"# created: ") and b"AGE-SECRET-KEY-1" in to_stdout.stdout
    assert b"Public key: age1" in to_stdout.stderr


def _subscribed(broker: Mosquitto, topic: str, *args: str) -> subprocess.Popen[bytes]:
    before = broker.log().count(f"\t{topic} (QoS")
    proc = subprocess.Popen(
        [OFFLOAD, "subscribe", "--broker", broker.url, "--topic", topic, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    deadline = time.monotonic() + 30
    while broker.log().count(f"\t{topic} (QoS") == before:
        assert proc.poll() is None and time.monotonic() < deadline, "not subscribed"
        time.sleep(0.05)
    return proc


def test_publish_encrypted_subscribe_and_fetch_with_identities(
    gateway: GatewayServer, unique_topic: object, tmp_path: Path
) -> None:
    broker: Mosquitto = gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("cli-enc")  # type: ignore[operator]
    old, new = tmp_path / "old.key", tmp_path / "new.key"
    old_recipient = run("keygen", "-o", str(old)).stdout.decode().strip()
    new_recipient = run("keygen", "-o", str(new)).stdout.decode().strip()
    payload = os.urandom(150_000) + json.dumps(list(range(50_000))).encode()
    source = tmp_path / "payload.bin"
    source.write_bytes(payload)
    out_dir = tmp_path / "out"
    sub = _subscribed(
        broker, topic, "--count", "1", "--timeout", "60", "--out", str(out_dir),
        "--identity", str(new),
    )  # fmt: skip
    try:
        done = run(
            "publish", "--broker", broker.url, "--topic", topic, "--file", str(source),
            "--encrypt-to", old_recipient, "--encrypt-to", new_recipient,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (result,) = _json(done.stdout)
        assert result["route"] == "offloaded"
        assert result["sha256"] == hashlib.sha256(payload).hexdigest()
        out, err = sub.communicate(timeout=90)
    finally:
        sub.kill()
    assert sub.returncode == 0, err
    (got,) = _json(out)
    assert Path(str(got["file"])).read_bytes() == payload
    assert got["sha256"] == result["sha256"]
    url = str(result["url"])

    raw = run("fetch", url, "--raw")
    assert raw.returncode == 0 and raw.stdout.startswith(b"age-encryption.org/v1\n")
    plain = run("fetch", url, "--identity", str(old))
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == payload
    stored_sha = hashlib.sha256(raw.stdout).hexdigest()
    checked = run("fetch", url, "--identity", str(new), "--sha256", stored_sha, "-o",
                  str(tmp_path / "f.bin"))  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    assert (tmp_path / "f.bin").read_bytes() == payload
    # Without an identity: an error that says what is missing, and no file left behind.
    missing = run("fetch", url, "-o", str(tmp_path / "none.bin"))
    assert missing.returncode != 0
    assert b"no identity" in missing.stderr and not (tmp_path / "none.bin").exists()
    stranger = tmp_path / "stranger.key"
    run("keygen", "-o", str(stranger))
    wrong = run("fetch", url, "--identity", str(stranger))
    assert wrong.returncode != 0 and b"no identity opens the payload" in wrong.stderr
    assert wrong.stdout == b""


def test_compressed_payload_fetched_plain_or_raw(
    gateway: GatewayServer, unique_topic: object, tmp_path: Path
) -> None:
    broker: Mosquitto = gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("cli-zstd")  # type: ignore[operator]
    payload = json.dumps([{"k": i, "v": "x" * 20} for i in range(30_000)]).encode()
    source = tmp_path / "t.json"
    source.write_bytes(payload)
    common = ("publish", "--broker", broker.url, "--topic", topic, "--file", str(source),
              "--offload-threshold", "1000")  # fmt: skip
    squeezed = _json(run(*common, "--compress").stdout)[0]  # off by default
    as_is = _json(run(*common, "--no-compress").stdout)[0]
    raw = run("fetch", str(squeezed["url"]), "--raw").stdout
    assert len(raw) * 4 < len(payload)
    if shutil.which("zstd"):  # our frames are an ordinary zstd stream
        unzstd = subprocess.run(["zstd", "-dc"], input=raw, capture_output=True, check=True)
        assert unzstd.stdout == payload
    assert run("fetch", str(squeezed["url"])).stdout == payload
    assert run("fetch", str(as_is["url"]), "--raw").stdout == payload


def test_fetch_range_decrypts_only_the_chunks_it_needs(
    gateway: GatewayServer, unique_topic: object, tmp_path: Path
) -> None:
    broker: Mosquitto = gateway.broker  # type: ignore[attr-defined]
    topic = unique_topic("cli-range")  # type: ignore[operator]
    key = tmp_path / "key.txt"
    recipient = run("keygen", "-o", str(key)).stdout.decode().strip()
    payload = os.urandom(3 * 1024 * 1024 + 123)
    source = tmp_path / "p.bin"
    source.write_bytes(payload)
    done = run("publish", "--broker", broker.url, "--topic", topic, "--file", str(source),
               "--encrypt-to", recipient)  # fmt: skip
    assert done.returncode == 0, done.stderr
    url = str(_json(done.stdout)[0]["url"])
    cases = [(0, 0), (65535, 65536), (1_000_000, 1_200_000), (len(payload) - 5, len(payload) + 99)]
    for start, end in cases:
        out = tmp_path / f"r{start}"
        got = run("fetch", url, "--identity", str(key), "--range", f"{start}-{end}", "-o", str(out))
        assert got.returncode == 0, got.stderr
        assert out.read_bytes() == payload[start : end + 1], (start, end)
        (doc,) = _json(got.stdout)
        # The head request (128 KiB) and the chunks holding the range: never the 3 MiB object.
        assert int(str(doc["stored_bytes_read"])) <= 128 * 1024 + (end - start) + 2 * 65552
    raw = run("fetch", url, "--raw", "--range", "0-21")
    assert raw.stdout == b"age-encryption.org/v1\n"
    refused = run("fetch", url, "--range", "5-1")
    assert refused.returncode == 2 and b"--range" in refused.stderr
    missing = run("fetch", url, "--range", "0-10")
    assert missing.returncode != 0 and b"no identity" in missing.stderr
