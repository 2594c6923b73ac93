"""`STACK_AUTH=dynsec`: the stack on mosquitto's dynamic security plugin instead of its files.

The plugin's file is written once, in the plugin's own format, with the stack's two users
(the same generated passwords as the files mode, hashed with 4096 PBKDF2 iterations so that
SCRAM works) and one role granting everything; `demo` may also administer it with
`mosquitto_ctrl -u demo -P "$OFFLOAD_PASSWORD" -p <mqtt port> dynsec ...`. From then on the
plugin owns the file (it rewrites it at every change, kept across restarts), and the gateway
follows it without a restart (docs/authentication.md).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from _stack_state import GATEWAY_USER, ITERATIONS, USER, Files

PLUGIN_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib")
NAME = "mosquitto_dynamic_security.so"


def enabled() -> bool:
    """Whether the stack runs on the plugin (STACK_AUTH=dynsec; the default is `files`)."""
    mode = os.environ.get("STACK_AUTH", "files")
    if mode not in ("files", "dynsec"):
        raise SystemExit(f"stack: STACK_AUTH must be files or dynsec, not {mode!r}")
    return mode == "dynsec"


def _plugin() -> Path:
    for folder in PLUGIN_DIRS:
        if (Path(folder) / NAME).exists():
            return Path(folder) / NAME
    raise SystemExit(f"stack: STACK_AUTH=dynsec needs {NAME} (Debian's mosquitto package)")


def _client(user: str, password: str, roles: list[str]) -> dict[str, object]:
    salt = os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, ITERATIONS)
    return {
        "username": user,
        "password": base64.b64encode(digest).decode(),
        "salt": base64.b64encode(salt).decode(),
        "iterations": ITERATIONS,
        "roles": [{"rolename": role} for role in roles],
    }


def dynsec_file(files: Files) -> Path:
    """The plugin's file, written if it does not exist yet (the plugin owns it after)."""
    path = files.state / "auth" / "dynamic-security.json"
    if path.exists():
        return path
    everything = [
        {"acltype": kind, "topic": "#", "allow": True}
        for kind in ("publishClientSend", "publishClientReceive", "subscribePattern")
    ]
    admin = [
        {"acltype": kind, "topic": "$CONTROL/dynamic-security/#", "allow": True}
        for kind in ("publishClientSend", "publishClientReceive", "subscribePattern")
    ]
    doc = {
        "defaultACLAccess": {
            "publishClientSend": False,
            "publishClientReceive": True,
            "subscribe": False,
            "unsubscribe": True,
        },
        "clients": [
            _client(GATEWAY_USER, files.made.gateway_password, ["everything"]),
            _client(USER, files.made.password, ["everything", "dynsec-admin"]),
        ],
        "groups": [],
        "roles": [
            {"rolename": "everything", "acls": everything},
            {"rolename": "dynsec-admin", "acls": admin},
        ],
    }
    fresh = path.with_suffix(".new")
    fresh.write_text(json.dumps(doc, indent=2))
    fresh.chmod(0o600)  # password hashes, as the password file
    fresh.replace(path)
    return path


def broker_config(files: Files) -> str:
    """The files mode's broker settings with the plugin in place of the two files."""
    lines = files.broker_config().splitlines()
    kept = [line for line in lines if not line.startswith(("password_file", "acl_file"))]
    plugin = [f"plugin {_plugin()}", f"plugin_opt_config_file {dynsec_file(files)}"]
    return "\n".join([*kept, *plugin]) + "\n"


def gateway_env(files: Files) -> dict[str, str]:
    """The gateway's settings that name the identity source."""
    return {"OFFLOAD_DYNSEC_FILE": str(dynsec_file(files))}
