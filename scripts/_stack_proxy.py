"""The stack's `offload-proxy` (docs/proxy.md): where unmodified MQTT clients connect.

Started after the gateway, in front of the same broker and gateway; its self-check sends
20 MiB from a plain `mosquitto_pub -s` to a plain `mosquitto_sub`, both through it, across
the 256 KiB broker, logged in as the stack's user (the proxy hands the login to the gateway).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

from _servers import Mosquitto, free_port, port_answers, wait_until

#: In-flight transfers get this long when the stack stops (OFFLOAD_PROXY_SHUTDOWN_TIMEOUT).
PROXY_SHUTDOWN = 5


def start_proxy(
    state: Path, broker: Mosquitto, gw_url: str, ca: Path, wanted: int
) -> tuple[subprocess.Popen[bytes], int]:
    """`offload-proxy` on `wanted` (0: a free port) for `broker` and the gateway at `gw_url`."""
    port = wanted or free_port()
    log = state / "proxy.log"
    env = {
        "OFFLOAD_PROXY_SHUTDOWN_TIMEOUT": str(PROXY_SHUTDOWN),
        **os.environ,
        "OFFLOAD_PROXY_CA_FILE": str(ca),  # the gateway's certificate is the stack CA's
    }
    proc = subprocess.Popen(
        ["offload-proxy", "--broker", broker.url, "--host", "127.0.0.1", "--port", str(port),
         "--endpoint", gw_url],
        env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    # Its own "listening" line, not just an answer on the port: another program holding the
    # port answers too, and then the proxy exits (PortInUse, one clear error).
    line = f"listening on 127.0.0.1:{port}"
    listening = lambda: line in log.read_text(errors="replace") and port_answers(port)  # noqa: E731
    try:
        wait_until(listening, f"offload-proxy on port {port}", 30, proc, log)
    except TimeoutError:  # running, not listening: not left behind
        proc.kill()
        proc.wait()
        raise
    return proc, port


def proxy_check(state: Path, port: int, user: str, password: str) -> bool:
    """20 MiB from plain mosquitto_pub to plain mosquitto_sub, both through the proxy."""
    big = state / "selfcheck-proxy-20MiB.bin"
    big.write_bytes(os.urandom(20 * 1024 * 1024))
    topic = f"selfcheck/proxy/{os.getpid()}"
    common = ["-V", "5", "-h", "127.0.0.1", "-p", str(port), "-t", topic, "-u", user,
              "-P", password]  # fmt: skip
    sub = subprocess.Popen(
        ["mosquitto_sub", *common, "-C", "1", "-W", "90", "-N"], stdout=subprocess.PIPE
    )
    time.sleep(1.0)  # the subscription in place before the publish
    with big.open("rb") as stdin:
        pub = subprocess.run(
            ["mosquitto_pub", *common, "-q", "1", "-s"], stdin=stdin, capture_output=True,
            timeout=120,
        )  # fmt: skip
    out, _ = sub.communicate(timeout=120)
    same = pub.returncode == 0 and hashlib.sha256(out).digest() == _sha256(big)
    print(
        f"    mosquitto_pub -s -> offload-proxy :{port} -> mosquitto_sub: "
        f"{len(out)} bytes, sha256 match={same}"
    )
    if pub.returncode != 0:
        print(f"      mosquitto_pub: exit {pub.returncode} {pub.stderr.decode().strip()}")
    big.unlink()
    return same


def _sha256(path: Path) -> bytes:
    return hashlib.sha256(path.read_bytes()).digest()


def stop_proxy(proxy: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM (transfers under way finish for PROXY_SHUTDOWN seconds), then SIGKILL."""
    if proxy is None or proxy.poll() is not None:
        return
    proxy.terminate()
    try:
        proxy.wait(PROXY_SHUTDOWN + 5)
    except subprocess.TimeoutExpired:
        proxy.kill()
        proxy.wait()
