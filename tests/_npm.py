"""Node peers for the tests (tus-js-client, mqtt.js, aedes): `npm ci` from a committed lock.

Installed on first use into a cache directory keyed by the lock's digest (a changed lock is a
new directory), built beside it and renamed into place, so a half-done install is never used;
one process at a time installs (a file lock), so none removes a tree another one uses.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path


def npm_modules(peers: Path, prefix: str, package: str) -> Path:
    """`node_modules` of `peers`' package.json and package-lock.json, installed once.

    Args:
        peers: the directory holding package.json and package-lock.json.
        prefix: the cache directory's name before the lock's digest.
        package: a package the install holds (its presence says the cache is complete).

    Raises:
        RuntimeError: node or npm missing, or `npm ci` failed (its stderr's tail).
    """
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise RuntimeError("node and npm are needed (scripts/_bootstrap.sh installs them)")
    manifest = (peers / "package.json").read_bytes() + (peers / "package-lock.json").read_bytes()
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(manifest).hexdigest()[:16]
    cache = cache_home / "mqtt-offload-tests" / f"{prefix}-{digest}"
    modules = cache / "node_modules"
    cache.parent.mkdir(parents=True, exist_ok=True)
    # Two xdist workers or two runs of the suite: the second waits, then finds it installed.
    with cache.with_name(f"{cache.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (modules / package / "package.json").is_file():
            work = cache.with_name(f"{cache.name}.tmp{os.getpid()}")
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            for name in ("package.json", "package-lock.json"):
                shutil.copy(peers / name, work / name)
            done = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
                cwd=work, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"npm ci failed: {done.stderr[-2000:]}")
            shutil.rmtree(cache, ignore_errors=True)
            work.rename(cache)
    return modules
