"""`POST|PUT /publish/{topic}` with real curl, real mosquitto_sub, real gateway and SeaweedFS."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from minio import Minio

from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers


class Sub:
    """A plain `mosquitto_sub -V 5 -F %j` on a topic: what a tool that knows no offload sees."""

    def __init__(self, broker: Mosquitto, topic: str, count: int = 1) -> None:
        self.proc = subprocess.Popen(
            ["mosquitto_sub", "-V", "5", "-p", str(broker.port), "-h", "127.0.0.1",
             "-t", topic, "-F", "%j", "-C", str(count), "-W", "30", "-q", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        time.sleep(0.5)  # mosquitto_sub has no "subscribed" signal; give it a moment

    def messages(self) -> list[dict[str, object]]:
        out, err = self.proc.communicate(timeout=40)
        assert self.proc.returncode == 0, err.decode()
        return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


def _curl(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["curl", "-sS", *args], capture_output=True, timeout=120, check=False)


def _store(seaweed: SeaweedFS) -> Minio:
    return Minio(
        seaweed.endpoint, access_key=seaweed.access_key, secret_key=seaweed.secret_key,
        secure=False,
    )  # fmt: skip


@pytest.fixture
def gw(gateway_factory: Callable[..., GatewayServer], broker: Mosquitto) -> GatewayServer:
    return gateway_factory(broker)


@pytest.fixture
def five_mib(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "5MiB.bin"
    path.write_bytes(os.urandom(5 * 1024 * 1024))
    yield path


def _user_props(message: dict[str, object]) -> dict[str, str]:
    props = message.get("properties") or {}
    assert isinstance(props, dict)
    pairs = props.get("user-properties") or []
    if isinstance(pairs, dict):
        return {str(k): str(v) for k, v in pairs.items()}
    out: dict[str, str] = {}
    for pair in pairs:
        out.update({str(k): str(v) for k, v in pair.items()})
    return out


def test_curl_post_announces_a_placeholder_plain_subscribers_can_follow(
    gw: GatewayServer, broker: Mosquitto, five_mib: Path, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("cams")
    sub = Sub(broker, topic)
    done = _curl(
        "-X", "POST", "--data-binary", f"@{five_mib}",
        "-H", "Content-Type: application/octet-stream",
        "-w", "\n%{http_code}",
        f"{gw.url}/publish/{topic}?prop=camera:north",
    )  # fmt: skip
    body, _, status = done.stdout.decode().rpartition("\n")
    assert status == "201", done
    answer = json.loads(body)
    payload = five_mib.read_bytes()
    assert answer["size"] == len(payload)
    assert answer["sha256"] == hashlib.sha256(payload).hexdigest()
    assert answer["topic"] == topic
    assert answer["url"] == f"{gw.url}/msg/{answer['id']}"

    (message,) = sub.messages()
    assert message["topic"] == topic
    props = _user_props(message)
    assert props["_format"] == "external"
    assert props["_id"] == answer["id"]
    assert props["camera"] == "north"
    placeholder = json.loads(str(message["payload"]))
    assert placeholder == {
        "_format": "external",  # the body carries the tag too, for 3.1.1 subscribers
        "_id": answer["id"],
        "url": answer["url"],
        "size": len(payload),
        "sha256": answer["sha256"],
    }

    fetched = _curl("-f", f"{placeholder['url']}/payload")
    assert fetched.returncode == 0 and fetched.stdout == payload
    ranged = _curl("-f", "-r", "100-199", "-w", "%{http_code}", f"{answer['url']}/payload")
    assert ranged.stdout[:-3] == payload[100:200]
    assert ranged.stdout[-3:] == b"206"


def test_curl_prints_each_answer_on_a_line_of_its_own(
    gw: GatewayServer, unique_topic: Callable[[str], str]
) -> None:
    """Issue 43 item 7: the walk-through's `curl .../publish/...` ran into the prompt."""
    topic = unique_topic("lines")
    published = _curl("--data-binary", "x" * 1000, f"{gw.url}/publish/{topic}")
    assert published.returncode == 0 and published.stdout.endswith(b"}\n"), published
    assert published.stdout.count(b"\n") == 1 and json.loads(published.stdout)["size"] == 1000
    refused = _curl("--data-binary", "x", f"{gw.url}/publish/{topic}?qos=7")
    assert refused.stdout.endswith(b"}\n") and "qos" in json.loads(refused.stdout)["detail"]


def test_curl_upload_file_put_keeps_content_type_and_filename(
    gw: GatewayServer, broker: Mosquitto, tmp_path: Path, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("put")
    path = tmp_path / "report 2026.csv"
    path.write_bytes(b"a,b\n1,2\n" * 1000)
    sub = Sub(broker, topic)
    done = _curl(
        "-f", "-T", str(path), "-H", "Content-Type: text/csv",
        "-H", "X-Offload-Retain: true", "-H", "X-Offload-Expiry: 600",
        "-H", "X-Offload-Property: a:1", "-H", "X-Offload-Property: b:2",
        f"{gw.url}/publish/{topic}?filename=report%202026.csv",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    (message,) = sub.messages()
    assert not message["retain"]  # delivered live, not as a retained replay
    props = message["properties"]
    assert isinstance(props, dict)
    assert props["content-type"] == "text/csv"
    assert 590 <= int(props["message-expiry-interval"]) <= 600
    assert _user_props(message) == {"_format": "external", "_id": answer["id"], "a": "1", "b": "2"}
    # A late subscriber gets the retained placeholder.
    late = Sub(broker, topic)
    (again,) = late.messages()
    assert again["retain"]
    head = httpx.get(f"{answer['url']}/payload")
    assert head.content == path.read_bytes()
    assert head.headers["content-type"].startswith("text/csv")
    assert "report%202026.csv" in head.headers["content-disposition"]


def test_chunked_transfer_encoding_streams(
    gw: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("chunked")
    pieces = [os.urandom(300_000) for _ in range(7)]

    def body() -> Iterator[bytes]:
        yield from pieces  # a generator has no length: httpx sends it chunked

    sub = Sub(broker, topic)
    r = httpx.post(f"{gw.url}/publish/{topic}?qos=2", content=body(), timeout=60)
    assert r.status_code == 201, r.text
    assert r.request.headers.get("transfer-encoding") == "chunked"
    whole = b"".join(pieces)
    assert r.json()["sha256"] == hashlib.sha256(whole).hexdigest()
    (message,) = sub.messages()
    assert message["qos"] == 1  # mosquitto_sub asked for QoS 1: the broker downgrades 2
    assert httpx.get(r.json()["url"] + "/payload").content == whole


def test_curl_chunked_with_header_options(
    gw: GatewayServer, broker: Mosquitto, five_mib: Path, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("curlchunk")
    done = _curl(
        "-f", "-H", "Transfer-Encoding: chunked", "--data-binary", f"@{five_mib}",
        "-H", "X-Offload-Qos: 0", f"{gw.url}/publish/{topic}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["size"] == five_mib.stat().st_size


def test_bson_body_keeps_the_senders_id_and_headers(
    gw: GatewayServer, broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    import uuid

    import bson

    topic = unique_topic("bson")
    msg_id = uuid.uuid4()
    doc = bson.encode({
        "message": bson.Binary(b"hello" * 1000),
        "headers": [["_id", bson.Binary(msg_id.bytes)], ["origin", b"lab"]],
    })  # fmt: skip
    sub = Sub(broker, topic)
    r = httpx.post(
        f"{gw.url}/publish/{topic}", content=doc, headers={"Content-Type": "application/bson"}
    )
    assert r.status_code == 201, r.text
    assert r.json()["id"] == str(msg_id)
    (message,) = sub.messages()
    assert _user_props(message) == {"_format": "external", "_id": str(msg_id), "origin": "lab"}
    assert httpx.get(f"{gw.url}/msg/{msg_id}/payload").content == b"hello" * 1000


@pytest.mark.parametrize(
    ("query", "reason"),
    [("qos=3", "qos"), ("retain=maybe", "retain"), ("prop=novalue", "NAME:VALUE"),
     ("prop=_id:x", "reserved"), ("expiry=-1", "expiry")],
)  # fmt: skip
def test_bad_options_are_400(
    gw: GatewayServer, unique_topic: Callable[[str], str], query: str, reason: str
) -> None:
    r = httpx.post(f"{gw.url}/publish/{unique_topic('bad')}?{query}", content=b"x")
    assert r.status_code == 400
    assert reason in r.json()["detail"]


def _objects(seaweed: SeaweedFS, bucket: str) -> list[str]:
    """The messages' objects (not the payloads' records, tests/test_lifecycle_*.py)."""
    listed = _store(seaweed).list_objects(bucket, recursive=True)
    return [name for o in listed if not (name := o.object_name or "").startswith("blobs/")]


def _wait_broker_lost(gw: GatewayServer) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        checks = httpx.get(f"{gw.url}/readyz").json()["checks"]
        if checks.get("broker") != "ok":
            return
        time.sleep(0.1)
    raise AssertionError("the gateway never noticed the broker stopped")


def test_broker_down_is_503_and_leaves_nothing(
    gateway_factory: Callable[..., GatewayServer],
    mosquitto_factory: Callable[..., Mosquitto],
    seaweed: SeaweedFS,
    bucket_name: str,
    unique_topic: Callable[[str], str],
) -> None:
    broker = mosquitto_factory()
    gw = gateway_factory(broker)
    topic = unique_topic("down")
    # Broker already gone: refused before the body is stored.
    broker.stop()
    _wait_broker_lost(gw)
    r = httpx.post(f"{gw.url}/publish/{topic}", content=os.urandom(1000))
    assert r.status_code == 503
    assert "broker" in r.json()["detail"]
    assert not [k for k in _objects(seaweed, bucket_name) if not k.startswith("uploads/")]


def test_broker_lost_mid_upload_withdraws_the_stored_message(
    gateway_factory: Callable[..., GatewayServer],
    mosquitto_factory: Callable[..., Mosquitto],
    seaweed: SeaweedFS,
    bucket_name: str,
    unique_topic: Callable[[str], str],
) -> None:
    broker = mosquitto_factory()
    gw = gateway_factory(broker)
    httpx.post(f"{gw.url}/publish/{unique_topic('warm')}", content=b"w").raise_for_status()
    before = set(_objects(seaweed, bucket_name))
    topic = unique_topic("lost")
    first_sent = threading.Event()
    go_on = threading.Event()

    def body() -> Iterator[bytes]:
        yield os.urandom(2 * 1024 * 1024)
        first_sent.set()
        go_on.wait(30)
        yield os.urandom(2 * 1024 * 1024)

    result: dict[str, httpx.Response] = {}
    sender = threading.Thread(
        target=lambda: result.update(
            r=httpx.post(f"{gw.url}/publish/{topic}", content=body(), timeout=60)
        )
    )
    sender.start()
    assert first_sent.wait(30)
    broker.stop()  # the gateway accepted the request while connected; now the broker is gone
    time.sleep(1.0)
    go_on.set()
    sender.join(60)
    r = result["r"]
    assert r.status_code == 503, r.text
    assert "broker" in r.json()["detail"]
    assert set(_objects(seaweed, bucket_name)) == before  # payload, sidecar and index removed


def test_topics_and_properties_a_broker_would_refuse_are_400_and_the_link_survives(
    gateway: GatewayServer,
) -> None:
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        bad_topic = http.put("/publish/a%C2%85b", content=b"x")
        assert bad_topic.status_code == 400
        assert "U+0085" in bad_topic.json()["detail"]
        bad_prop = http.post("/publish/ok/topic", params={"prop": "k:\x01v"}, content=b"x")
        assert bad_prop.status_code == 400
        good = http.post("/publish/ok/topic", content=b"still works")
        assert good.status_code == 201
        assert http.get("/readyz").json()["checks"]["broker"] == "ok"


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("POST", "/publish/a%FFb"),
        ("POST", "/publish/a%C3%28b"),  # a lead byte without its continuation
        ("PUT", "/msg/{id}?topic=x%FE"),
        ("POST", "/topic/%ED%A0%80+oversized"),  # an encoded surrogate
        ("POST", "/publish/ok?prop=k:%FF"),
    ],
)
def test_a_target_that_is_not_utf8_once_decoded_is_400_and_nothing_is_stored(
    gateway: GatewayServer, seaweed: SeaweedFS, bucket_name: str, method: str, target: str
) -> None:
    """Decoded with U+FFFD for what is not UTF-8, `a%FFb` was published as `a\ufffdb`."""
    before = set(_objects(seaweed, bucket_name))
    path = target.replace("{id}", str(uuid.uuid4()))
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        r = http.request(method, httpx.URL(gateway.url + path), content=b"x")
        assert r.status_code == 400, r.text
        assert "not UTF-8 once percent-decoded" in r.json()["detail"]
        assert http.post("/publish/ok%E2%82%AC", content=b"x").status_code == 201  # UTF-8 is
    assert len(set(_objects(seaweed, bucket_name)) - before) == 3  # the good one's objects
