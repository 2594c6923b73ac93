"""Broker and gateway sharing one password file and one ACL file, as operators run them."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

AUTH_SECRET = "a-shared-secret-for-all-replicas"


def broker_readable_dir(prefix: str) -> Path:
    """A temporary directory mosquitto can read after dropping root privileges."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


def write_password_file(path: Path, entries: Iterable[tuple[str, str, int]]) -> None:
    """`mosquitto_passwd -H sha512-pbkdf2 -I <iterations>` for each (user, password, iterations)."""
    for i, (user, password, iterations) in enumerate(entries):
        args = ["mosquitto_passwd", "-b", "-H", "sha512-pbkdf2", "-I", str(iterations)]
        if i == 0:
            args.insert(1, "-c")
        subprocess.run([*args, str(path), user, password], check=True, capture_output=True)
    path.chmod(0o644)


def write_acl_file(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o644)


def secured_pair(
    files: Path,
    mosquitto_factory: Callable[..., Any],
    gateway_factory: Callable[..., Any],
    *,
    gateway_password: str,
    max_packet_size: int = 262144,
    **gateway: Any,
) -> tuple[Any, Any]:
    """A mosquitto (256 KiB by default) and a gateway (`gateway` settings on top), both
    reading `files/passwd` and `files/acl`."""
    broker = mosquitto_factory(
        max_packet_size=max_packet_size,
        extra_config=f"allow_anonymous false\npassword_file {files / 'passwd'}\n"
        f"acl_file {files / 'acl'}\n",
    )
    gw = gateway_factory(
        broker,
        mqtt_username="gateway",
        mqtt_password=gateway_password,
        password_file=files / "passwd",
        acl_file=files / "acl",
        auth_secret=AUTH_SECRET,
        **gateway,
    )
    return broker, gw


@contextlib.contextmanager
def credential_files(prefix: str, users: dict[str, str], acl: str) -> Iterator[Path]:
    """A directory the broker can read with `passwd` (each user, 4096 PBKDF2 rounds) and
    `acl`; removed afterwards."""
    path = broker_readable_dir(prefix)
    try:
        write_password_file(path / "passwd", [(u, p, 4096) for u, p in users.items()])
        write_acl_file(path / "acl", acl)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
