"""Every HTTP call of the library and the CLI against a gateway that accepts and never
answers (issue 51 §1): `offload-gateway` frozen with SIGSTOP (its kernel still accepts and
takes bytes until the socket buffers are full), or for a direct upload's parts the store
behind a relay that passes nothing more. Each call ends within its timeout
(`http_timeout`, here 2 s) with one error saying so; the CLI with one line on stderr and
exit 5, no traceback.

Before the fix, every request with a body and a SCRAM login (a raw or BSON upload, a
direct grant, a tus PATCH) waited for ever: the login's probe was a copy of the request
without its extensions, where httpx keeps the timeouts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from client import FetchError, UploadError
from client.core._source import PayloadSource
from client.http._direct import DirectUploader, StoreUnreachable
from client.http._range import RangeReader
from client.http._scram import BearerAuth, ScramAuth
from client.http._store_origin import read_gateway_record
from client.http._transport import HttpTransport
from client.http._upload import TusUploader
from client.protocol import MessageId
from gateway.storage import S3Store

from _auth import AUTH_SECRET, credential_files
from _frozen import Trickler, ends_within, frozen
from _gateway import GatewayProcess
from _relay import Relay
from _servers import Mosquitto, SeaweedFS

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
#: Seconds of `http_timeout` in these tests: each call must end within it (and some slack).
TIMEOUT = 2.0
USER, PASSWORD = "alice", "alice-secret"
ACL = "user alice\ntopic readwrite frozen/#\n"
#: More than loopback's socket buffers take from a peer that reads nothing: writes block.
BIG = 8 * MiB
OFFLOAD = shutil.which("offload") or "offload"


@pytest.fixture(scope="module")
def files() -> Iterator[Path]:
    with credential_files("offload-frozen-", {USER: PASSWORD}, ACL) as path:
        yield path


@pytest.fixture(scope="module")
def store_relay(seaweed: SeaweedFS) -> Iterator[Relay]:
    """The store as the gateway advertises it to clients (direct transfers): a relay that a
    test can freeze."""
    relay = Relay(seaweed.s3_port)
    yield relay
    relay.close()


@pytest.fixture(scope="module")
def gateway(seaweed: SeaweedFS, files: Path, store_relay: Relay) -> Iterator[GatewayProcess]:
    """`offload-gateway` in a process of its own: a password file (SCRAM), direct transfers."""
    bucket = f"frozen-{os.getpid()}-{time.monotonic_ns()}"
    S3Store(
        seaweed.endpoint, bucket, access_key=seaweed.access_key, secret_key=seaweed.secret_key
    ).ensure_bucket()
    gw = GatewayProcess(
        {
            "OFFLOAD_STORAGE_URL": seaweed.storage_url(bucket),
            "OFFLOAD_S3_ACCESS_KEY": seaweed.access_key,
            "OFFLOAD_S3_SECRET_KEY": seaweed.secret_key,
            "OFFLOAD_S3_PUBLIC_URL": f"http://127.0.0.1:{store_relay.port}",
            "OFFLOAD_REDIRECT_DOWNLOADS": "false",
            "OFFLOAD_PASSWORD_FILE": str(files / "passwd"),
            "OFFLOAD_ACL_FILE": str(files / "acl"),
            "OFFLOAD_AUTH_SECRET": AUTH_SECRET,
            "OFFLOAD_SWEEP_INTERVAL": "0",
            "OFFLOAD_LOG_LEVEL": "WARNING",
        }
    ).start()
    yield gw
    gw.kill()


def _pid(gw: GatewayProcess) -> int:
    assert gw.proc is not None
    return gw.proc.pid


def scram() -> ScramAuth:
    return ScramAuth(USER, PASSWORD)


@pytest.fixture
def http() -> Iterator[HttpTransport]:
    with HttpTransport(timeout=TIMEOUT) as transport:
        yield transport


def _upload(http: HttpTransport, gw: GatewayProcess, auth: httpx.Auth | None, **kw: object):
    def call() -> object:
        with PayloadSource(b"\x00" * kw.pop("size", BIG)) as source:  # type: ignore[arg-type]
            return http.upload(
                gw.url, "frozen/up", source, message_id=MessageId.new(), auth=auth, **kw
            )  # type: ignore[arg-type]

    return call


def _refused_in_time(call: Callable[[], object], kind: type[Exception]) -> Exception:
    ended = ends_within(call, TIMEOUT)
    assert isinstance(ended.error, kind), ended
    return ended.error


# -- uploads ----------------------------------------------------------------------------------


def test_a_scram_upload_with_a_body_ends_within_the_timeout(
    gateway: GatewayProcess, http: HttpTransport
) -> None:
    """The issue's case: `PUT /msg/<id>` with a SCRAM login (its probe waited for ever)."""
    with frozen(_pid(gateway)):
        error = _refused_in_time(_upload(http, gateway, scram()), UploadError)
    assert "Timeout" in str(error)


def test_a_bearer_upload_whose_writes_block_ends_within_the_timeout(
    gateway: GatewayProcess, http: HttpTransport
) -> None:
    """A bearer login sends the body at once: the writes block on full buffers."""
    with frozen(_pid(gateway)):
        error = _refused_in_time(_upload(http, gateway, BearerAuth("a.b.c")), UploadError)
    assert "WriteTimeout" in str(error) or "ReadTimeout" in str(error)


def test_a_bson_upload_ends_within_the_timeout(
    gateway: GatewayProcess, http: HttpTransport
) -> None:
    """Headers too large for HTTP fields: the hop BSON document (`POST .../+oversized`)."""
    headers = [(f"h{i}", b"x" * 200) for i in range(60)]  # over the 8 KiB header budget
    with frozen(_pid(gateway)):
        _refused_in_time(_upload(http, gateway, scram(), headers=headers), UploadError)


def test_the_options_probe_of_a_large_upload_ends_within_the_timeout(
    gateway: GatewayProcess, http: HttpTransport
) -> None:
    """Above 16 MiB the raw route is asked first (`OPTIONS`): its timeout is the upload's
    answer, not a reason to send the body after it (two timeouts)."""
    with frozen(_pid(gateway)):
        error = _refused_in_time(_upload(http, gateway, scram(), size=17 * MiB), UploadError)
    assert "OPTIONS" in str(error) or "Timeout" in str(error)


@pytest.mark.parametrize("mode", ["reads", "answers"])
def test_an_upload_to_a_peer_that_trickles_ends_within_the_timeout(
    http: HttpTransport, mode: str
) -> None:
    """A peer that takes the body, or answers, a byte every half second: no single read or
    write waits the timeout, yet the upload ends. Taking the body so slowly leaves the
    writes blocked (the kernel wakes a writer only for room, not for a byte); the answer is
    due, whole, a timeout after the body (client/http/_deadline.py), where before it was
    read byte by byte for as long as it came."""
    peer = Trickler(mode)
    try:

        def call() -> object:
            with PayloadSource(b"\x04" * BIG) as source:
                return http.upload(peer.url, "frozen/t", source, message_id=MessageId.new())

        # Its answer is due 1.5 timeouts after the body: one is the slack's.
        ended = ends_within(call, TIMEOUT * 1.5)
        assert isinstance(ended.error, UploadError), ended
        expected = "WriteTimeout" if mode == "reads" else "no whole answer"
        assert expected in str(ended.error), ended.error
    finally:
        peer.close()


def test_a_publish_does_not_retry_an_upload_that_timed_out(
    gateway: GatewayProcess, mosquitto_factory: Callable[..., Mosquitto]
) -> None:
    """`Client.publish` retries an upload that failed on the way (the same id again is
    safe), but not one the gateway did not answer in time: that would cost the timeout
    twice (it did: 2 x http_timeout and more)."""
    from client import Client

    broker = mosquitto_factory(max_packet_size=65536)
    with (
        Client(
            broker.url,
            username=USER,
            password=PASSWORD,
            endpoint=gateway.url,
            http_timeout=TIMEOUT,
            chunking=False,
        ) as client,
        frozen(_pid(gateway)),
    ):
        error = _refused_in_time(
            lambda: client.publish("frozen/pub", b"\x05" * MiB, qos=1), UploadError
        )
    assert "Timeout" in str(error)


# -- direct transfers -------------------------------------------------------------------------


def _direct(gw: GatewayProcess, relay: Relay, client: httpx.Client) -> Callable[[], object]:
    def call() -> object:
        with PayloadSource(b"\x01" * (6 * MiB)) as source:  # two parts
            return DirectUploader(client).upload(
                gw.url,
                f"http://127.0.0.1:{relay.port}",
                "frozen/direct",
                source,
                message_id=MessageId.new(),
                auth=scram(),
            )

    return call


def test_a_direct_grant_ends_within_the_timeout(
    gateway: GatewayProcess, store_relay: Relay, http: HttpTransport
) -> None:
    with frozen(_pid(gateway)):
        _refused_in_time(_direct(gateway, store_relay, http.client), UploadError)


def test_direct_part_uploads_to_a_frozen_store_end_within_the_timeout(
    gateway: GatewayProcess, store_relay: Relay, http: HttpTransport
) -> None:
    store_relay.freeze()
    try:
        _refused_in_time(_direct(gateway, store_relay, http.client), StoreUnreachable)
    finally:
        store_relay.thaw()


def test_a_direct_commit_ends_within_the_timeout(
    gateway: GatewayProcess, store_relay: Relay
) -> None:
    """The gateway freezes once the parts are in the store, as the commit goes out: the
    commit's timeout is the answer (no abandon is sent to a gateway that did not answer)."""
    stopped: list[int] = []

    def freeze_at_commit(request: httpx.Request) -> None:
        if request.url.path == "/direct/commit" and not stopped:
            os.kill(_pid(gateway), 19)  # SIGSTOP
            stopped.append(1)

    client = httpx.Client(timeout=TIMEOUT, event_hooks={"request": [freeze_at_commit]})
    try:
        _refused_in_time(_direct(gateway, store_relay, client), UploadError)
        assert stopped
    finally:
        os.kill(_pid(gateway), 18)  # SIGCONT
        client.close()


# -- tus (offload upload) ---------------------------------------------------------------------


def _tus(gw: GatewayProcess, tmp: Path, **kw: object) -> Callable[[], object]:
    file = tmp / "file.bin"
    if not file.exists():
        file.write_bytes(b"\x02" * BIG)

    def call() -> object:
        with httpx.Client(timeout=TIMEOUT, auth=scram()) as client:
            uploader = TusUploader(client, gw.url, state_dir=tmp / "state")
            return uploader.upload(file, "frozen/tus", **kw)  # type: ignore[arg-type]

    return call


def test_a_tus_creation_ends_within_the_timeout(gateway: GatewayProcess, tmp_path: Path) -> None:
    with frozen(_pid(gateway)):
        _refused_in_time(_tus(gateway, tmp_path), UploadError)


def test_a_tus_segment_ends_within_the_timeout(gateway: GatewayProcess, tmp_path: Path) -> None:
    """Frozen once the upload is created, as its first PATCH (a body, SCRAM) goes out."""

    def freeze(offset: int) -> None:
        os.kill(_pid(gateway), 19)  # SIGSTOP

    try:
        _refused_in_time(_tus(gateway, tmp_path, on_start=freeze), UploadError)
    finally:
        os.kill(_pid(gateway), 18)  # SIGCONT


def test_a_tus_offset_query_ends_within_the_timeout(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    """A resumed upload asks the gateway its offset first (`HEAD`)."""

    class Interrupted(Exception):
        pass

    def interrupt(offset: int) -> None:
        raise Interrupted

    with pytest.raises(Interrupted):  # created and remembered, nothing sent
        _tus(gateway, tmp_path, on_start=interrupt)()
    with frozen(_pid(gateway)):
        _refused_in_time(_tus(gateway, tmp_path, resume=True), UploadError)


# -- fetches ----------------------------------------------------------------------------------


def _payload_url(gw: GatewayProcess) -> str:
    return f"{gw.url}/msg/{MessageId.new()}/payload"


def test_a_fetch_ends_within_the_timeout(gateway: GatewayProcess, http: HttpTransport) -> None:
    url = _payload_url(gateway)
    with frozen(_pid(gateway)):
        _refused_in_time(
            lambda: http.fetch(url, expected_sha256="0" * 64, expected_size=10, auth=scram()),
            FetchError,
        )


def test_a_fetch_to_a_file_ends_within_the_timeout(
    gateway: GatewayProcess, http: HttpTransport, tmp_path: Path
) -> None:
    url = _payload_url(gateway)
    with frozen(_pid(gateway)), (tmp_path / "out").open("wb") as out:
        _refused_in_time(lambda: http.fetch_to(url, out, auth=scram()), FetchError)


def test_a_range_fetch_ends_within_the_timeout(
    gateway: GatewayProcess, http: HttpTransport
) -> None:
    reader = RangeReader(http.reader, _payload_url(gateway), 1000, auth=scram(), redirect_ok=None)
    with frozen(_pid(gateway)):
        _refused_in_time(lambda: reader.get(100, 200), FetchError)


def test_the_gateways_record_ends_within_the_timeout(
    gateway: GatewayProcess, http: HttpTransport
) -> None:
    """`GET /`, read when a payload redirect names a store not yet known."""
    with frozen(_pid(gateway)):
        _refused_in_time(lambda: read_gateway_record(http.reader, gateway.url), FetchError)


# -- the CLI ----------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env.update(OFFLOAD_CONFIG=os.devnull, OFFLOAD_HTTP_TIMEOUT=str(TIMEOUT))
    login = ("--username", USER, "--password", PASSWORD)
    return subprocess.run(
        [OFFLOAD, *args, *login], capture_output=True, text=True, timeout=60, env=env
    )


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 5, (done.returncode, done.stderr)
    return lines[0]


def test_the_cli_says_in_one_line_when_a_frozen_gateway_times_out(
    gateway: GatewayProcess, mosquitto_factory: Callable[..., Mosquitto], tmp_path: Path
) -> None:
    """`offload publish`, `upload` and `fetch` (whole and a range), each within its
    timeout plus the CLI's start-up: one line on stderr, exit 5."""
    broker = mosquitto_factory(max_packet_size=65536)
    big = tmp_path / "big.bin"
    big.write_bytes(b"\x03" * BIG)
    url = _payload_url(gateway)
    commands = {
        "publish": ("publish", "--broker", broker.url, "--endpoint", gateway.url,
                    "-t", "frozen/cli", "-f", str(big), "-q", "1", "--no-chunking"),
        "upload": ("upload", "--endpoint", gateway.url, "-t", "frozen/cli", "-f", str(big),
                   "--state-dir", str(tmp_path / "state")),
        "fetch": ("fetch", url, "-o", str(tmp_path / "got.bin")),
        "fetch --range": ("fetch", url, "--range", "0-99", "-o", str(tmp_path / "r.bin")),
    }  # fmt: skip
    with frozen(_pid(gateway)):
        for name, args in commands.items():
            ended = ends_within(lambda args=args: _cli(*args), TIMEOUT, slack=6.0)
            line = _one_line(ended.result)
            assert "timed out" in line, (name, line)
