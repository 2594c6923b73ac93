"""The stack's state directory: logins, certificate, env file and logs, kept across restarts.

A protected stack, the way a real deployment runs (docs/authentication.md): mosquitto and the
gateway read one password file and one ACL file; the gateway has its own broker account; the
stack's user `demo` has a password generated for this stack, given to the user only through
the env file (mode 0600). The gateway serves HTTPS with a certificate for 127.0.0.1 signed by
a CA made here, so curl can log in with Basic (`-u`, refused over plain HTTP) and the CLI
uses SCRAM, both checking the certificate against that CA (`OFFLOAD_CA_FILE`).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from _servers import Mosquitto, SeaweedFS

LOGS = ("gateway.log", "proxy.log", "mosquitto/mosquitto.log", "seaweedfs/weed.log")
KEPT_RUNS = 4  # earlier runs' logs kept beside each log
USER = "demo"
GATEWAY_USER = "offload-gateway"
# SCRAM-SHA-512 needs at least 4096 PBKDF2 iterations in the password file.
ITERATIONS = 4096

ACL = f"""\
# The stack's ACL, read by mosquitto and by the gateway alike (docs/authentication.md).
# The gateway's own account: the discovery record, and placeholders on any topic.
user {GATEWAY_USER}
topic readwrite #

# The stack's user. A production ACL gives each user only its topics and leaves
# sys/metadata to the gateway (docs/operations.md, "Protecting the discovery topic").
user {USER}
topic readwrite #
"""


@dataclass(frozen=True)
class Secrets:
    """What the stack generated: kept in `<state>/auth/secrets.json` (0600) across restarts."""

    password: str
    gateway_password: str
    auth_secret: str

    def __repr__(self) -> str:
        return "Secrets(***)"


def _private(path: Path, text: str) -> None:
    """Write `text` readable by its owner only, from the first byte on."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def load_or_make(auth: Path) -> Secrets:
    """This stack's secrets: those of an earlier run on the same state directory, else new."""
    auth.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = auth / "secrets.json"
    if path.exists():
        return Secrets(**json.loads(path.read_text()))
    made = Secrets(*(secrets.token_urlsafe(24) for _ in range(3)))
    _private(path, json.dumps(asdict(made)))
    return made


def write_auth_files(auth: Path, made: Secrets) -> tuple[Path, Path]:
    """The password file (`mosquitto_passwd`, as an operator makes it) and the ACL file."""
    passwd, acl = auth / "passwd", auth / "acl"
    for i, (user, password) in enumerate(
        ((GATEWAY_USER, made.gateway_password), (USER, made.password))
    ):
        create = ["-c"] if i == 0 else []
        subprocess.run(
            ["mosquitto_passwd", *create, "-b", "-H", "sha512-pbkdf2", "-I", str(ITERATIONS),
             str(passwd), user, password],
            check=True, capture_output=True,
        )  # fmt: skip
    passwd.chmod(0o600)
    _private(acl, ACL)
    return passwd, acl


def make_tls(tls: Path) -> tuple[Path, Path, Path]:
    """CA, certificate and key for the gateway on 127.0.0.1 (kept while they are valid)."""
    ca, cert, key = tls / "ca.pem", tls / "gateway.pem", tls / "gateway.key"
    tls.mkdir(mode=0o700, parents=True, exist_ok=True)
    valid = cert.exists() and subprocess.run(
        ["openssl", "x509", "-checkend", "86400", "-noout", "-in", str(cert)],
        capture_output=True,
    ).returncode == 0  # fmt: skip
    if valid and ca.exists() and key.exists():
        return ca, cert, key

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tls, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "3650", "-subj", "/CN=mqtt-offload stack CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "gateway.key", "-out",
            "gateway.csr", "-subj", "/CN=127.0.0.1")  # fmt: skip
    (tls / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "gateway.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "gateway.pem", "-days", "825",
            "-extfile", "san.ext")  # fmt: skip
    for name in ("ca.key", "gateway.key"):
        (tls / name).chmod(0o600)
    return ca, cert, key


def write_env(path: Path, settings: dict[str, str]) -> None:
    """The env file a user sources: this stack's client settings, its password among them."""
    _private(
        path,
        "# This stack's client settings (scripts/up.sh), with its generated password: mode 0600.\n"
        + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(settings.items())),
    )


@dataclass
class Files:
    """What the servers and the clients are given: logins, certificate, env for `offload`."""

    state: Path
    made: Secrets
    passwd: Path
    acl: Path
    ca: Path
    cert: Path
    key: Path

    @classmethod
    def make(cls, state: Path) -> Files:
        made = load_or_make(state / "auth")
        passwd, acl = write_auth_files(state / "auth", made)
        return cls(state, made, passwd, acl, *make_tls(state / "tls"))

    def broker_config(self) -> str:
        # Every server runs as the user who started the stack: the state directory is theirs
        # and may sit in a home directory mosquitto's own user cannot enter.
        user = "user root\n" if os.geteuid() == 0 else ""
        return (
            f"allow_anonymous false\npassword_file {self.passwd}\nacl_file {self.acl}\n"
            f"persistence true\npersistence_location {self.state / 'mosquitto'}/\n{user}"
        )

    def client_env(self, broker: Mosquitto, gw_url: str, s3: SeaweedFS) -> dict[str, str]:
        """The env file's settings: what `offload`, curl and Spark need for this stack."""
        return {
            "OFFLOAD_BROKER": broker.url,
            "OFFLOAD_USERNAME": USER,
            "OFFLOAD_PASSWORD": self.made.password,
            "OFFLOAD_CA_FILE": str(self.ca),
            "OFFLOAD_PUBLIC_URL": gw_url,
            "OFFLOAD_STORAGE_URL": s3.storage_url("offload"),
            "OFFLOAD_S3_ACCESS_KEY": s3.access_key,
            "OFFLOAD_S3_SECRET_KEY": s3.secret_key,
            "STACK_DIR": str(self.state),
        }


def rotate_logs(state: Path) -> None:
    """Keep the earlier runs' logs: `x.log` -> `x.log.1` -> ... -> `x.log.<KEPT_RUNS>`."""
    for name in LOGS:
        rotate_log(state / name)
    # weed's own glog files: a new set (INFO, WARNING, ERROR) per start, named by time.
    glogs = sorted((state / "seaweedfs").glob("weed.*.log.*.*"), key=lambda p: p.stat().st_mtime)
    for old in glogs[: -3 * KEPT_RUNS]:
        old.unlink()


def rotate_log(log: Path) -> None:
    """Keep `log` as `log.1`, the earlier ones one place on, at most KEPT_RUNS of them (a
    new run, or a part of the stack started again after it died)."""
    if not log.exists():
        return
    for n in range(KEPT_RUNS - 1, 0, -1):
        older = log.with_name(f"{log.name}.{n}")
        if older.exists():
            older.replace(log.with_name(f"{log.name}.{n + 1}"))
    log.replace(log.with_name(f"{log.name}.1"))
