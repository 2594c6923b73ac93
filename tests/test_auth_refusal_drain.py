"""A refusal sent before the body is read reaches the peer intact (gateway/middleware/_drain.py).

The gateway answers a wrong password before it reads the upload. When the connection then
closes - the client or a proxy asked for ``Connection: close``, which nginx does towards an
upstream unless upstream keep-alive is configured - the body bytes still arriving used to
be answered with a TCP reset that destroyed the 401 on its way: behind nginx terminating TLS
with the chart's Ingress settings (request buffering off) hop-client saw nginx's 502 as
"Missing sid in SCRAM server final" instead of "invalid-proof".
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import bson
import pytest
import requests
import requests.adapters
from hop.auth import Auth
from hop.http_scram import SCRAMAuth
from scramp import ScramClient, ScramException

from _auth import broker_readable_dir, write_acl_file, write_password_file
from _gateway import GatewayServer
from _servers import free_port, wait_for_port

pytestmark = pytest.mark.servers

MiB = 1024 * 1024
USERS = {"writer": "w-secret-1", "other": "o-secret-2"}
ACL = "pattern readwrite data/#\n"
PATH = "/topic/data/x+oversized"


@pytest.fixture
def files() -> Iterator[Path]:
    path = broker_readable_dir("offload-drain-")
    write_password_file(path / "passwd", [(u, p, 4096) for u, p in USERS.items()])
    write_acl_file(path / "acl", ACL)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def gateway(files: Path, gateway_factory: Callable[..., GatewayServer]) -> GatewayServer:
    # tls=True: the gateway is told TLS ends at a proxy in front of it (the chart's setting).
    return gateway_factory(
        None,
        password_file=files / "passwd",
        acl_file=files / "acl",
        auth_secret="a-shared-secret-for-all-replicas",
        tls=True,
    )


def upload(size: int) -> bytes:
    msg_id = uuid.uuid4()
    payload = os.urandom(size)
    return bson.encode({"message": payload, "headers": [["_id", bson.Binary(msg_id.bytes)]]})


def wrong_scram_final(url: str) -> str:
    """A well-formed SCRAM final with a wrong password, from a real exchange."""
    client = ScramClient(["SCRAM-SHA-512"], "writer", "wrong")
    first = base64.b64encode(client.get_client_first().encode()).decode()
    r = requests.post(url, headers={"Authorization": f"SCRAM-SHA-512 data={first}"}, timeout=30)
    assert r.status_code == 401
    params = requests.utils.parse_dict_header(
        r.headers["www-authenticate"].removeprefix("SCRAM-SHA-512 ")
    )
    client.set_server_first(base64.b64decode(params["data"]).decode())
    final = base64.b64encode(client.get_client_final().encode()).decode()
    return f"SCRAM-SHA-512 sid={params['sid']},data={final}"


def post_and_close(port: int, authorization: str | None, body: bytes) -> tuple[str, bytes]:
    """POST with `Connection: close` over a raw socket, the whole body before reading, as
    nginx and urllib3 do: how sending ended ("sent" or the error) and all read until EOF."""
    head = [
        f"POST {PATH} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Connection: close",
        "Content-Type: application/bson",
        f"Content-Length: {len(body)}",
    ]
    if authorization is not None:
        head.append(f"Authorization: {authorization}")
    raw = ("\r\n".join(head) + "\r\n\r\n").encode() + body
    received = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sending = "sent"
        try:
            sock.sendall(raw)
        except OSError as exc:  # nginx gives up on the upstream here: 502
            sending = repr(exc)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
    return sending, bytes(received)


def test_a_refused_large_upload_gets_its_401_intact(gateway: GatewayServer) -> None:
    url = gateway.url + PATH
    for attempt in range(6):
        header = None if attempt % 2 else wrong_scram_final(url)
        # More than loopback's socket buffers hold, less than the drain limit (16 MiB).
        sending, answer = post_and_close(gateway.port, header, upload(12 * MiB))
        assert sending == "sent", (attempt, sending)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 401 "), (attempt, answer[:300])
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        assert len(body) == length and b"detail" in body, answer[:300]
        if header is not None:  # the server-error hop-client needs to say "invalid-proof"
            assert b"authentication-info:" in head.lower()


NGINX_CONF = """\
worker_processes 1;
daemon off;
error_log {root}/error.log info;
pid {root}/nginx.pid;
events {{ worker_connections 64; }}
http {{
  access_log {root}/access.log;
  client_body_temp_path {root}/body;
  proxy_temp_path {root}/proxy;
  fastcgi_temp_path {root}/fcgi;
  uwsgi_temp_path {root}/uwsgi;
  scgi_temp_path {root}/scgi;
  upstream gateway {{
    server 127.0.0.1:{upstream};
    {keepalive}
  }}
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {root}/cert.pem;
    ssl_certificate_key {root}/key.pem;
    # The chart's ingress-nginx annotations (templates/ingress.yaml), as nginx directives:
    # proxy-body-size, proxy-request-buffering off, proxy-buffering off, the timeouts.
    client_max_body_size {max_body};
    location / {{
      proxy_pass http://gateway;
      proxy_http_version 1.1;
      proxy_set_header Connection "{connection}";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $remote_addr;
      proxy_set_header X-Forwarded-Proto https;
      proxy_request_buffering off;
      proxy_buffering off;
      proxy_read_timeout 3600;
      proxy_send_timeout 3600;
    }}
  }}
}}
"""


class Nginx:
    """nginx terminating TLS on loopback in front of `upstream`."""

    def __init__(self, root: Path, upstream: int, *, keepalive: bool) -> None:
        self.root = root
        self.port = free_port()
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-keyout", str(root / "key.pem"), "-out", str(root / "cert.pem"),
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip
        (root / "nginx.conf").write_text(
            NGINX_CONF.format(
                root=root,
                upstream=upstream,
                port=self.port,
                max_body=5 * 1024**3,
                # ingress-nginx keeps upstream connections alive by default; plain nginx
                # (and ingress-nginx with upstream keep-alive off) closes them.
                keepalive="keepalive 8;" if keepalive else "",
                connection="" if keepalive else "close",
            )
        )
        self.proc = subprocess.Popen(
            # -e and -p: nothing under /var (the tests need not run as root).
            [
                "nginx",
                "-e",
                str(root / "error.log"),
                "-p",
                str(root),
                "-c",
                str(root / "nginx.conf"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, 20)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


@pytest.mark.skipif(
    shutil.which("nginx") is None or shutil.which("openssl") is None,
    reason="nginx or openssl is not installed (scripts/_bootstrap.sh installs both)",
)
@pytest.mark.parametrize("keepalive", [False, True], ids=["upstream-close", "upstream-keepalive"])
def test_wrong_password_behind_nginx_is_invalid_proof(
    gateway: GatewayServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    keepalive: bool,
) -> None:
    nginx = Nginx(tmp_path / "nginx", gateway.port, keepalive=keepalive)
    try:
        # hop-client re-sends its SCRAM requests without the caller's `verify=`, so the test
        # CA is also made requests' default trust store for this process.
        monkeypatch.setattr(
            requests.adapters, "DEFAULT_CA_BUNDLE_PATH", str(nginx.root / "cert.pem")
        )
        auth = SCRAMAuth(Auth("other", USERS["other"], method="SCRAM-SHA-512"), shortcut=True)
        ca = str(nginx.root / "cert.pem")
        ok = requests.post(nginx.url + PATH, data=upload(2 * MiB), auth=auth, timeout=60, verify=ca)
        assert ok.status_code == 201, ok.text
        for _ in range(5):
            auth = SCRAMAuth(Auth("writer", "wrong", method="SCRAM-SHA-512"), shortcut=True)
            with pytest.raises(ScramException, match="invalid-proof"):
                requests.post(
                    nginx.url + PATH, data=upload(2 * MiB), auth=auth, timeout=60, verify=ca
                )
    finally:
        nginx.stop()
    access = (nginx.root / "access.log").read_text()
    assert " 502 " not in access, access
