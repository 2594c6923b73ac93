"""A private CA and a certificate for 127.0.0.1 it signed, made with openssl as an operator
would (tests of https:// gateways and mqtts:// brokers)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def server_pki() -> Iterator[Path]:
    """A directory holding `ca.pem`, `server.pem` and `server.key` (readable by a broker
    that drops its privileges), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="offload-pki-"))
    path.chmod(0o755)  # mosquitto drops privileges before reading its key

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=path, check=True, capture_output=True)

    try:
        run(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
            "-out", "ca.pem", "-days", "2", "-subj", "/CN=mqtt-offload test CA",
        )  # fmt: skip
        run(
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
            "-out", "server.csr", "-subj", "/CN=127.0.0.1",
        )  # fmt: skip
        (path / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        run(
            "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext",
        )  # fmt: skip
        for name in ("server.key", "server.pem", "ca.pem"):
            (path / name).chmod(0o644)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
