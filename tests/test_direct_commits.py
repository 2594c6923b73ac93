"""Direct-upload commits as an attacker sends them: over the public HTTP API, against the real
gateway, SeaweedFS and mosquitto. Every hostile request's answer is asserted, and what the
store holds afterwards."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from minio import Minio

from client.protocol import Manifest, Topic, data_key, encode_upload
from gateway.http._signing import UrlSigner

from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers

MiB = 1024 * 1024


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def store(seaweed: SeaweedFS) -> Minio:
    return Minio(
        seaweed.endpoint,
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
        secure=False,
    )


@pytest.fixture
def direct_gw(
    gateway_factory: Callable[..., GatewayServer], broker: Mosquitto, seaweed: SeaweedFS
) -> GatewayServer:
    return gateway_factory(broker, s3_public_url=f"http://{seaweed.endpoint}")


def objects(store: Minio, bucket: str) -> list[str]:
    return sorted(
        o.object_name
        for o in store.list_objects(bucket, recursive=True)
        if o.object_name and o.object_name.startswith(("data/", "ids/"))
    )


def grant(gw: GatewayServer, topic: str, parts: list[bytes], **extra: Any) -> httpx.Response:
    whole = b"".join(parts)
    body = {
        "size": len(whole),
        "sha256": sha(whole),
        "part_size": len(parts[0]) if len(parts) > 1 else max(1, len(whole)),
        "parts": [sha(p) for p in parts],
        **extra,
    }
    raw = json.dumps(body).encode("ascii")  # lone surrogates as `\udXXX` escapes
    headers = {"Content-Type": "application/json"}
    return httpx.post(f"{gw.url}/direct/grant/{topic}", content=raw, headers=headers, timeout=30)


def put_parts(answer: httpx.Response, parts: list[bytes]) -> list[str]:
    assert answer.status_code == 201, answer.text
    pairs = zip(answer.json()["urls"], parts, strict=True)
    return [httpx.put(url, content=data, timeout=30).headers["ETag"] for url, data in pairs]


def commit(gw: GatewayServer, body: dict[str, Any]) -> httpx.Response:
    raw = json.dumps(body).encode("ascii")
    headers = {"Content-Type": "application/json"}
    return httpx.post(f"{gw.url}/direct/commit", content=raw, headers=headers, timeout=60)


def test_text_that_is_not_unicode_is_refused_on_every_ingest_path(
    direct_gw: GatewayServer, store: Minio, bucket_name: str, unique_topic: Any
) -> None:
    """Lone surrogates in stored text: 400 with a reason, nothing kept, the rest readable."""
    gw = direct_gw
    topic = unique_topic("text")
    data = b"a payload whose commit carries bad text"
    answer = grant(gw, topic, [data])
    token = answer.json()["grant"]
    put_parts(answer, [data])
    hostile = [
        commit(gw, {"grant": token, "headers": [["\ud800x", "v"]]}),
        commit(gw, {"grant": token, "headers": [["name", "\udfff"]]}),
        commit(gw, {"grant": token, "headers": [["\udc80", "\ud800"]]}),
    ]
    for refused in hostile:
        assert refused.status_code == 400, refused.text
        assert "not valid Unicode" in refused.json()["detail"], refused.text
    # The refusals lost nothing: the same grant still commits, and every reader reads it.
    done = commit(gw, {"grant": token, "headers": [["name", "välue"]]})
    assert done.status_code == 201, done.text
    mid = done.json()["id"]
    assert httpx.get(f"{gw.url}/msg/{mid}").status_code == 200
    assert httpx.get(f"{gw.url}/msg/{mid}/payload", follow_redirects=True).content == data

    # A grant's content type (JSON too): refused, not a 5xx.
    bad_type = grant(gw, topic, [data], content_type="text/\ud800")
    assert bad_type.status_code == 400 and "not valid Unicode" in bad_type.text, bad_type.text

    # The byte-decoded paths: strict UTF-8 refuses the surrogate's encoding (ED A0 80).
    head, tail = encode_upload(4, headers=[("XYZ", b"v")])
    assert head.count(b"XYZ\x00") == 1
    bson = head.replace(b"XYZ\x00", b"\xed\xa0\x80\x00") + b"body" + tail
    hop = httpx.post(f"{gw.url}/topic/{topic}+oversized", content=bson)
    raw = httpx.put(
        f"{gw.url}/msg/{uuid.uuid4()}",
        params={"topic": topic},
        headers={"X-Offload-Header": "%ED%A0%80x=v"},
        content=b"body",
    )
    name = base64.b64encode(b"\xed\xa0\x80").decode()
    tus = httpx.post(
        f"{gw.url}/uploads/",
        headers={
            "Tus-Resumable": "1.0.0",
            "Upload-Length": "4",
            "Upload-Metadata": f"topic {base64.b64encode(topic.encode()).decode()},filename {name}",
        },
    )
    # UTF-7 is a charset RFC 5987 names nothing against: `+2AA-` decodes to a lone surrogate.
    publish = httpx.post(
        f"{gw.url}/publish/{topic}",
        headers={"Content-Disposition": "attachment; filename*=utf-7''%2B2AA-x"},
        content=b"body",
    )
    answers = (hop, raw, tus, publish)
    assert [r.status_code for r in answers] == [400] * 4, [r.text for r in answers]
    assert "not valid Unicode" in publish.json()["detail"], publish.text
    for answer in (hop, raw, tus):  # refused for the encoding, not for anything else
        assert "UTF-8" in answer.json()["detail"], answer.text
    assert len(objects(store, bucket_name)) == 3  # the one good message: payload, sidecar, index


def test_a_commit_and_a_concurrent_abandon_of_one_grant_have_one_winner(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    seaweed: SeaweedFS,
    store: Minio,
    bucket_name: str,
    unique_topic: Any,
) -> None:
    """Real commit at one replica, `{"etags": []}` (the client's abandon) at another, at once.

    Either the commit wins (201, the payload served byte-exact; the abandon 409 or the same
    201) or the abandon does (400, nothing kept; the commit 409, or 400 once the parts are
    gone). Never both: a 201 whose payload the abandon deleted.
    """
    public = f"http://{seaweed.endpoint}"
    replicas = [gateway_factory(broker, s3_public_url=public, auth_secret="shared") for _ in "ab"]
    topic = unique_topic("race")
    pairs = 10
    a, b = os.urandom(5 * MiB), os.urandom(1000)
    committed: list[tuple[str, bytes]] = []
    outcomes: list[tuple[int, int]] = []
    for i in range(pairs):
        head = a[:-8] + i.to_bytes(8, "big")  # another payload each time
        answer = grant(replicas[0], topic, [head, b])
        etags = put_parts(answer, [head, b])
        token = answer.json()["grant"]
        barrier = threading.Barrier(2)
        results: dict[str, httpx.Response] = {}

        def send(
            name: str,
            gw: GatewayServer,
            body: dict[str, Any],
            barrier: threading.Barrier = barrier,
            results: dict[str, httpx.Response] = results,
        ) -> None:
            barrier.wait()
            results[name] = commit(gw, body)

        threads = [
            threading.Thread(
                target=send, args=("commit", replicas[i % 2], {"grant": token, "etags": etags})
            ),
            threading.Thread(
                target=send, args=("abandon", replicas[1 - i % 2], {"grant": token, "etags": []})
            ),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        done, abandon = results["commit"], results["abandon"]
        outcomes.append((done.status_code, abandon.status_code))
        if done.status_code == 201:
            assert abandon.status_code in (201, 409), abandon.text
            if abandon.status_code == 201:
                assert abandon.json()["id"] == done.json()["id"]
            committed.append((done.json()["id"], head + b))
        else:  # refused while the abandon held the grant, or after it removed the parts
            assert done.status_code in (400, 409), done.text
            assert abandon.status_code == 400, abandon.text
    for mid, payload in committed:
        fetched = httpx.get(f"{replicas[0].url}/msg/{mid}/payload", follow_redirects=True)
        assert fetched.status_code == 200 and fetched.content == payload, (mid, outcomes)
    assert len(objects(store, bucket_name)) == 3 * len(committed), outcomes
    assert store._list_multipart_uploads(bucket_name, prefix="data/").uploads == []


def test_an_object_larger_than_its_grant_is_refused_at_the_bound(
    direct_gw: GatewayServer, store: Minio, bucket_name: str, unique_topic: Any
) -> None:
    """Part URLs bind each part's bytes, not its length: a producer can state the hash of a
    longer last part. The commit checks the object's size against the grant's, both ways."""
    gw = direct_gw
    topic = unique_topic("size")
    head = os.urandom(5 * MiB)

    def upload(size: int, tail: bytes) -> httpx.Response:
        body = {
            "size": size,
            "sha256": sha(head + tail),
            "part_size": 5 * MiB,
            "parts": [sha(head), sha(tail)],
        }
        answer = httpx.post(f"{gw.url}/direct/grant/{topic}", json=body, timeout=30)
        etags = put_parts(answer, [head, tail])
        return commit(gw, {"grant": answer.json()["grant"], "etags": etags})

    granted = len(head) + 1
    over = upload(granted, b"xy")  # granted + 1 bytes stored
    assert over.status_code == 400, over.text
    assert f"object has {granted + 1} bytes, the grant {granted}" in over.json()["detail"]
    assert objects(store, bucket_name) == []  # removed, nothing recorded
    exact = upload(granted, b"x")
    assert exact.status_code == 201, exact.text
    mid = exact.json()["id"]
    fetched = httpx.get(f"{gw.url}/msg/{mid}/payload", follow_redirects=True)
    assert fetched.content == head + b"x"
    assert len(objects(store, bucket_name)) == 3


def token_claims(token: str) -> dict[str, Any]:
    body = token.split(".")[0]
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    return claims


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def index_of(store: Minio, bucket: str, mid: str) -> Manifest:
    response = store.get_object(bucket, f"ids/{mid}.json")
    try:
        return Manifest.from_json(response.read())
    finally:
        response.close()
        response.release_conn()


def test_a_direct_upload_is_stamped_when_it_commits_not_when_it_was_granted(
    gateway_factory: Callable[..., GatewayServer],
    broker: Mosquitto,
    seaweed: SeaweedFS,
    store: Minio,
    bucket_name: str,
    unique_topic: Any,
) -> None:
    """What a Spark stream orders by: a slow upload must not be stamped an hour early."""
    secret = "stamp-secret"
    gw = gateway_factory(broker, s3_public_url=f"http://{seaweed.endpoint}", auth_secret=secret)
    topic = unique_topic("stamp")
    data = b"stamped at its commit"
    answer = grant(gw, topic, [data])
    put_parts(answer, [data])
    granted = token_claims(answer.json()["grant"])["ts"]
    while now_ms() <= granted:  # the clock must have moved on from the grant's stamp
        time.sleep(0.001)
    before = now_ms()
    done = commit(gw, {"grant": answer.json()["grant"]})
    assert done.status_code == 201, done.text
    assert index_of(store, bucket_name, done.json()["id"]).timestamp >= before > granted

    # Granted in an earlier hour (sealed with the replicas' secret, as a grant made then
    # would be): the object moves to its commit's hour, where batch reads look for it.
    claims = token_claims(grant(gw, topic, [data]).json()["grant"])
    hour_ago = claims["ts"] - 2 * 3600 * 1000
    old_key = data_key(Topic(topic), hour_ago, uuid.uuid4().hex)
    claims |= {"ts": hour_ago, "k": old_key}
    store.put_object(bucket_name, old_key, io.BytesIO(data), len(data))
    before = now_ms()
    moved = commit(gw, {"grant": UrlSigner(secret.encode()).seal(claims)})
    assert moved.status_code == 201, moved.text
    manifest = index_of(store, bucket_name, moved.json()["id"])
    assert manifest.timestamp >= before
    # Filed there; its payload is the account's copy of these bytes (the first upload's).
    assert manifest.home == data_key(Topic(topic), manifest.timestamp, old_key[-32:])
    assert old_key not in objects(store, bucket_name)
    fetched = httpx.get(f"{gw.url}/msg/{moved.json()['id']}/payload", follow_redirects=True)
    assert fetched.content == data
    again = commit(gw, {"grant": UrlSigner(secret.encode()).seal(claims)})  # answer lost
    assert again.status_code == 201 and again.json()["id"] == moved.json()["id"], again.text


def test_an_abandon_removes_a_single_put_and_never_a_committed_message(
    direct_gw: GatewayServer, store: Minio, bucket_name: str, unique_topic: Any
) -> None:
    """`{"abandon": true}`: what the client sends when a part fails or its commit does.

    `{"etags": []}` would commit a single PUT that did reach the store (stored, never
    announced); an abandon removes it. An abandon after the commit answers the message.
    """
    gw = direct_gw
    topic = unique_topic("abandon")
    data = b"one part, uploaded, then given up"
    answer = grant(gw, topic, [data])
    put_parts(answer, [data])
    token = answer.json()["grant"]
    given_up = commit(gw, {"grant": token, "abandon": True})
    assert given_up.status_code == 200 and "abandoned" in given_up.json()["detail"], given_up.text
    assert objects(store, bucket_name) == []
    late = commit(gw, {"grant": token})
    assert late.status_code == 400 and "no object" in late.json()["detail"], late.text
    assert commit(gw, {"grant": token, "abandon": "yes"}).status_code == 400

    answer = grant(gw, topic, [data])
    put_parts(answer, [data])
    token = answer.json()["grant"]
    done = commit(gw, {"grant": token})
    assert done.status_code == 201, done.text
    again = commit(gw, {"grant": token, "abandon": True})  # the commit's answer was lost
    assert again.status_code == 201 and again.json()["id"] == done.json()["id"], again.text
    fetched = httpx.get(f"{gw.url}/msg/{done.json()['id']}/payload", follow_redirects=True)
    assert fetched.content == data
