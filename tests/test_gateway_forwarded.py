"""The device's address behind a trusted hop, and uploads per user, at the real gateway.

`X-Forwarded-For` is believed only from `OFFLOAD_TRUSTED_PROXIES` (never from 127.0.0.1 by
uvicorn's default), and then every per-address rule uses the address it names: uploads
per client address, the failed-login limits. One user holds at most
`OFFLOAD_MAX_UPLOADS_PER_USER` uploads, from however many addresses.
"""

from __future__ import annotations

import base64
import contextlib
import shutil
import socket
import ssl
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_auth_hardening import _scram_status

from gateway.middleware._forwarded import client_address

from _auth import (
    AUTH_SECRET,
    broker_readable_dir,
    credential_files,
    write_acl_file,
    write_password_file,
)
from _gateway import GatewayProcess, GatewayServer
from _pki import server_pki
from _servers import Mosquitto, SeaweedFS, wait_until

USERS = {"writer": "w-secret-1", "writer2": "w-secret-2"}
ACL = "user writer\ntopic readwrite data/#\nuser writer2\ntopic readwrite data/#\n"


def _net(text: str) -> Any:
    import ipaddress

    return ipaddress.ip_network(text, strict=False)


TRUSTED = (_net("127.0.0.1"), _net("10.9.0.0/16"), _net("fd00::/8"))


@pytest.mark.parametrize(
    ("peer", "lines", "expected"),
    [
        ("192.0.2.1", ["203.0.113.5"], "192.0.2.1"),  # an untrusted peer: its header ignored
        ("127.0.0.1", [], "127.0.0.1"),
        ("127.0.0.1", ["203.0.113.5"], "203.0.113.5"),
        ("127.0.0.1", ["1.1.1.1, 203.0.113.5"], "203.0.113.5"),  # the right-most: the hop's
        ("127.0.0.1", ["1.1.1.1", "203.0.113.5, 10.9.1.1"], "203.0.113.5"),  # lines joined
        ("127.0.0.1", ["203.0.113.5, 10.9.1.1, 10.9.2.2"], "203.0.113.5"),  # trusted hops
        ("127.0.0.1", ["garbage"], "127.0.0.1"),  # not an address: the hop is the client
        ("127.0.0.1", ["203.0.113.5, unknown"], "127.0.0.1"),
        ("127.0.0.1", ["203.0.113.5, _hidden, 10.9.1.1"], "10.9.1.1"),
        ("127.0.0.1", ["2001:db8::7"], "2001:db8::7"),
        ("127.0.0.1", ["[2001:db8::7]:4711"], "2001:db8::7"),
        ("127.0.0.1", ["203.0.113.5:4711"], "203.0.113.5"),
        ("127.0.0.1", ["::ffff:203.0.113.5"], "203.0.113.5"),
        ("::ffff:127.0.0.1", ["203.0.113.5"], "203.0.113.5"),  # a dual-stack peer
        ("fd00::1", ["203.0.113.5"], "203.0.113.5"),
        ("127.0.0.1", ["[2001:db8::7"], "127.0.0.1"),
        ("127.0.0.1", ["10.9.0.1," * 100 + "203.0.113.5"], "203.0.113.5"),
        ("127.0.0.1", ["203.0.113.5" + ", 10.9.0.1" * 100], "10.9.0.1"),  # at most 16 hops
        ("127.0.0.1", [",,,"], "127.0.0.1"),
    ],
)
def test_x_forwarded_for_is_read_right_to_left_and_strictly(
    peer: str, lines: list[str], expected: str
) -> None:
    assert client_address(peer, lines, TRUSTED) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=80), max_size=4))
def test_any_x_forwarded_for_gives_the_peer_or_an_address(lines: list[str]) -> None:
    import ipaddress

    got = client_address("127.0.0.1", lines, TRUSTED)
    ipaddress.ip_address(got)  # never the header's text itself


class RawUpload:
    """`PUT /msg/<id>` from `source`: `size` bytes declared, at most 1 KiB of them sent. A
    whole body gets its answer at once (201, or 429: a refusal is answered once the body is
    read); a held one waits for the rest."""

    def __init__(self, port: int, source: str, forwarded: str | None, size: int = 10):
        self.sock = socket.socket()
        self.sock.bind((source, 0))
        self.sock.connect(("127.0.0.1", port))
        self.sock.settimeout(20)
        head = f"PUT /msg/{uuid.uuid4()}?topic=t HTTP/1.1\r\nHost: gw\r\nContent-Length: {size}\r\n"
        if forwarded is not None:
            head += f"X-Forwarded-For: {forwarded}\r\n"
        self.sock.sendall(head.encode() + b"\r\n" + bytes(min(size, 1024)))

    def status(self) -> int:
        line = self.sock.recv(65536).split(b"\r\n", 1)[0]
        return int(line.split()[1])

    def close(self) -> None:
        self.sock.close()


def held(port: int, source: str, forwarded: str | None) -> RawUpload:
    return RawUpload(port, source, forwarded, size=1 << 20)


def test_forwarded_addresses_are_believed_only_from_trusted_proxies(
    gateway_factory: Callable[..., GatewayServer],
) -> None:
    """With one upload per address: the second upload from the gateway's own host is
    refused whatever address it forwards, unless that host is a trusted proxy; then the
    address it forwards is the one counted, and an untrusted peer's header is ignored."""
    plain = gateway_factory(max_uploads_per_client=1)
    first = held(plain.port, "127.0.0.1", "10.0.0.1")
    second = RawUpload(plain.port, "127.0.0.1", "10.0.0.2")
    try:
        assert second.status() == 429  # both counted as 127.0.0.1: not believed
    finally:
        first.close()
        second.close()
    trusting = gateway_factory(max_uploads_per_client=1, trusted_proxies="127.0.0.1")
    uploads = [
        held(trusting.port, "127.0.0.1", "10.0.0.1"),
        held(trusting.port, "127.0.0.2", "10.0.0.3"),
    ]
    try:
        other = RawUpload(trusting.port, "127.0.0.1", "10.0.0.2")
        again = RawUpload(trusting.port, "127.0.0.1", "10.0.0.1")
        liar = RawUpload(trusting.port, "127.0.0.2", "10.0.0.4")
        uploads += [other, again, liar]
        assert other.status() == 201  # counted as 10.0.0.2
        assert again.status() == 429  # 10.0.0.1 has one under way
        assert liar.status() == 429  # 127.0.0.2 is no trusted hop: counted as itself
        uploads.append(held(trusting.port, "127.0.0.1", "2001:db8:0:1::1"))
        same_prefix = RawUpload(trusting.port, "127.0.0.1", "2001:db8:0:1::2")
        next_prefix = RawUpload(trusting.port, "127.0.0.1", "2001:db8:0:2::1")
        uploads += [same_prefix, next_prefix]
        assert same_prefix.status() == 429  # an IPv6 address counts by its /64
        assert next_prefix.status() == 201
    finally:
        for upload in uploads:
            upload.close()


def test_uvicorns_own_trust_of_its_host_is_off(seaweed: SeaweedFS, bucket_name: str) -> None:
    """`offload-gateway` as users run it: uvicorn would believe X-Forwarded-For from
    127.0.0.1 by default (`forwarded_allow_ips`), skipping every per-address limit."""
    from gateway.storage import S3Store

    S3Store(
        seaweed.endpoint, bucket_name, access_key=seaweed.access_key, secret_key=seaweed.secret_key
    ).ensure_bucket()
    gw = GatewayProcess(
        {
            "OFFLOAD_STORAGE_URL": seaweed.storage_url(bucket_name),
            "OFFLOAD_S3_ACCESS_KEY": seaweed.access_key,
            "OFFLOAD_S3_SECRET_KEY": seaweed.secret_key,
            "OFFLOAD_SWEEP_INTERVAL": "0",
            "OFFLOAD_ALLOW_ANONYMOUS": "true",
            "OFFLOAD_MAX_UPLOADS_PER_CLIENT": "1",
        }
    ).start()
    first = held(gw.port, "127.0.0.1", "10.0.0.1")
    second = RawUpload(gw.port, "127.0.0.1", "10.0.0.2")
    try:
        assert second.status() == 429
    finally:
        first.close()
        second.close()
        gw.kill()


@pytest.fixture
def files() -> Iterator[Path]:
    with credential_files("offload-forwarded-", USERS, ACL) as path:
        yield path


def secured(
    gateway_factory: Callable[..., GatewayServer], files: Path, broker: Any = None, **more: Any
) -> GatewayServer:
    return gateway_factory(
        broker,
        password_file=files / "passwd",
        acl_file=files / "acl",
        auth_secret=AUTH_SECRET,
        trusted_proxies="127.0.0.1",
        **more,
    )


def forwarding(gw: GatewayServer, device: str) -> httpx.Client:
    """A client as offload-proxy is one: from 127.0.0.1, naming the device's address."""
    return httpx.Client(base_url=gw.url, timeout=30, headers={"X-Forwarded-For": device})


def test_failed_logins_count_against_the_device_not_the_proxy(
    gateway_factory: Callable[..., GatewayServer], files: Path, broker: Mosquitto
) -> None:
    """Behind one proxy, a device that guesses `writer`'s password is locked out; the
    proxy's address and `writer` from other devices are not (before, every failure counted
    against the proxy's address: 11 wrong CONNECTs locked `writer` out for the whole fleet,
    50 locked out everyone)."""
    gw = secured(gateway_factory, files, broker)  # /publish: the broker's ACL is this one's
    with forwarding(gw, "10.0.0.1") as guesser:
        statuses = [_scram_status(guesser, "writer", f"guess-{n}") for n in range(12)]
        assert statuses[:10] == [401] * 10 and statuses[10:] == [429, 429]
        assert _scram_status(guesser, "writer", USERS["writer"]) == 429
    with forwarding(gw, "10.0.0.2") as device:
        assert _scram_status(device, "writer", USERS["writer"]) == 201
    with httpx.Client(base_url=gw.url, timeout=30) as proxy_itself:
        assert _scram_status(proxy_itself, "writer", USERS["writer"]) == 201


def test_an_ipv6_device_counts_by_its_64_however_many_addresses_it_rotates_through(
    gateway_factory: Callable[..., GatewayServer], files: Path, broker: Mosquitto
) -> None:
    """A subscriber is routed a whole /64: a guesser that takes a new address of it for
    each attempt is still one address to the failed-login limit (keyed by each full address
    before, it was never limited at all); the next /64 is another device."""
    gw = secured(gateway_factory, files, broker)
    statuses = []
    for n in range(12):
        with forwarding(gw, f"2001:db8:0:1::{n + 1:x}") as guesser:
            statuses.append(_scram_status(guesser, "writer", f"guess-{n}"))
    assert statuses[:10] == [401] * 10 and statuses[10:] == [429, 429]
    with forwarding(gw, "2001:db8:0:1:ffff::1") as same_prefix:
        assert _scram_status(same_prefix, "writer", USERS["writer"]) == 429
    with forwarding(gw, "2001:db8:0:2::1") as next_prefix:
        assert _scram_status(next_prefix, "writer", USERS["writer"]) == 201


def test_a_guesser_changing_addresses_of_one_64_and_user_names_is_one_address(
    gateway_factory: Callable[..., GatewayServer], files: Path, broker: Mosquitto
) -> None:
    """Each attempt from a new address of one /64 *and* for a new user name: no (user,
    address) pair ever fails twice, so only the per-address limit (50 a minute) can hold the
    guesser, and only if it counts the /64 (keyed by each full address, it never would)."""
    gw = secured(gateway_factory, files, broker)
    statuses = []
    with forwarding(gw, "") as guesser:
        for n in range(51):
            guesser.headers["X-Forwarded-For"] = f"2001:db8:0:7::{n + 1:x}"
            statuses.append(_scram_status(guesser, f"user-{n}", "guess"))
    assert statuses[:50] == [401] * 50 and statuses[50] == 429, statuses
    with forwarding(gw, "2001:db8:0:7:abcd::1") as same_prefix:
        assert _scram_status(same_prefix, "writer", USERS["writer"]) == 429
    with forwarding(gw, "2001:db8:0:8::1") as next_prefix:
        assert _scram_status(next_prefix, "writer", USERS["writer"]) == 201


class Drip:
    """An authenticated upload (SCRAM, the library's own flow) that sends 2 KiB a second."""

    def __init__(self, gw: GatewayServer, user: str, device: str) -> None:
        from client import ScramAuth

        self.stop = threading.Event()
        self.status: int | None = None
        self._client = forwarding(gw, device)
        self._auth = ScramAuth(user, USERS[user])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _body(self) -> Iterator[bytes]:
        while not self.stop.wait(1.0):
            yield bytes(2048)

    def _run(self) -> None:
        with contextlib.suppress(Exception):  # cut short at the end: h11's own error too
            answer = self._client.put(
                f"/msg/{uuid.uuid4()}",
                params={"topic": "data/drip"},
                content=self._body(),
                headers={"Content-Length": str(1 << 20)},
                auth=self._auth,
            )
            self.status = answer.status_code

    def close(self) -> None:
        self.stop.set()
        self._thread.join(10)
        self._client.close()


def _upload_limits(gw: GatewayServer) -> Any:
    from gateway.middleware import UploadLimits

    layer = gw.app.middleware_stack
    while not isinstance(layer, UploadLimits):
        layer = layer.app
    return layer


def test_one_user_dripping_uploads_holds_only_its_share_of_the_transfers(
    gateway_factory: Callable[..., GatewayServer], files: Path
) -> None:
    """One user drips 17 uploads at 2 KiB/s (above the minimum rate) from 17 devices.
    Before, it held all 16 transfers of a gateway with 16 while it went on; now it holds
    `OFFLOAD_MAX_UPLOADS_PER_USER` and another user's upload is stored."""
    gw = secured(gateway_factory, files, max_transfers=16)
    limits = _upload_limits(gw)
    cap = gw.settings.max_uploads_per_user
    drips = [Drip(gw, "writer", f"10.0.1.{i + 1}") for i in range(17)]
    try:
        wait_until(lambda: limits.users.get("writer") == cap, f"{cap} uploads by writer", 30)
        with forwarding(gw, "10.0.2.1") as other:
            from client import ScramAuth

            answer = other.put(
                f"/msg/{uuid.uuid4()}",
                params={"topic": "data/other"},
                content=b"x" * 1000,
                auth=ScramAuth("writer2", USERS["writer2"]),
            )
            assert answer.status_code == 201, answer.text
        assert limits.users.get("writer") == cap
    finally:
        for drip in drips:
            drip.close()


def _asks(client: httpx.Client, user: str) -> int:
    """A SCRAM client-first alone: the question an enumerator of user names asks."""
    from scramp import ScramClient

    first = ScramClient(["SCRAM-SHA-512"], user, "x").get_client_first()
    header = "SCRAM-SHA-512 data=" + base64.b64encode(first.encode()).decode()
    return client.get("/usage", headers={"Authorization": header}).status_code


def test_an_enumerator_behind_the_proxy_is_held_alone(tmp_path: Path) -> None:
    """Over TLS the gateway takes Basic, and its answer to a SCRAM client-first tells which
    names have an entry SCRAM cannot use (`weak`, 101 iterations): each question is charged
    to the address as a failed login is. Behind a trusted hop that is the device's
    forwarded address: the one asking gets 429 after 50, the device whose name it asked
    about logs in from behind the same hop with the default login (the offer, then Basic),
    and so does a client at the hop's own address."""
    from client import gateway_auth
    from gateway import Settings

    directory = broker_readable_dir("offload-forwarded-tls-")
    try:
        write_password_file(directory / "passwd", [("weak", "weak-pw", 101)])
        write_acl_file(directory / "acl", "user weak\ntopic readwrite data/#\n")
        with server_pki() as pki:
            settings = Settings(  # type: ignore[call-arg]
                storage_url=f"file://{tmp_path}",
                password_file=directory / "passwd",
                acl_file=directory / "acl",
                auth_secret=AUTH_SECRET,
                trusted_proxies="127.0.0.1",
                tls=True,
            )
            gw = GatewayServer(
                settings, certfile=str(pki / "server.pem"), keyfile=str(pki / "server.key")
            ).start()
            trust = ssl.create_default_context(cafile=str(pki / "ca.pem"))
            try:
                with httpx.Client(base_url=gw.url, verify=trust, timeout=30) as hop:
                    hop.headers["X-Forwarded-For"] = "10.0.0.1"
                    asked = [_asks(hop, ("weak", f"nobody-{n}")[n % 2]) for n in range(55)]
                    assert asked == [401] * 50 + [429] * 5, asked
                    for device in ("10.0.0.2", None):
                        hop.headers.pop("X-Forwarded-For", None)
                        if device is not None:
                            hop.headers["X-Forwarded-For"] = device
                        auth = gateway_auth(username="weak", password="weak-pw", token=None)
                        stored = hop.put(
                            f"/msg/{uuid.uuid4()}", params={"topic": "data/x"}, content=b"x",
                            auth=auth,
                        )  # fmt: skip
                        assert stored.status_code == 201, (device, stored.text)
            finally:
                gw.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
