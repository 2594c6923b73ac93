"""What a large dynamic security file's reload costs the gateway's other requests (issue 51).

mosquitto rewrites its dynamic security file at every `mosquitto_ctrl` change; the gateway
re-reads it when a request notices. Measured: `offload-gateway` (its own process, a file
store) on a generated file of `--clients` clients (the plugin's format, 101 iterations),
while a prober asks `/healthz` back to back. First `--rest` seconds at rest, then
`--changes` changes (an ACL added to the role, the file renamed over as the plugin does),
each followed by Basic-authenticated uploads to the topic it grants until one is let in (the
first notices the change; 403 until it is in force). Printed per gateway: the longest and the 99th
percentile `/healthz` answer at rest and during the changes, and how long each change took
to be in force; `--against TREE` measures that tree's gateway in the same run (before issue
51 the parse ran inside the noticing request, on the event loop).

    python bench/auth_reload.py                          # 100,000 clients, 5 changes
    python bench/auth_reload.py --against /work/main     # and main's gateway, same run

Prints human-readable lines and, last, one machine-readable `RESULT` JSON line.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from _harness import ROOT, emit, free_port, info_row, wait_for_port

PASSWORD = "pw-bench"


def _client(user: str, password: str, salt: bytes) -> dict[str, Any]:
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, 101)
    return {
        "username": user,
        "textname": "",
        "password": base64.b64encode(digest).decode(),
        "salt": base64.b64encode(salt).decode(),
        "iterations": 101,
        "roles": [{"rolename": "writer", "priority": -1}],
        "groups": [],
    }


def _document(clients: int) -> dict[str, Any]:
    fleet = _client("fleet", "never used", os.urandom(12))
    entries = [{**fleet, "username": f"fleet-{n}"} for n in range(clients)]
    entries.append(_client("bench", PASSWORD, os.urandom(12)))
    acl = {"acltype": "publishClientSend", "topic": "bench/#", "priority": 0, "allow": True}
    return {
        "defaultACLAccess": {"publishClientSend": False, "subscribe": False},
        "clients": entries,
        "groups": [],
        "roles": [{"rolename": "writer", "acls": [acl]}],
    }


def _write(path: Path, doc: dict[str, Any]) -> None:
    fresh = path.with_suffix(".new")
    fresh.write_text(json.dumps(doc, indent=4))  # as the plugin writes it
    fresh.replace(path)


@contextmanager
def _gateway(tree: Path, dynsec: Path, store: Path) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_")}
    env.update(
        PYTHONPATH=str(tree),
        OFFLOAD_STORAGE_URL=f"file://{store}",
        OFFLOAD_DYNSEC_FILE=str(dynsec),
        OFFLOAD_TLS="true",  # as behind a TLS proxy: Basic is taken
        OFFLOAD_AUTH_SECRET="a-bench-secret-of-32-bytes-----",
        OFFLOAD_SWEEP_INTERVAL="0",
        OFFLOAD_LOG_LEVEL="WARNING",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "--port", str(port)],
        env=env, cwd=tree, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_port(port, 120, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


class Prober:
    """Asks `/healthz` back to back on a thread; each answer's wait, by phase."""

    def __init__(self, url: str) -> None:
        self.waits: dict[str, list[float]] = {"rest": [], "changes": []}
        self.phase = "rest"
        self._stop = threading.Event()
        self._http = httpx.Client(base_url=url, timeout=120)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            self._http.get("/healthz").raise_for_status()
            self.waits[self.phase].append(time.perf_counter() - started)
            time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(150)
        self._http.close()


def _upload(http: httpx.Client, topic: str) -> int:
    auth = httpx.BasicAuth("bench", PASSWORD)
    params = {"topic": topic}
    return http.put(f"/msg/{uuid.uuid4()}", params=params, content=b"x", auth=auth).status_code


def measure(tree: Path, clients: int, changes: int, rest: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-reload-") as tmp:
        dynsec = Path(tmp) / "dynamic-security.json"
        doc = _document(clients)
        _write(dynsec, doc)
        size = dynsec.stat().st_size
        with _gateway(tree, dynsec, Path(tmp) / "store") as url:
            http = httpx.Client(base_url=url, timeout=120)
            assert _upload(http, "bench/a") == 201
            prober = Prober(url)
            time.sleep(rest)
            prober.phase = "changes"
            in_force: list[float] = []
            for n in range(changes):
                # mosquitto_ctrl dynsec addRoleACL writer publishClientSend more/<n> allow
                grant = {"acltype": "publishClientSend", "topic": f"more/{n}", "allow": True}
                doc["roles"][0]["acls"].append(grant)
                _write(dynsec, doc)
                started = time.perf_counter()
                # The first upload notices the change; 403 (not a failed login) until then.
                while _upload(http, f"more/{n}") != 201:
                    time.sleep(0.02)
                in_force.append(time.perf_counter() - started)
                time.sleep(1.0)
            prober.stop()
            http.close()
    result = {"size_mb": size / 1e6, "in_force_s": statistics.median(in_force)}
    for phase, waits in prober.waits.items():
        ordered = sorted(waits)
        result[f"{phase}_max_ms"] = ordered[-1] * 1000
        result[f"{phase}_p99_ms"] = ordered[int(len(ordered) * 0.99)] * 1000
        result[f"{phase}_n"] = len(ordered)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100_000)
    parser.add_argument("--changes", type=int, default=5)
    parser.add_argument("--rest", type=float, default=5.0, help="seconds probed at rest")
    parser.add_argument("--against", type=Path, help="another tree's gateway, measured too")
    args = parser.parse_args()
    trees = [("this tree", ROOT)]
    if args.against is not None:
        trees.append((args.against.name, args.against.resolve()))
    found = {}
    for name, tree in trees:
        got = measure(tree, args.clients, args.changes, args.rest)
        found[name] = got
        print(
            f"{name}: {args.clients:,} clients ({got['size_mb']:.1f} MB); /healthz at rest "
            f"max {got['rest_max_ms']:.0f} ms, p99 {got['rest_p99_ms']:.0f} ms "
            f"({got['rest_n']:.0f} asked); during {args.changes} changes max "
            f"{got['changes_max_ms']:.0f} ms, p99 {got['changes_p99_ms']:.0f} ms "
            f"({got['changes_n']:.0f} asked); a change in force after "
            f"{got['in_force_s']:.2f} s (median)",
            flush=True,
        )
    this = found["this tree"]
    rows = [
        info_row("auth reload", "/healthz longest wait, at rest -> during changes",
                 this["rest_max_ms"], this["changes_max_ms"], "ms"),
    ]  # fmt: skip
    if args.against is not None:
        other = found[args.against.name]
        rows.append(
            info_row("auth reload", f"/healthz longest wait during changes, "
                     f"{args.against.name} -> this tree", other["changes_max_ms"],
                     this["changes_max_ms"], "ms")
        )  # fmt: skip
    emit(rows)


if __name__ == "__main__":
    main()
